//! The server loop over the in-memory queue pair: our client session on the other end.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto_core::backend::MemoryBackend;
use proto_core::ggml::types::id;
use proto_core::session::{ClientEvent, ClientSession};
use proto_core::wire::{ProtocolVersion, Request, Response, RpcTensor, SetTensorHeader};
use shell_common::shell::{Closed, ConnectionError};
use shell_common::ServerConfig;

use crate::framing::{Framer, Framing};
use crate::mock::{pair, MockVerbs};
use crate::serve::serve;
use crate::stream::{RdmaStream, Timing};
use crate::verbs::RDMA_CHUNK;

const VERSION: ProtocolVersion = ProtocolVersion::V8_0_0;
const WAIT: Duration = Duration::from_secs(10);

fn timing() -> Timing {
    Timing {
        spin: Duration::from_millis(5),
        stall: Duration::from_millis(500),
    }
}

type Served = (Result<Closed, ConnectionError>, RdmaStream<MockVerbs>);

/// A server connection past HELLO running [`serve`] on a thread, and our client session.
fn start() -> (
    thread::JoinHandle<Result<Closed, ConnectionError>>,
    ClientSession,
    MockVerbs,
) {
    let (server, client, end) = start_on(Arc::new(MemoryBackend::new(1, 64 << 20)));
    (thread::spawn(move || server.join().unwrap().0), client, end)
}

/// [`start`] on `backend`; the thread returns the connection's end and its stream (the
/// connection itself, and every buffer its client held, dropped).
fn start_on(backend: Arc<MemoryBackend>) -> (thread::JoinHandle<Served>, ClientSession, MockVerbs) {
    let config = ServerConfig::new(VERSION).connection_config().unwrap();
    let mut conn = config.connect(backend, false).unwrap();
    let mut links = config.comm_links();
    // HELLO as over TCP, in memory.
    let mut client = ClientSession::new(VERSION, [0; 24]).unwrap();
    while let Some(b) = client.poll_transmit() {
        conn.handle_input(b);
    }
    let _ = conn.poll(proto_core::driver::Place::Blocking).unwrap();
    while let Some(b) = conn.poll_transmit() {
        client.handle_input(b);
    }
    assert!(matches!(
        client.poll_event().unwrap(),
        Some(ClientEvent::Connected(_))
    ));
    let (client_end, server_end) = pair();
    let server = thread::spawn(move || {
        let mut stream = RdmaStream::new(server_end, timing());
        let result = serve(&mut conn, &mut links, &mut stream, &|| false);
        drop(conn);
        (result, stream)
    });
    (server, client, client_end)
}

/// Sends a request as the reference's client does and waits for its response, if any.
fn call(
    client: &mut ClientSession,
    stream: &mut RdmaStream<MockVerbs>,
    request: Request,
) -> Option<Response> {
    let answers = request.command().has_response();
    client.send(&request).unwrap();
    let mut framer = Framer::new(Framing::Request);
    while let Some(b) = client.poll_transmit() {
        framer.feed(&b, &mut |w| stream.send(w)).unwrap();
    }
    if !answers {
        return None;
    }
    let mut buf = vec![0u8; 1 << 20];
    loop {
        if let Some(ClientEvent::Response(r)) = client.poll_event().unwrap() {
            return Some(r);
        }
        let n = stream
            .recv(&mut buf, WAIT)
            .unwrap()
            .expect("a response in time");
        client.handle_input(Bytes::copy_from_slice(&buf[..n]));
    }
}

#[test]
fn commands_and_large_tensors_round_trip_over_rdma() {
    let (server, mut client, end) = start();
    let mut stream = RdmaStream::new(end, timing());
    let size = 3 * RDMA_CHUNK as u64 + 12344;
    let tensor = alloc_tensor(&mut client, &mut stream, size);
    let data: Vec<u8> = (0..size).map(|i| (i * 13 + i / 509) as u8).collect();
    let header = SetTensorHeader {
        tensor: tensor.clone(),
        cache_flag: 0,
        offset: 0,
    };
    assert!(call(
        &mut client,
        &mut stream,
        Request::SetTensor {
            header: Box::new(header),
            data: Bytes::from(data.clone())
        },
    )
    .is_none());
    let got = call(
        &mut client,
        &mut stream,
        Request::GetTensor {
            tensor: Box::new(tensor),
            offset: 0,
            size,
        },
    );
    let Some(Response::TensorData(bytes)) = got else {
        panic!("no data: {got:?}")
    };
    assert!(bytes == data, "the tensor came back changed");
    drop(stream);
    assert!(matches!(server.join().unwrap(), Ok(Closed::ByClient)));
}

