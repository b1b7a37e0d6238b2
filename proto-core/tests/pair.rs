//! Our client session and our server session (with the dispatcher over the in-memory backend)
//! driven against each other in memory, in the style of quinn-proto's `Pair`: no sockets, every
//! byte stream cut at random points.

use std::sync::Arc;

use bytes::Bytes;
use proto_core::backend::MemoryBackend;
use proto_core::dispatch::{Dispatcher, DispatcherConfig, Outcome};
use proto_core::ggml::types::id;
use proto_core::session::{
    ClientEvent, ClientSession, GraphSubmission, ServerEvent, ServerSession, ServerSessionConfig,
};
use proto_core::tensor_cache::{fnv1a64, MemoryTensorCache};
use proto_core::wire::{
    GraphComputeRequest, ProtocolVersion, Request, Response, RpcTensor, SetTensorHeader,
    Tensor2dHeader,
};
use proto_core::{Error, ErrorKind};

/// A tiny deterministic PRNG so splits are random but reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Pair {
    client: ClientSession,
    server: ServerSession,
    dispatcher: Dispatcher<MemoryBackend>,
    backend: Arc<MemoryBackend>,
    rng: Rng,
    /// Largest TensorData chunk the server produced.
    largest_chunk: usize,
    server_error: Option<Error>,
    /// Whether the server side moves tensor data the way a shell with direct socket access
    /// does: SET data received straight into backend memory
    /// (`Dispatcher::receive_in_place`) and large replies sent straight from it
    /// (`Dispatcher::send_in_place`). Client bytes then wait in `wire` until the server
    /// "reads" them.
    in_place: bool,
    wire: std::collections::VecDeque<u8>,
    /// Bytes of SET data placed in memory directly / reply bytes sent directly.
    received_in_place: usize,
    sent_in_place: usize,
}

impl Pair {
    fn new(client_version: ProtocolVersion, server_version: ProtocolVersion, seed: u64) -> Pair {
        Pair::with_config(client_version, DispatcherConfig::new(server_version), seed)
    }

    fn with_config(client_version: ProtocolVersion, config: DispatcherConfig, seed: u64) -> Pair {
        let backend = Arc::new(MemoryBackend::new(2, 1 << 30));
        let dialect = config.version.dialect().unwrap();
        Pair {
            client: ClientSession::new(client_version, [0; 24]).unwrap(),
            server: ServerSession::new(ServerSessionConfig::new(dialect)),
            dispatcher: Dispatcher::new(backend.clone(), config).unwrap(),
            backend,
            rng: Rng(seed | 1),
            largest_chunk: 0,
            server_error: None,
            in_place: false,
            wire: Default::default(),
            received_in_place: 0,
            sent_in_place: 0,
        }
    }

    fn in_place(mut self) -> Pair {
        self.in_place = true;
        self
    }

    /// Moves bytes both ways, cut at random points, until nothing moves. Returns the client's
    /// events; a server error is kept in `server_error` (the server would close).
    fn drive(&mut self) -> Result<Vec<ClientEvent>, Error> {
        let mut events = Vec::new();
        loop {
            let mut moved = false;
            while let Some(bytes) = self.client.poll_transmit() {
                moved = true;
                self.feed_server(bytes);
            }
            if self.server_error.is_none() {
                if let Err(error) = self.run_server() {
                    self.server_error = Some(error);
                }
            }
            while let Some(bytes) = self.server.poll_transmit() {
                moved = true;
                let mut rest = bytes;
                while !rest.is_empty() {
                    let cut = 1 + self.rng.below(rest.len());
                    self.client.handle_input(rest.split_to(cut));
                }
            }
            while let Some(event) = self.client.poll_event()? {
                events.push(event);
            }
            if !moved {
                return Ok(events);
            }
        }
    }

    fn feed_server(&mut self, mut bytes: Bytes) {
        if self.in_place {
            self.wire.extend(&bytes[..]);
            return;
        }
        while !bytes.is_empty() {
            let cut = 1 + self.rng.below(bytes.len().min(1 << 20));
            self.server.handle_input(bytes.split_to(cut));
        }
    }

