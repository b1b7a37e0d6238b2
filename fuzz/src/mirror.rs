//! `round_trip`: typed messages (derived [`Arbitrary`] mirrors of proto-core's [`Request`] and
//! [`Response`]) must survive encode → decode unchanged, and any frame that decodes must
//! re-encode byte for byte (GRAPH_COMPUTE up to the trailing bytes the protocol ignores).
//!
//! Input layout: `mode: u8` (low 2 bits: 0 typed request, 1 typed response, 2 raw request frame,
//! 3 raw response frame; bit 2: protocol 8 else 7; bits 3-7 pick the command a raw response
//! answers), then the mirror's bytes or the raw frame.

use arbitrary::{Arbitrary, Unstructured};
use bytes::{Bytes, BytesMut};
use proto_core::wire::{
    AllocSizeRequest, CommInitRequest, Command, Dialect, GraphComputeRequest, ProtocolVersion,
    Request, Response, RpcTensor, SetTensorHeader, Tensor2dHeader,
    REQUEST_HEADER_SIZE, RESPONSE_HEADER_SIZE,
};
use proto_core::ErrorKind;

use crate::byte;

/// Mode values.
pub mod mode {
    /// Typed request.
    pub const REQUEST: u8 = 0;
    /// Typed response.
    pub const RESPONSE: u8 = 1;
    /// Raw request frame.
    pub const RAW_REQUEST: u8 = 2;
    /// Raw response frame.
    pub const RAW_RESPONSE: u8 = 3;
    /// Protocol 8 bit.
    pub const V8: u8 = 4;
    /// Shift of the command selector of raw responses.
    pub const COMMAND_SHIFT: u8 = 3;
}

/// Every field of an `rpc_tensor`.
#[derive(Debug, Clone, Arbitrary)]
#[allow(missing_docs)]
pub struct ATensor {
    pub id: u64,
    pub type_id: u32,
    pub buffer: u64,
    pub ne: [u32; 4],
    pub nb: [u32; 4],
    pub op: u32,
    pub op_params: [i32; 16],
    pub flags: i32,
    pub src: [u64; 10],
    pub view_src: u64,
    pub view_offs: u64,
    pub data: u64,
    pub name: [u8; 64],
    pub use_count: i32,
}

impl From<ATensor> for RpcTensor {
    fn from(t: ATensor) -> RpcTensor {
        RpcTensor {
            id: t.id,
            type_id: t.type_id,
            buffer: t.buffer,
            ne: t.ne,
            nb: t.nb,
            op: t.op,
            op_params: t.op_params,
            flags: t.flags,
            src: t.src,
            view_src: t.view_src,
            view_offs: t.view_offs,
            data: t.data,
            name: t.name,
            use_count: t.use_count,
        }
    }
}

/// The fields of SET_TENSOR_2D / GET_TENSOR_2D.
#[derive(Debug, Clone, Arbitrary)]
#[allow(missing_docs)]
pub struct A2d {
    pub tensor: ATensor,
    pub offset: u64,
    pub size: u64,
    pub n_copies: u64,
    pub stride: u64,
}

impl From<A2d> for Tensor2dHeader {
    fn from(h: A2d) -> Tensor2dHeader {
        Tensor2dHeader {
            tensor: h.tensor.into(),
            offset: h.offset,
            size: h.size,
            n_copies: h.n_copies,
            stride: h.stride,
        }
    }
}

/// A mirror of [`Request`].
#[derive(Debug, Clone, Arbitrary)]
#[allow(missing_docs)]
pub enum ARequest {
    Hello { caps: [u8; 24] },
    DeviceCount,
    AllocBuffer { device: u32, size: u64 },
    GetAlignment { device: u32 },
    GetMaxSize { device: u32 },
    BufferGetBase { buffer: u64 },
    FreeBuffer { buffer: u64 },
    BufferClear { buffer: u64, value: u8 },
    SetTensor { tensor: ATensor, cache_flag: u8, offset: u64, data: Vec<u8> },
    SetTensorHash { tensor: ATensor, offset: u64, hash: u64 },
    GetTensor { tensor: ATensor, offset: u64, size: u64 },
    CopyTensor { src: ATensor, dst: ATensor },
    GraphCompute { device: u32, uid: u64, node_ids: Vec<u64>, tensors: Vec<ATensor> },
    GetDeviceMemory { device: u32 },
    InitTensor { tensor: ATensor },
    GetAllocSize { device: u32, tensor: ATensor, srcs: [ATensor; 10] },
    GraphRecompute { device: u32, uid: u64 },
    MemsetTensor { tensor: ATensor, offset: u64, size: u64, value: u8 },
    /// `consistent`: derive `size`/`n_copies` from the data so the frame is well formed.
    SetTensor2d { header: A2d, data: Vec<u8>, consistent: bool },
    GetTensor2d { header: A2d },
    CommInit { device: u32, rank: u32, world: u32, port: u32, host: [u8; 64] },
    CommAllreduce { device: u32, tensor: ATensor },
    CommFree { device: u32 },
}

