//! An async client of the ggml RPC protocol: talk to llama.cpp's `rpc-server` (or
//! `ggml-rpc-server`, or any server wire compatible with them) from Rust, over tokio.
//!
//! [`Client`] is one TCP connection after a successful HELLO. It has a typed method per command
//! (devices and their memory, buffers, tensors, graphs, the server-to-server communicator) and
//! sends one request at a time, waiting for its response, as the reference client does. Every
//! protocol decision (framing, sizes, version rules, the graph-cache mirror that picks
//! GRAPH_COMPUTE or GRAPH_RECOMPUTE) is made by the sans-IO core,
//! [`proto_core::session::ClientSession`]; this crate only moves its bytes. It needs no server
//! shell.
//!
//! # Protocol versions
//!
//! * **8.x** (llama.cpp b11739 and later; commands 0-22: graph uids, SET_TENSOR_2D /
//!   GET_TENSOR_2D, COMM_INIT / COMM_ALLREDUCE / COMM_FREE).
//! * **7.x** (llama.cpp b11434; commands 0-17).
//!
//! [`Client::connect`] speaks the version it is given and fails when the server's is
//! incompatible (another major, or a higher minor: [`ClientError::version_mismatch`] says which
//! it announced); [`Client::connect_auto`] speaks 8.0.0 and reconnects speaking 7.0.0 when the
//! server turns out to be a 7.x one.
//!
//! # Example
//!
//! Probe a server, then round-trip a tensor through one of its buffers:
//!
//! ```
//! # use std::sync::Arc;
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // A server in-process: the tokio shell over the CPU backend, on a free port.
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let addr = listener.local_addr()?;
//! # let backend = Arc::new(backend_cpu::CpuBackend::new(backend_cpu::CpuConfig::default()));
//! # let config = shell_tokio::ServerConfig::new(ggml_rpc_client::ProtocolVersion::V8_0_0);
//! # let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! # let server = tokio::spawn(shell_tokio::serve(listener, backend, config, async move {
//! #     let _ = stopped.await;
//! # }));
//! use ggml_rpc_client::proto_core::ggml::types::id::F32;
//! use ggml_rpc_client::{Bytes, Client, RpcTensor};
//!
//! // `addr`: where the server listens, e.g. "192.168.1.10:50052".
//! let mut client = Client::connect_auto(addr).await?;
//! println!("protocol {}", client.server_version());
//! # assert_eq!(client.server_version(), ggml_rpc_client::ProtocolVersion::V8_0_0);
//! let devices = client.device_count().await?;
//! for device in 0..devices {
//!     let memory = client.device_memory(device).await?;
//!     let alignment = client.alignment(device).await?;
//!     println!(
//!         "device {device}: {} of {} bytes free, alignment {alignment}",
//!         memory.free, memory.total
//!     );
//! }
//!
//! // 1024 f32 values in a buffer of device 0.
//! let data: Vec<u8> = (0..1024u16).flat_map(|i| f32::from(i).to_le_bytes()).collect();
//! let data = Bytes::from(data);
//! let buffer = client
//!     .alloc_buffer(0, data.len() as u64)
//!     .await?
//!     .expect("the server has 4 KiB to spare");
//! let mut tensor = RpcTensor::contiguous(1, F32, [1024, 1, 1, 1]).expect("F32 is a type");
//! tensor.buffer = buffer.handle;
//! tensor.data = client.buffer_base(buffer.handle).await?;
//!
//! client.set_tensor(&tensor, 0, data.clone()).await?;
//! let back = client.get_tensor(&tensor, 0, data.len() as u64).await?;
//! assert_eq!(back, data);
//!
//! client.free_buffer(buffer.handle).await?;
//! client.close().await?;
//! # let _ = stop.send(());
//! # server.await??;
//! # Ok(())
//! # }
//! ```
//!
//! Commands without a response (SET_TENSOR, FREE_BUFFER, GRAPH_COMPUTE, ...) return once
//! written. The protocol has no error replies: a server that rejects a request closes the
//! connection, which shows up as [`ClientError::Closed`] on a later call; drop the client then.
//!
//! # Modules
//!
//! * [`client`]: [`Client`] and [`RemoteBuffer`].
//! * [`error`]: [`ClientError`], what every call returns when it fails.
//! * `transport` (private): the bytes on the socket: vectored writes in pieces of at most
//!   [`SEND_PIECE`](shell_common::direct::SEND_PIECE) bytes
//!   ([`shell_common::vectored`]), large responses read straight into one buffer under a raised
//!   receive low-water mark ([`shell_common::LowWater`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod error;
pub mod remote_copy;
mod transport;

pub use client::{Client, RemoteBuffer};
pub use error::ClientError;
pub use remote_copy::{copy_between_servers, copy_rows_between_servers, CopyMode, CopyPath};
pub use shell_common::TransportMode;

/// The sans-IO protocol core, for the types the client's methods take and return (requests,
/// responses, tensor records, graphs).
pub use proto_core;

pub use bytes::{Bytes, BytesMut};
pub use proto_core::backend::DeviceMemory;
pub use proto_core::session::{GraphSubmission, ServerHello};
pub use proto_core::wire::{Dialect, ProtocolVersion, RpcTensor};
