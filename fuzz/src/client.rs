//! `client_session`: a [`ClientSession`] with pipelined requests of arbitrary shapes, fed
//! arbitrary reply bytes in arbitrary splits.
//!
//! Input layout: `version: u8` (bit 0: major 8 else 7; bits 1-2: minor; bits 3-7: patch),
//! `count: u8` (modulo 17) request shapes (each a tag byte and its fields, see
//! [`RequestShape`]), then [`Splits`], then the reply bytes.

use std::collections::VecDeque;

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use proto_core::ggml::types::id;
use proto_core::session::{ClientEvent, ClientSession};
use proto_core::wire::{
    CommInitRequest, Command, GraphComputeRequest, ProtocolVersion, Request, RpcTensor,
    SetTensorHeader, Tensor2dHeader, COMM_HOST_SIZE,
};
use proto_core::Error;

use crate::{byte, Splits};

/// Most requests one input queues.
pub const MAX_REQUESTS: usize = 16;

/// The request shapes a client may queue (a small enum, not every wire field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestShape {
    /// DEVICE_COUNT.
    DeviceCount,
    /// ALLOC_BUFFER.
    AllocBuffer { device: u8, size: u32 },
    /// GET_ALIGNMENT.
    GetAlignment { device: u8 },
    /// GET_MAX_SIZE.
    GetMaxSize { device: u8 },
    /// GET_DEVICE_MEMORY.
    GetDeviceMemory { device: u8 },
    /// BUFFER_GET_BASE.
    BufferGetBase { buffer: u64 },
    /// FREE_BUFFER (no response).
    FreeBuffer { buffer: u64 },
    /// BUFFER_CLEAR (no response).
    BufferClear { buffer: u64, value: u8 },
    /// SET_TENSOR with `len` bytes (no response).
    SetTensor { len: u8 },
    /// SET_TENSOR_HASH.
    SetTensorHash { hash: u64 },
    /// GET_TENSOR of a small size.
    GetTensor { offset: u16, size: u16 },
    /// GET_TENSOR of any size (exercises the size arithmetic of a huge expected reply).
    GetTensorHuge { size: u64 },
    /// COPY_TENSOR.
    CopyTensor,
    /// GET_ALLOC_SIZE.
    GetAllocSize,
    /// GRAPH_COMPUTE with `n` one-node graphs' worth of tensors (no response).
    GraphCompute { n: u8, uid: u8 },
    /// GRAPH_RECOMPUTE (no response).
    GraphRecompute { uid: u8 },
    /// MEMSET_TENSOR (no response).
    MemsetTensor { size: u8 },
    /// SET_TENSOR_2D (8.x, no response).
    SetTensor2d { size: u8, n_copies: u8 },
    /// GET_TENSOR_2D (8.x); zero sizes are refused by the session.
    GetTensor2d { size: u16, n_copies: u16 },
    /// COMM_INIT (8.x).
    CommInit { rank: u8, world: u8 },
    /// COMM_ALLREDUCE (8.x, no response).
    CommAllreduce,
    /// COMM_FREE (8.x, no response).
    CommFree,
    /// INIT_TENSOR (no response).
    InitTensor,
}

/// Number of [`RequestShape`] tags.
pub const SHAPES: u8 = 23;

fn u16_of(u: &mut Unstructured<'_>) -> u16 {
    u16::arbitrary(u).unwrap_or(0)
}
fn u32_of(u: &mut Unstructured<'_>) -> u32 {
    u32::arbitrary(u).unwrap_or(0)
}
fn u64_of(u: &mut Unstructured<'_>) -> u64 {
    u64::arbitrary(u).unwrap_or(0)
}

impl<'a> Arbitrary<'a> for RequestShape {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        use RequestShape::*;
        Ok(match byte(u) % SHAPES {
            0 => DeviceCount,
            1 => AllocBuffer { device: byte(u), size: u32_of(u) },
            2 => GetAlignment { device: byte(u) },
            3 => GetMaxSize { device: byte(u) },
            4 => GetDeviceMemory { device: byte(u) },
            5 => BufferGetBase { buffer: u64_of(u) },
            6 => FreeBuffer { buffer: u64_of(u) },
            7 => BufferClear { buffer: u64_of(u), value: byte(u) },
            8 => SetTensor { len: byte(u) },
            9 => SetTensorHash { hash: u64_of(u) },
            10 => GetTensor { offset: u16_of(u), size: u16_of(u) },
            11 => GetTensorHuge { size: u64_of(u) },
            12 => CopyTensor,
            13 => GetAllocSize,
            14 => GraphCompute { n: byte(u), uid: byte(u) },
            15 => GraphRecompute { uid: byte(u) },
            16 => MemsetTensor { size: byte(u) },
            17 => SetTensor2d { size: byte(u), n_copies: byte(u) },
            18 => GetTensor2d { size: u16_of(u), n_copies: u16_of(u) },
            19 => CommInit { rank: byte(u), world: byte(u) },
            20 => CommAllreduce,
            21 => CommFree,
            _ => InitTensor,
        })
    }
}