impl ARequest {
    /// The proto-core request.
    pub fn into_request(self) -> Request {
        match self {
            ARequest::Hello { caps } => Request::Hello { caps },
            ARequest::DeviceCount => Request::DeviceCount,
            ARequest::AllocBuffer { device, size } => Request::AllocBuffer { device, size },
            ARequest::GetAlignment { device } => Request::GetAlignment { device },
            ARequest::GetMaxSize { device } => Request::GetMaxSize { device },
            ARequest::BufferGetBase { buffer } => Request::BufferGetBase { buffer },
            ARequest::FreeBuffer { buffer } => Request::FreeBuffer { buffer },
            ARequest::BufferClear { buffer, value } => Request::BufferClear { buffer, value },
            ARequest::SetTensor { tensor, cache_flag, offset, data } => Request::SetTensor {
                header: Box::new(SetTensorHeader { tensor: tensor.into(), cache_flag, offset }),
                data: data.into(),
            },
            ARequest::SetTensorHash { tensor, offset, hash } => {
                Request::SetTensorHash { tensor: Box::new(tensor.into()), offset, hash }
            }
            ARequest::GetTensor { tensor, offset, size } => {
                Request::GetTensor { tensor: Box::new(tensor.into()), offset, size }
            }
            ARequest::CopyTensor { src, dst } => {
                Request::CopyTensor { src: Box::new(src.into()), dst: Box::new(dst.into()) }
            }
            ARequest::GraphCompute { device, uid, node_ids, tensors } => {
                Request::GraphCompute(Box::new(GraphComputeRequest {
                    device,
                    uid,
                    node_ids,
                    tensors: tensors.into_iter().map(Into::into).collect(),
                }))
            }
            ARequest::GetDeviceMemory { device } => Request::GetDeviceMemory { device },
            ARequest::InitTensor { tensor } => Request::InitTensor { tensor: Box::new(tensor.into()) },
            ARequest::GetAllocSize { device, tensor, srcs } => {
                Request::GetAllocSize(Box::new(AllocSizeRequest {
                    device,
                    tensor: tensor.into(),
                    srcs: srcs.map(Into::into),
                }))
            }
            ARequest::GraphRecompute { device, uid } => Request::GraphRecompute { device, uid },
            ARequest::MemsetTensor { tensor, offset, size, value } => {
                Request::MemsetTensor { tensor: Box::new(tensor.into()), offset, size, value }
            }
            ARequest::SetTensor2d { header, mut data, consistent } => {
                let mut header: Tensor2dHeader = header.into();
                if consistent && !data.is_empty() {
                    header.size = 1 + header.size % data.len() as u64;
                    header.n_copies = data.len() as u64 / header.size;
                    data.truncate((header.size * header.n_copies) as usize);
                }
                Request::SetTensor2d { header: Box::new(header), data: data.into() }
            }
            ARequest::GetTensor2d { header } => Request::GetTensor2d(Box::new(header.into())),
            ARequest::CommInit { device, rank, world, port, host } => {
                Request::CommInit(Box::new(CommInitRequest { device, rank, world, port, host }))
            }
            ARequest::CommAllreduce { device, tensor } => {
                Request::CommAllreduce { device, tensor: Box::new(tensor.into()) }
            }
            ARequest::CommFree { device } => Request::CommFree { device },
        }
    }
}

