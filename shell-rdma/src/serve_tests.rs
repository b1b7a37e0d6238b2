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

/// A server connection past HELLO running [`serve`] on a thread, and our client session.
fn start() -> (
    thread::JoinHandle<Result<Closed, ConnectionError>>,
    ClientSession,
    MockVerbs,
) {
    let config = ServerConfig::new(VERSION).connection_config().unwrap();
    let mut conn = config
        .connect(Arc::new(MemoryBackend::new(1, 64 << 20)), false)
        .unwrap();
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
        serve(&mut conn, &mut links, &mut stream, &|| false)
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
    let Some(Response::AllocBuffer { remote_ptr, .. }) = call(
        &mut client,
        &mut stream,
        Request::AllocBuffer { device: 0, size },
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
    let mut tensor = RpcTensor::contiguous(1, id::F32, [size as u32 / 4, 1, 1, 1]).unwrap();
    tensor.buffer = remote_ptr;
    tensor.data = base;
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
fn a_send_that_overruns_a_slot_closes_that_connection_with_a_reason() {
    let (server, _client, mut end) = start();
    // Command, size and a payload coalesced into one SEND longer than a slot.
    let mut wire = vec![11u8];
    wire.extend_from_slice(&(RDMA_CHUNK as u64).to_le_bytes());
    wire.resize(9 + RDMA_CHUNK, 0);
    end.post_raw(&wire);
    let result = server.join().unwrap();
    let error = result.expect_err("the connection must fail");
    assert!(error.to_string().contains("RDMA CQ wc error"), "{error}");
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