    fn run_server(&mut self) -> Result<(), Error> {
        loop {
            while let Some(event) = self.server.poll_event()? {
                if let ServerEvent::TensorData(chunk) = &event {
                    self.largest_chunk = self.largest_chunk.max(chunk.len());
                }
                match self.dispatcher.handle(event)? {
                    Outcome::Done | Outcome::CommFree { .. } => {}
                    Outcome::Respond(response) => self.server.send_response(&response)?,
                    Outcome::RespondStream(stream) if self.in_place => {
                        self.send_reply_in_place(stream)?
                    }
                    Outcome::RespondStream(stream) => {
                        self.dispatcher.stream_reply(stream, &mut self.server)?
                    }
                    other => panic!("unexpected outcome {other:?}"),
                }
            }
            if self.wire.is_empty() {
                return Ok(());
            }
            // A shell "reads" a random amount: into the destination when the session allows,
            // else into a buffer handed to the session.
            let want = 1 + self.rng.below(self.wire.len().min(3 << 20));
            let wire = &mut self.wire;
            let placed = self
                .dispatcher
                .receive_in_place(&mut self.server, &mut |dst| {
                    let n = want.min(dst.len());
                    for (d, s) in dst[..n].iter_mut().zip(wire.drain(..n)) {
                        *d = s;
                    }
                    n
                })?;
            match placed {
                Some(n) => self.received_in_place += n,
                None => {
                    let chunk: Vec<u8> = self.wire.drain(..want).collect();
                    self.server.handle_input(chunk.into());
                }
            }
        }
    }

    /// A large reply the way a shell with direct socket access sends it: the head through the
    /// session's transmits, the data straight from backend memory in random-sized sends.
    fn send_reply_in_place(
        &mut self,
        mut stream: proto_core::dispatch::TensorReadStream,
    ) -> Result<(), Error> {
        self.server
            .begin_response_stream(stream.command(), stream.len())?;
        while let Some(bytes) = self.server.poll_transmit() {
            self.client.handle_input(bytes);
        }
        while stream.remaining() > 0 {
            let want = 1 + self.rng.below(5 << 20);
            let mut sent = Vec::new();
            let n = self
                .dispatcher
                .send_in_place(&mut stream, &mut self.server, &mut |src| {
                    let n = want.min(src.len());
                    sent.extend_from_slice(&src[..n]);
                    n
                })?
                .expect("the memory backend lends its memory");
            assert_eq!(n, sent.len());
            self.sent_in_place += n;
            self.client.handle_input(sent.into());
        }
        Ok(())
    }

    fn connect(&mut self) -> ClientEvent {
        let events = self.drive().unwrap();
        assert_eq!(events.len(), 1);
        events.into_iter().next().unwrap()
    }

    fn call(&mut self, request: Request) -> Response {
        self.client.send(&request).unwrap();
        let events = self.drive().unwrap();
        match events.as_slice() {
            [ClientEvent::Response(response)] => response.clone(),
            other => panic!(
                "expected one response, got {other:?} (server: {:?})",
                self.server_error
            ),
        }
    }

    fn cast(&mut self, request: Request) {
        self.client.send(&request).unwrap();
        assert!(self.drive().unwrap().is_empty());
    }

    /// Allocates a buffer and returns (handle, base).
    fn alloc(&mut self, size: u64) -> (u64, u64) {
        let Response::AllocBuffer {
            remote_ptr,
            remote_size,
        } = self.call(Request::AllocBuffer { device: 0, size })
        else {
            panic!("bad alloc response");
        };
        assert_ne!(remote_ptr, 0);
        assert_eq!(remote_size, size);
        let Response::BufferBase(base) = self.call(Request::BufferGetBase { buffer: remote_ptr })
        else {
            panic!("bad base response");
        };
        (remote_ptr, base)
    }
}