impl RequestShape {
    /// Appends the encoding [`Arbitrary`] reads back.
    pub fn encode(&self, out: &mut Vec<u8>) {
        use RequestShape::*;
        let (tag, fields): (u8, Vec<u8>) = match self {
            DeviceCount => (0, vec![]),
            AllocBuffer { device, size } => (1, [&[*device][..], &size.to_le_bytes()].concat()),
            GetAlignment { device } => (2, vec![*device]),
            GetMaxSize { device } => (3, vec![*device]),
            GetDeviceMemory { device } => (4, vec![*device]),
            BufferGetBase { buffer } => (5, buffer.to_le_bytes().to_vec()),
            FreeBuffer { buffer } => (6, buffer.to_le_bytes().to_vec()),
            BufferClear { buffer, value } => (7, [&buffer.to_le_bytes()[..], &[*value]].concat()),
            SetTensor { len } => (8, vec![*len]),
            SetTensorHash { hash } => (9, hash.to_le_bytes().to_vec()),
            GetTensor { offset, size } => (10, [offset.to_le_bytes(), size.to_le_bytes()].concat()),
            GetTensorHuge { size } => (11, size.to_le_bytes().to_vec()),
            CopyTensor => (12, vec![]),
            GetAllocSize => (13, vec![]),
            GraphCompute { n, uid } => (14, vec![*n, *uid]),
            GraphRecompute { uid } => (15, vec![*uid]),
            MemsetTensor { size } => (16, vec![*size]),
            SetTensor2d { size, n_copies } => (17, vec![*size, *n_copies]),
            GetTensor2d { size, n_copies } => {
                (18, [size.to_le_bytes(), n_copies.to_le_bytes()].concat())
            }
            CommInit { rank, world } => (19, vec![*rank, *world]),
            CommAllreduce => (20, vec![]),
            CommFree => (21, vec![]),
            InitTensor => (22, vec![]),
        };
        out.push(tag);
        out.extend_from_slice(&fields);
    }

    /// The request this shape stands for.
    pub fn to_request(&self) -> Request {
        use RequestShape::*;
        let tensor = |id: u64| {
            let mut t = RpcTensor::contiguous(id, id::F32, [64, 1, 1, 1]).unwrap_or_default();
            t.buffer = 0x1234_5679;
            t.data = 0x1000_0000_0000;
            Box::new(t)
        };
        match *self {
            DeviceCount => Request::DeviceCount,
            AllocBuffer { device, size } => {
                Request::AllocBuffer { device: device.into(), size: size.into() }
            }
            GetAlignment { device } => Request::GetAlignment { device: device.into() },
            GetMaxSize { device } => Request::GetMaxSize { device: device.into() },
            GetDeviceMemory { device } => Request::GetDeviceMemory { device: device.into() },
            BufferGetBase { buffer } => Request::BufferGetBase { buffer },
            FreeBuffer { buffer } => Request::FreeBuffer { buffer },
            BufferClear { buffer, value } => Request::BufferClear { buffer, value },
            SetTensor { len } => Request::SetTensor {
                header: Box::new(SetTensorHeader { tensor: *tensor(1), cache_flag: 0, offset: 0 }),
                data: Bytes::from(vec![0xa5; usize::from(len)]),
            },
            SetTensorHash { hash } => Request::SetTensorHash { tensor: tensor(1), offset: 0, hash },
            GetTensor { offset, size } => {
                Request::GetTensor { tensor: tensor(1), offset: offset.into(), size: size.into() }
            }
            GetTensorHuge { size } => Request::GetTensor { tensor: tensor(1), offset: 0, size },
            CopyTensor => Request::CopyTensor { src: tensor(1), dst: tensor(2) },
            GetAllocSize => Request::GetAllocSize(Box::new(proto_core::wire::AllocSizeRequest {
                device: 0,
                tensor: *tensor(1),
                srcs: Default::default(),
            })),
            GraphCompute { n, uid } => Request::GraphCompute(Box::new(GraphComputeRequest {
                device: 0,
                uid: uid.into(),
                node_ids: (1..=u64::from(n % 8)).collect(),
                tensors: (1..=u64::from(n % 8)).map(|i| *tensor(i)).collect(),
            })),
            GraphRecompute { uid } => Request::GraphRecompute { device: 0, uid: uid.into() },
            MemsetTensor { size } => Request::MemsetTensor {
                tensor: tensor(1),
                offset: 0,
                size: size.into(),
                value: 7,
            },
            SetTensor2d { size, n_copies } => Request::SetTensor2d {
                header: Box::new(Tensor2dHeader {
                    tensor: *tensor(1),
                    offset: 0,
                    size: size.into(),
                    n_copies: n_copies.into(),
                    stride: 64,
                }),
                data: Bytes::from(vec![3; usize::from(size) * usize::from(n_copies)]),
            },
            GetTensor2d { size, n_copies } => Request::GetTensor2d(Box::new(Tensor2dHeader {
                tensor: *tensor(1),
                offset: 0,
                size: size.into(),
                n_copies: n_copies.into(),
                stride: 64,
            })),
            CommInit { rank, world } => Request::CommInit(Box::new(CommInitRequest {
                device: 0,
                rank: rank.into(),
                world: world.into(),
                port: 50052,
                host: [0; COMM_HOST_SIZE],
            })),
            CommAllreduce => Request::CommAllreduce { device: 0, tensor: tensor(1) },
            CommFree => Request::CommFree { device: 0 },
            InitTensor => Request::InitTensor { tensor: tensor(1) },
        }
    }
}