/// A mirror of [`Response`].
#[derive(Debug, Clone, Arbitrary)]
#[allow(missing_docs)]
pub enum AResponse {
    Hello { major: u8, minor: u8, patch: u8, flags: u8, caps: [u8; 24] },
    DeviceCount(u32),
    AllocBuffer { remote_ptr: u64, remote_size: u64 },
    Alignment(u64),
    MaxSize(u64),
    BufferBase(u64),
    SetTensorHash(u8),
    TensorData(Vec<u8>),
    CopyTensor(u8),
    DeviceMemory { free: u64, total: u64 },
    AllocSize(u64),
    Tensor2dData(Vec<u8>),
    CommInit(u8),
}

impl AResponse {
    /// The proto-core response.
    pub fn into_response(self) -> Response {
        match self {
            AResponse::Hello { major, minor, patch, flags, caps } => {
                Response::Hello { version: ProtocolVersion { major, minor, patch }, flags, caps }
            }
            AResponse::DeviceCount(n) => Response::DeviceCount(n),
            AResponse::AllocBuffer { remote_ptr, remote_size } => {
                Response::AllocBuffer { remote_ptr, remote_size }
            }
            AResponse::Alignment(v) => Response::Alignment(v),
            AResponse::MaxSize(v) => Response::MaxSize(v),
            AResponse::BufferBase(v) => Response::BufferBase(v),
            AResponse::SetTensorHash(v) => Response::SetTensorHash(v),
            AResponse::TensorData(d) => Response::TensorData(d.into()),
            AResponse::CopyTensor(v) => Response::CopyTensor(v),
            AResponse::DeviceMemory { free, total } => Response::DeviceMemory { free, total },
            AResponse::AllocSize(v) => Response::AllocSize(v),
            AResponse::Tensor2dData(d) => Response::Tensor2dData(d.into()),
            AResponse::CommInit(v) => Response::CommInit(v),
        }
    }
}

/// The commands that have responses, in the order raw response mode picks them.
pub const RESPONSE_COMMANDS: [Command; 13] = [
    Command::Hello,
    Command::DeviceCount,
    Command::AllocBuffer,
    Command::GetAlignment,
    Command::GetMaxSize,
    Command::BufferGetBase,
    Command::SetTensorHash,
    Command::GetTensor,
    Command::CopyTensor,
    Command::GetDeviceMemory,
    Command::GetAllocSize,
    Command::GetTensor2d,
    Command::CommInit,
];

/// What `dialect` keeps of a request: protocol 7 has no graph uids.
fn normalized(request: Request, dialect: Dialect) -> Request {
    if dialect.has_graph_uid() {
        return request;
    }
    match request {
        Request::GraphCompute(mut graph) => {
            graph.uid = 0;
            Request::GraphCompute(graph)
        }
        Request::GraphRecompute { device, .. } => Request::GraphRecompute { device, uid: 0 },
        other => other,
    }
}

/// Typed request: encode, then decode; equal unless the request is one the codec refuses.
pub fn request_round_trip(request: Request, dialect: Dialect) {
    let command = request.command();
    let frame = match request.to_frame(dialect) {
        Ok(frame) => frame,
        Err(error) => {
            assert!(!command.exists_in(dialect), "{command:?} failed to encode: {error}");
            assert_eq!(error.kind(), ErrorKind::UnknownCommand);
            return;
        }
    };
    assert!(command.exists_in(dialect));
    assert_eq!(frame[0], command.id());
    let size = u64::from_le_bytes(frame[1..9].try_into().expect("9-byte header"));
    assert_eq!(size, (frame.len() - REQUEST_HEADER_SIZE) as u64, "size field");
    // encode_head + bulk data is the same frame.
    let mut head = BytesMut::new();
    request.encode_head(dialect, &mut head).expect("encodes");
    head.extend_from_slice(request.bulk_data().map_or(&[][..], |d| &d[..]));
    assert_eq!(&head[..], &frame[..]);

    let refused = match &request {
        Request::GetTensor2d(header) => header.data_len(command).is_err(),
        Request::SetTensor2d { header, data } => {
            header.data_len(command).map_or(true, |len| len != data.len() as u64)
        }
        Request::GraphCompute(graph) => {
            u32::try_from(graph.node_ids.len()).is_err() || u32::try_from(graph.tensors.len()).is_err()
        }
        _ => false,
    };
    match Request::from_frame(dialect, frame.clone()) {
        Ok(decoded) => {
            assert!(!refused, "{command:?} accepted although malformed");
            assert_eq!(decoded, normalized(request, dialect), "request round trip");
            assert_eq!(decoded.to_frame(dialect).expect("re-encodes"), frame, "re-encoding differs");
        }
        Err(error) => {
            assert!(refused, "{command:?} did not decode: {error}");
            assert_eq!(error.kind(), ErrorKind::MalformedPayload);
        }
    }
}