fn tensor_at(id: u64, buffer: u64, data: u64, ne: [u32; 4]) -> RpcTensor {
    let mut tensor = RpcTensor::contiguous(id, id::F32, ne).unwrap();
    tensor.buffer = buffer;
    tensor.data = data;
    tensor
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn handshake_reports_version_and_cache_flag() {
    for (version, seed) in [(ProtocolVersion::V7_0_0, 1), (ProtocolVersion::V8_0_0, 2)] {
        let mut pair = Pair::new(version, version, seed);
        let ClientEvent::Connected(hello) = pair.connect() else {
            panic!()
        };
        assert_eq!(hello.version, version);
        assert!(!hello.has_tensor_cache());
    }
    let mut config = DispatcherConfig::new(ProtocolVersion::V8_0_0);
    config.tensor_cache = Some(Arc::new(MemoryTensorCache::default()));
    let mut pair = Pair::with_config(ProtocolVersion::V8_0_0, config, 3);
    let ClientEvent::Connected(hello) = pair.connect() else {
        panic!()
    };
    assert!(hello.has_tensor_cache());
}

#[test]
fn client_rejects_a_server_of_another_major() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V7_0_0, 4);
    let error = pair.drive().unwrap_err();
    assert_eq!(
        error,
        Error::VersionMismatch {
            major: 7,
            minor: 0,
            patch: 0
        }
    );
}

#[test]
fn pipelined_small_commands_come_back_in_order() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 5);
    pair.client.send(&Request::DeviceCount).unwrap();
    pair.client
        .send(&Request::GetAlignment { device: 1 })
        .unwrap();
    pair.client
        .send(&Request::GetMaxSize { device: 0 })
        .unwrap();
    pair.client
        .send(&Request::GetDeviceMemory { device: 0 })
        .unwrap();
    let events = pair.drive().unwrap();
    assert_eq!(
        events[1..],
        [
            ClientEvent::Response(Response::DeviceCount(2)),
            ClientEvent::Response(Response::Alignment(32)),
            ClientEvent::Response(Response::MaxSize(1 << 30)),
            ClientEvent::Response(Response::DeviceMemory {
                free: 1 << 30,
                total: 1 << 30
            }),
        ]
    );
}

#[test]
fn set_and_get_round_trip_in_bounded_chunks() {
    for (version, seed, in_place) in [
        (ProtocolVersion::V7_0_0, 6, false),
        (ProtocolVersion::V8_0_0, 7, false),
        (ProtocolVersion::V7_0_0, 16, true),
        (ProtocolVersion::V8_0_0, 17, true),
    ] {
        let mut pair = Pair::new(version, version, seed);
        if in_place {
            pair = pair.in_place();
        }
        pair.connect();
        let len = 40 << 20; // more than two 16 MiB chunks
        let (buffer, base) = pair.alloc(len as u64 + 64);
        let tensor = tensor_at(1, buffer, base + 64, [(len / 4) as u32, 1, 1, 1]);
        let data = Bytes::from(pattern(len, 9));
        pair.cast(Request::SetTensor {
            header: Box::new(SetTensorHeader {
                tensor: tensor.clone(),
                cache_flag: 0,
                offset: 0,
            }),
            data: data.clone(),
        });
        assert!(pair.largest_chunk <= 16 << 20);
        if in_place {
            // most of the data went straight to memory; what arrived with the header did not
            assert!(
                pair.received_in_place > len / 2,
                "{}",
                pair.received_in_place
            );
            assert!(pair.received_in_place <= len);
        } else {
            assert!(pair.largest_chunk > 0);
        }
        let response = pair.call(Request::GetTensor {
            tensor: Box::new(tensor.clone()),
            offset: 0,
            size: len as u64,
        });
        assert_eq!(response, Response::TensorData(data.clone()));
        assert_eq!(pair.sent_in_place, if in_place { len } else { 0 });
        // odd offset and size
        let response = pair.call(Request::GetTensor {
            tensor: Box::new(tensor),
            offset: 7,
            size: 13,
        });
        assert_eq!(response, Response::TensorData(data.slice(7..20)));
    }
}

#[test]
fn memset_copy_clear_and_2d() {
    memset_copy_clear_and_2d_with(Pair::new(
        ProtocolVersion::V8_0_0,
        ProtocolVersion::V8_0_0,
        8,
    ));
    for seed in 30..40 {
        memset_copy_clear_and_2d_with(
            Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, seed).in_place(),
        );
    }
}