/// A decoded `client_session` input.
#[derive(Debug, Clone)]
pub struct ClientInput<'a> {
    /// The client's version byte.
    pub version: u8,
    /// Requests queued after HELLO.
    pub requests: Vec<RequestShape>,
    /// How the replies are cut.
    pub splits: Splits,
    /// The server's bytes.
    pub replies: &'a [u8],
}

impl<'a> ClientInput<'a> {
    /// Reads the layout.
    pub fn parse(data: &'a [u8]) -> ClientInput<'a> {
        let mut u = Unstructured::new(data);
        let version = byte(&mut u);
        let count = usize::from(byte(&mut u)) % (MAX_REQUESTS + 1);
        let requests = (0..count)
            .map(|_| RequestShape::arbitrary(&mut u).unwrap_or(RequestShape::DeviceCount))
            .collect();
        let splits = Splits::read(&mut u);
        ClientInput { version, requests, splits, replies: u.take_rest() }
    }

    /// Writes the layout.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.version, self.requests.len().min(MAX_REQUESTS) as u8];
        for shape in self.requests.iter().take(MAX_REQUESTS) {
            shape.encode(&mut out);
        }
        self.splits.encode(&mut out);
        out.extend_from_slice(self.replies);
        out
    }

    /// The client's protocol version.
    pub fn protocol_version(&self) -> ProtocolVersion {
        ProtocolVersion {
            major: if self.version & 1 != 0 { 8 } else { 7 },
            minor: (self.version >> 1) & 3,
            patch: self.version >> 3,
        }
    }
}

/// What a run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ClientStats {
    /// Events delivered.
    pub events: usize,
    /// The error that ended the run, if any.
    pub error: Option<Error>,
}

/// Runs one input. Panics on a broken invariant.
pub fn run(data: &[u8]) -> ClientStats {
    let input = ClientInput::parse(data);
    let version = input.protocol_version();
    let mut client = ClientSession::new(version, [0; 24]).expect("majors 7 and 8 are spoken");
    // (command, response length) of every request that owes a response, in order.
    let mut owed: VecDeque<(Command, u64)> = VecDeque::from([(Command::Hello, 28)]);
    for shape in &input.requests {
        let request = shape.to_request();
        let before = client.outstanding();
        match client.send(&request) {
            Ok(()) => {
                let command = request.command();
                if command.has_response() {
                    let len = match &request {
                        Request::GetTensor { size, .. } => *size,
                        Request::GetTensor2d(header) => {
                            header.data_len(command).expect("sent, so the length is valid")
                        }
                        _ => command.fixed_response_size().expect("fixed size"),
                    };
                    owed.push_back((command, len));
                    assert_eq!(client.outstanding(), before + 1);
                } else {
                    assert_eq!(client.outstanding(), before);
                }
            }
            Err(_) => assert_eq!(client.outstanding(), before, "a refused request is not owed"),
        }
    }
    assert_eq!(client.outstanding(), owed.len());
    while client.poll_transmit().is_some() {}

    let mut stats = ClientStats::default();
    'input: for piece in input.splits.pieces(input.replies) {
        let before = client.outstanding();
        client.handle_input(Bytes::copy_from_slice(piece));
        assert_eq!(client.outstanding(), before, "input alone changed the outstanding count");
        loop {
            let before = client.outstanding();
            match client.poll_event() {
                Ok(Some(event)) => {
                    stats.events += 1;
                    assert_eq!(client.outstanding() + 1, before, "one event answers one request");
                    let (command, len) = owed.pop_front().expect("an event with nothing owed");
                    match event {
                        ClientEvent::Connected(hello) => {
                            assert_eq!(command, Command::Hello);
                            assert!(version.client_accepts(hello.version));
                            assert_eq!(client.server(), Some(&hello));
                        }
                        ClientEvent::Response(response) => {
                            assert_eq!(response.command(), command, "response out of order");
                            assert_eq!(response.payload_len(), len);
                        }
                    }
                }
                Ok(None) => {
                    assert_eq!(client.outstanding(), before);
                    break;
                }
                Err(error) => {
                    assert!(client.outstanding() <= before, "outstanding grew on an error");
                    assert_eq!(client.poll_event(), Err(error.clone()), "error not sticky");
                    assert!(client.send(&Request::DeviceCount).is_err(), "send after failure");
                    stats.error = Some(error);
                    break 'input;
                }
            }
        }
    }
    stats
}