/// Typed response: encode, then decode with the length the request implies.
pub fn response_round_trip(response: Response) {
    let frame = response.to_frame();
    let size = u64::from_le_bytes(frame[..8].try_into().expect("8-byte header"));
    assert_eq!(size, response.payload_len());
    assert_eq!(size, (frame.len() - RESPONSE_HEADER_SIZE) as u64);
    let command = response.command();
    if let Some(fixed) = command.fixed_response_size() {
        assert_eq!(size, fixed);
    }
    let decoded = Response::decode(command, size, frame.slice(RESPONSE_HEADER_SIZE..))
        .expect("an encoded response decodes");
    assert_eq!(decoded, response, "response round trip");
}

/// Raw request frame: if it decodes, it re-encodes to the same bytes.
pub fn raw_request(frame: &[u8], dialect: Dialect) {
    let Ok(request) = Request::from_frame(dialect, Bytes::copy_from_slice(frame)) else {
        return;
    };
    let encoded = request.to_frame(dialect).expect("a decoded request re-encodes");
    if let Request::GraphCompute(_) = request {
        // The protocol ignores bytes after the tensor list: equal up to them.
        assert_eq!(encoded[0], frame[0]);
        let size = u64::from_le_bytes(encoded[1..9].try_into().expect("header"));
        let sent = u64::from_le_bytes(frame[1..9].try_into().expect("header"));
        assert!(size <= sent);
        assert_eq!(&encoded[9..], &frame[9..encoded.len()], "GRAPH_COMPUTE re-encoding differs");
        let again = Request::from_frame(dialect, encoded).expect("canonical form decodes");
        assert_eq!(again, request);
    } else {
        assert_eq!(&encoded[..], frame, "re-encoding differs");
    }
}

/// Raw response frame answering `command`: if it decodes, it re-encodes to the same bytes.
pub fn raw_response(frame: &[u8], command: Command) {
    if frame.len() < RESPONSE_HEADER_SIZE {
        return;
    }
    let size = u64::from_le_bytes(frame[..8].try_into().expect("header"));
    let payload = Bytes::copy_from_slice(&frame[8..]);
    // What the client expects: the fixed size, or the size it asked for.
    let expected = command.fixed_response_size().unwrap_or(size);
    if size != payload.len() as u64 {
        return;
    }
    let Ok(response) = Response::decode(command, expected, payload) else {
        assert_ne!(size, expected, "{command:?}: a response of the expected size was refused");
        return;
    };
    assert_eq!(response.command(), command);
    assert_eq!(&response.to_frame()[..], frame, "response re-encoding differs");
}

/// Runs one input. Panics on a broken invariant.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let selector = byte(&mut u);
    let dialect = if selector & mode::V8 != 0 { Dialect::V8 } else { Dialect::V7 };
    match selector & 3 {
        mode::REQUEST => {
            if let Ok(request) = ARequest::arbitrary_take_rest(u) {
                request_round_trip(request.into_request(), dialect);
            }
        }
        mode::RESPONSE => {
            if let Ok(response) = AResponse::arbitrary_take_rest(u) {
                response_round_trip(response.into_response());
            }
        }
        mode::RAW_REQUEST => raw_request(u.take_rest(), dialect),
        _ => {
            let command = RESPONSE_COMMANDS
                [usize::from(selector >> mode::COMMAND_SHIFT) % RESPONSE_COMMANDS.len()];
            raw_response(u.take_rest(), command);
        }
    }
}

/// The selector byte of a raw request frame seed.
pub fn raw_request_selector(dialect: Dialect) -> u8 {
    mode::RAW_REQUEST | if dialect == Dialect::V8 { mode::V8 } else { 0 }
}

/// The selector byte of a raw response frame seed.
pub fn raw_response_selector(command: Command) -> u8 {
    let index = RESPONSE_COMMANDS.iter().position(|&c| c == command).unwrap_or(0) as u8;
    mode::RAW_RESPONSE | (index << mode::COMMAND_SHIFT)
}