fn memset_copy_clear_and_2d_with(mut pair: Pair) {
    pair.connect();
    let (buffer, base) = pair.alloc(4096);
    let a = tensor_at(1, buffer, base, [64, 1, 1, 1]);
    let b = tensor_at(2, buffer, base + 256, [64, 1, 1, 1]);
    pair.cast(Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: a.clone(),
            cache_flag: 0,
            offset: 0,
        }),
        data: Bytes::from(pattern(256, 1)),
    });
    assert_eq!(
        pair.call(Request::CopyTensor {
            src: Box::new(a.clone()),
            dst: Box::new(b.clone())
        }),
        Response::CopyTensor(1)
    );
    pair.cast(Request::MemsetTensor {
        tensor: Box::new(b.clone()),
        offset: 4,
        size: 8,
        value: 0xee,
    });
    let Response::TensorData(got) = pair.call(Request::GetTensor {
        tensor: Box::new(b.clone()),
        offset: 0,
        size: 256,
    }) else {
        panic!()
    };
    let mut expected = pattern(256, 1);
    expected[4..12].fill(0xee);
    assert_eq!(&got[..], &expected[..]);

    // 2D: three rows of 8 bytes every 32 bytes
    let rows = Tensor2dHeader {
        tensor: a.clone(),
        offset: 16,
        size: 8,
        n_copies: 3,
        stride: 32,
    };
    pair.cast(Request::SetTensor2d {
        header: Box::new(rows.clone()),
        data: Bytes::from(vec![7u8; 24]),
    });
    assert_eq!(
        pair.call(Request::GetTensor2d(Box::new(rows))),
        Response::Tensor2dData(Bytes::from(vec![7u8; 24]))
    );
    let Response::TensorData(got) = pair.call(Request::GetTensor {
        tensor: Box::new(a.clone()),
        offset: 0,
        size: 256,
    }) else {
        panic!()
    };
    let mut expected = pattern(256, 1);
    for row in 0..3 {
        expected[16 + 32 * row..24 + 32 * row].fill(7);
    }
    assert_eq!(&got[..], &expected[..]);

    pair.cast(Request::BufferClear { buffer, value: 0 });
    let Response::TensorData(got) = pair.call(Request::GetTensor {
        tensor: Box::new(a),
        offset: 0,
        size: 256,
    }) else {
        panic!()
    };
    assert!(got.iter().all(|&b| b == 0));
}

#[test]
fn tensor_cache_hit_miss_and_corrupt_entry() {
    let cache = Arc::new(MemoryTensorCache::default());
    let mut config = DispatcherConfig::new(ProtocolVersion::V8_0_0);
    config.tensor_cache = Some(cache.clone());
    // in-place mode: data that also goes to the cache takes the buffered path
    let mut pair = Pair::with_config(ProtocolVersion::V8_0_0, config, 10).in_place();
    pair.connect();
    let (buffer, base) = pair.alloc(1024);
    let tensor = tensor_at(1, buffer, base, [256, 1, 1, 1]);
    let data = pattern(1024, 3);
    let hash = fnv1a64(&data);
    let ask = |tensor: &RpcTensor| Request::SetTensorHash {
        tensor: Box::new(tensor.clone()),
        offset: 0,
        hash,
    };
    assert_eq!(pair.call(ask(&tensor)), Response::SetTensorHash(0));
    pair.cast(Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor: tensor.clone(),
            cache_flag: 1,
            offset: 0,
        }),
        data: Bytes::from(data.clone()),
    });
    assert!(cache.contains(hash));
    assert_eq!(pair.received_in_place, 0);
    pair.cast(Request::BufferClear { buffer, value: 0 });
    assert_eq!(pair.call(ask(&tensor)), Response::SetTensorHash(1));
    assert_eq!(
        pair.call(Request::GetTensor {
            tensor: Box::new(tensor.clone()),
            offset: 0,
            size: 1024
        }),
        Response::TensorData(Bytes::from(data))
    );
    // A planted entry whose content does not match its name is a miss and gets dropped.
    cache.insert(77, vec![1; 16]);
    let planted = Request::SetTensorHash {
        tensor: Box::new(tensor),
        offset: 0,
        hash: 77,
    };
    assert_eq!(pair.call(planted), Response::SetTensorHash(0));
    assert!(!cache.contains(77));
}