#[test]
fn a_client_vanishing_mid_transfer_ends_the_connection_in_time() {
    let (server, mut client, end) = start();
    let mut stream = RdmaStream::new(end, timing());
    let Some(Response::AllocBuffer { remote_ptr, .. }) = call(
        &mut client,
        &mut stream,
        Request::AllocBuffer {
            device: 0,
            size: 1 << 20,
        },
    ) else {
        panic!("no buffer")
    };
    let Some(Response::BufferBase(base)) = call(
        &mut client,
        &mut stream,
        Request::BufferGetBase { buffer: remote_ptr },
    ) else {
        panic!("no base")
    };
    let mut tensor = RpcTensor::contiguous(1, id::F32, [1 << 18, 1, 1, 1]).unwrap();
    tensor.buffer = remote_ptr;
    tensor.data = base;
    let header = SetTensorHeader {
        tensor,
        cache_flag: 0,
        offset: 0,
    };
    client
        .send(&Request::SetTensor {
            header: Box::new(header),
            data: Bytes::from(vec![0u8; 1 << 20]),
        })
        .unwrap();
    // Only the first 100 KiB of the request's bytes, then the client is gone.
    let wire: Vec<u8> = std::iter::from_fn(|| client.poll_transmit())
        .flatten()
        .collect();
    let mut framer = Framer::new(Framing::Request);
    framer
        .feed(&wire[..100 << 10], &mut |w| stream.send(w))
        .unwrap();
    let start = Instant::now();
    drop(stream);
    let result = server.join().unwrap();
    let error = result.expect_err("a frame cut short is an error");
    assert!(error.to_string().contains("closed"), "{error}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// A buffer of `size` bytes and a tensor covering it, allocated over `stream`.
fn alloc_tensor(
    client: &mut ClientSession,
    stream: &mut RdmaStream<MockVerbs>,
    size: u64,
) -> RpcTensor {
    let Some(Response::AllocBuffer { remote_ptr, .. }) =
        call(client, stream, Request::AllocBuffer { device: 0, size })
    else {
        panic!("no buffer")
    };
    let Some(Response::BufferBase(base)) = call(
        client,
        stream,
        Request::BufferGetBase { buffer: remote_ptr },
    ) else {
        panic!("no base")
    };
    let mut tensor = RpcTensor::contiguous(1, id::F32, [size as u32 / 4, 1, 1, 1]).unwrap();
    tensor.buffer = remote_ptr;
    tensor.data = base;
    tensor
}

/// Writes `data` to `tensor` and reads it back.
fn round_trip(client: &mut ClientSession, stream: &mut RdmaStream<MockVerbs>, tensor: &RpcTensor) {
    let data: Vec<u8> = (0..tensor.byte_size().unwrap())
        .map(|i| (i * 31) as u8)
        .collect();
    let header = SetTensorHeader {
        tensor: tensor.clone(),
        cache_flag: 0,
        offset: 0,
    };
    let set = Request::SetTensor {
        header: Box::new(header),
        data: Bytes::from(data.clone()),
    };
    assert!(call(client, stream, set).is_none());
    let get = Request::GetTensor {
        tensor: Box::new(tensor.clone()),
        offset: 0,
        size: data.len() as u64,
    };
    let Some(Response::TensorData(bytes)) = call(client, stream, get) else {
        panic!("no data")
    };
    assert!(bytes == data, "the bystander's tensor came back changed");
}

/// The log lines written while `f` runs on this thread.
fn logged(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = sink.0.lock().unwrap().clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A hostile peer's completion (a length past the slot, or a slot never posted) ends that
/// connection with the reason in its log line, re-posts the slot it names, frees every buffer
/// its client held, and another client on the same backend goes on being served.
fn an_overrun_closes_only_that_connection(
    overrun: impl FnOnce(&mut MockVerbs),
    reposts: bool,
    reason: &str,
) {
    let backend = Arc::new(MemoryBackend::new(1, 64 << 20));
    let (server_a, mut client_a, end_a) = start_on(backend.clone());
    let mut stream_a = RdmaStream::new(end_a, timing());
    alloc_tensor(&mut client_a, &mut stream_a, 1 << 20);
    let (server_b, mut client_b, end_b) = start_on(backend.clone());
    let mut stream_b = RdmaStream::new(end_b, timing());
    let tensor_b = alloc_tensor(&mut client_b, &mut stream_b, 2 * RDMA_CHUNK as u64);
    assert_eq!(backend.live_buffers(), 2);

    overrun(stream_a.verbs_mut());
    let (result, server_stream) = server_a.join().unwrap();
    let error = result.as_ref().expect_err("the connection must fail");
    assert!(error.to_string().contains(reason), "{error}");
    let log = logged(|| shell_common::shell::log_end(&result));
    assert!(
        log.contains("WARN") && log.contains("Client connection closed") && log.contains(reason),
        "{log}"
    );
    assert_eq!(backend.live_buffers(), 1, "A's buffer freed, B's kept");
    assert_eq!(backend.used_bytes(), 2 * RDMA_CHUNK as u64);
    if reposts {
        assert_eq!(
            server_stream.verbs().slots_posted(),
            crate::verbs::RDMA_RX_DEPTH,
            "the slot the lie named is posted again"
        );
    }
    drop(stream_a);

    // B is served as before, over more than one slot each way.
    round_trip(&mut client_b, &mut stream_b, &tensor_b);
    drop(stream_b);
    assert!(matches!(server_b.join().unwrap().0, Ok(Closed::ByClient)));
    assert_eq!(backend.live_buffers(), 0);
}

#[test]
fn a_send_longer_than_a_slot_closes_only_that_connection() {
    // What an RC device does with it: the receive fails with a local length error.
    an_overrun_closes_only_that_connection(
        |peer| {
            let mut wire = vec![11u8];
            wire.extend_from_slice(&(RDMA_CHUNK as u64).to_le_bytes());
            wire.resize(9 + RDMA_CHUNK, 0);
            peer.post_raw(&wire);
        },
        false,
        "RDMA CQ wc error: local length error",
    );
}

#[test]
fn a_completion_longer_than_a_slot_closes_only_that_connection() {
    // A provider claiming more than the slot holds: nothing past the slot is read.
    an_overrun_closes_only_that_connection(
        |peer| assert!(peer.complete_peer_receive(&[11], RDMA_CHUNK as u32 + 1, None)),
        true,
        "RDMA recv overrun: got=262145",
    );
}

#[test]
fn a_completion_for_a_slot_never_posted_closes_only_that_connection() {
    an_overrun_closes_only_that_connection(
        |peer| assert!(peer.complete_peer_receive(&[11], 1, Some(99))),
        false,
        "RDMA recv overrun: got=1 in slot 99",
    );
}
