//! The byte layer: frames, the command table, the tensor record, requests and responses.
//!
//! Everything here is a pure function of bytes; state lives in [`crate::session`].

pub mod command;
pub mod extension;
pub mod request;
pub mod response;
pub mod tensor;
pub mod version;

pub use command::{Command, RequestSize};
pub use extension::{
    RemoteCopyRequest, RemoteCopyStatus, ENDPOINT_SIZE, EXTENSION_REMOTE_COPY,
    HELLO_FLAG_EXTENSIONS, KNOWN_EXTENSIONS,
};
pub use request::{
    check_request_size, AllocSizeRequest, CommInitRequest, ConnCaps, GraphComputeRequest, Request,
    SetTensorHeader, Tensor2dHeader, COMM_HOST_SIZE, CONN_CAPS_SIZE, REQUEST_HEADER_SIZE,
};
pub use response::{Response, HELLO_FLAG_TENSOR_CACHE, RESPONSE_HEADER_SIZE};
pub use tensor::{RpcTensor, MAX_DIMS, MAX_SRC, RPC_TENSOR_SIZE};
pub use version::{Dialect, ProtocolVersion};