#[test]
fn closing_frees_everything_the_client_held() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 11);
    pair.connect();
    pair.alloc(1000);
    let (second, _) = pair.alloc(2000);
    assert_eq!(pair.backend.live_buffers(), 2);
    pair.cast(Request::FreeBuffer { buffer: second });
    assert_eq!(pair.backend.live_buffers(), 1);
    let backend = pair.backend.clone();
    drop(pair);
    assert_eq!(backend.live_buffers(), 0);
    assert_eq!(backend.used_bytes(), 0);
}

#[test]
fn hostile_requests_fail_with_their_kind() {
    let cases: Vec<(Request, ErrorKind)> = vec![
        (
            Request::GetAlignment { device: 9 },
            ErrorKind::InvalidDevice,
        ),
        (
            Request::BufferGetBase { buffer: 12345 },
            ErrorKind::UnknownBuffer,
        ),
        (Request::FreeBuffer { buffer: 0 }, ErrorKind::UnknownBuffer),
        (
            Request::GraphRecompute { device: 0, uid: 5 },
            ErrorKind::GraphNotFound,
        ),
    ];
    for (seed, (request, kind)) in cases.into_iter().enumerate() {
        let mut pair = Pair::new(
            ProtocolVersion::V8_0_0,
            ProtocolVersion::V8_0_0,
            20 + seed as u64,
        );
        pair.connect();
        pair.client.send(&request).unwrap();
        let _ = pair.drive();
        assert_eq!(
            pair.server_error.as_ref().map(Error::kind),
            Some(kind),
            "{request:?}"
        );
    }
    // Region checks need a buffer first.
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 40);
    pair.connect();
    let (buffer, base) = pair.alloc(256);
    let outside = tensor_at(1, buffer, base + 128, [64, 1, 1, 1]);
    pair.client
        .send(&Request::GetTensor {
            tensor: Box::new(outside),
            offset: 0,
            size: 4,
        })
        .unwrap();
    let _ = pair.drive();
    assert_eq!(
        pair.server_error.as_ref().map(Error::kind),
        Some(ErrorKind::OutOfBounds)
    );
}

#[test]
fn graph_compute_and_recompute_follow_the_uid_cache() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 50);
    pair.connect();
    let (buffer, base) = pair.alloc(1024);
    let mut node = tensor_at(2, buffer, base + 256, [4, 1, 1, 1]);
    node.op = proto_core::ggml::Op::VIEW.0;
    node.view_src = 1;
    node.flags = proto_core::ggml::flags::COMPUTE;
    let leaf = tensor_at(1, buffer, base + 256, [4, 1, 1, 1]);
    let graph = GraphComputeRequest {
        device: 0,
        uid: 42,
        node_ids: vec![2],
        tensors: vec![leaf, node],
    };
    assert_eq!(
        pair.client.graph_submission(0, 42),
        GraphSubmission::Compute
    );
    pair.cast(Request::GraphCompute(Box::new(graph)));
    assert_eq!(
        pair.client.graph_submission(0, 42),
        GraphSubmission::Recompute
    );
    pair.cast(Request::GraphRecompute { device: 0, uid: 42 });
    assert_eq!(pair.backend.graphs_run(), 2);
    // FREE_BUFFER invalidates stored graphs: a recompute then closes the connection.
    pair.cast(Request::FreeBuffer { buffer });
    pair.client
        .send(&Request::GraphRecompute { device: 0, uid: 42 })
        .unwrap();
    let _ = pair.drive();
    assert_eq!(
        pair.server_error.as_ref().map(Error::kind),
        Some(ErrorKind::GraphNotFound)
    );
}

#[test]
fn overlapping_2d_read_is_refused_before_allocating() {
    // Rows of 64 bytes with stride 0, 2^44 times: 2^50 bytes out of a 256-byte tensor. This
    // used to reach `vec![0; 2^50]` and abort the process.
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 41);
    pair.connect();
    let (buffer, base) = pair.alloc(4096);
    let tensor = tensor_at(1, buffer, base, [64, 1, 1, 1]);
    let rows = Tensor2dHeader {
        tensor,
        offset: 0,
        size: 64,
        n_copies: 1 << 44,
        stride: 0,
    };
    pair.client
        .send(&Request::GetTensor2d(Box::new(rows)))
        .unwrap();
    let _ = pair.drive();
    assert_eq!(
        pair.server_error.as_ref().map(Error::kind),
        Some(ErrorKind::MessageTooLarge)
    );
}

#[test]
fn in_place_2d_rows_land_in_their_rows() {
    for seed in 50..56 {
        let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, seed).in_place();
        pair.connect();
        let (buffer, base) = pair.alloc(8 << 20);
        let a = tensor_at(1, buffer, base, [(2 << 20) as u32, 1, 1, 1]);
        let rows = Tensor2dHeader {
            tensor: a.clone(),
            offset: 100,
            size: 1 << 20,
            n_copies: 5,
            stride: (1 << 20) + 333,
        };
        let data = pattern(5 << 20, 4);
        pair.cast(Request::SetTensor2d {
            header: Box::new(rows.clone()),
            data: Bytes::from(data.clone()),
        });
        let Response::TensorData(whole) = pair.call(Request::GetTensor {
            tensor: Box::new(a),
            offset: 0,
            size: 8 << 20,
        }) else {
            panic!()
        };
        for row in 0..5 {
            let at = 100 + row * ((1 << 20) + 333);
            assert_eq!(
                &whole[at..at + (1 << 20)],
                &data[row << 20..(row + 1) << 20],
                "seed {seed} row {row}"
            );
        }
        assert!(pair.received_in_place > 0, "seed {seed}");
    }
}

#[test]
fn in_place_misuse_is_an_error_not_a_corruption() {
    let mut pair = Pair::new(ProtocolVersion::V8_0_0, ProtocolVersion::V8_0_0, 60);
    pair.connect();
    // nothing streams: no capacity, and the dispatcher declines
    assert_eq!(pair.server.in_place_capacity(), 0);
    assert!(pair.server.data_received_in_place(1).is_err());
    assert_eq!(
        pair.dispatcher
            .receive_in_place(&mut pair.server, &mut |_| unreachable!())
            .unwrap(),
        None
    );
    assert!(pair.server.response_data_sent_in_place(1).is_err());

    // a SET_TENSOR header without its data: the write streams, nothing buffered
    let (buffer, base) = pair.alloc(4096);
    let tensor = tensor_at(1, buffer, base, [1024, 1, 1, 1]);
    let mut head = bytes::BytesMut::new();
    Request::SetTensor {
        header: Box::new(SetTensorHeader {
            tensor,
            cache_flag: 0,
            offset: 0,
        }),
        data: Bytes::from(vec![0u8; 4096]),
    }
    .encode_head(ProtocolVersion::V8_0_0.dialect().unwrap(), &mut head)
    .unwrap();
    pair.server.handle_input(head.freeze());
    let event = pair.server.poll_event().unwrap().unwrap();
    assert!(matches!(
        event,
        ServerEvent::TensorWriteBegin { data_len: 4096, .. }
    ));
    pair.dispatcher.handle(event).unwrap();
    assert_eq!(pair.server.in_place_capacity(), 4096);
    // a receive that claims more than it was lent is refused
    let error = pair
        .dispatcher
        .receive_in_place(&mut pair.server, &mut |dst| dst.len() + 1)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Backend);
    // the session refuses more than the capacity
    assert!(pair.server.data_received_in_place(4097).is_err());
    // partial receives add up, then the write ends
    for _ in 0..4 {
        let n = pair
            .dispatcher
            .receive_in_place(&mut pair.server, &mut |dst| {
                dst[..1024].fill(9);
                1024
            })
            .unwrap();
        assert_eq!(n, Some(1024));
    }
    assert_eq!(pair.server.in_place_capacity(), 0);
    let end = pair.server.poll_event().unwrap().unwrap();
    assert_eq!(end, ServerEvent::TensorWriteEnd);
    assert!(matches!(
        pair.dispatcher.handle(end).unwrap(),
        Outcome::Done
    ));
}
