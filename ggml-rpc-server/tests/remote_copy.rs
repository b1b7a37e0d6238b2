//! Our remote-copy extension (`proto_core::wire::extension`) between two of our servers, in
//! every shell: byte-exact copies from 1 KiB to 256 MiB with clients of protocol 7 and 8,
//! direct and relayed with the same result, and every refusal (peer not allowed, extension
//! not negotiated, bad regions on either side, a ticket that does not match, B unreachable,
//! B closing mid-stream) as a clear error that closes nothing but what it must, with no
//! buffer left behind on either server.

#[macro_use]
mod common;

use std::net::SocketAddr;

use common::{bytes_tensor, pattern, within, Raw, TestServer};
use ggml_rpc_client::{
    copy_between_servers, copy_rows_between_servers, Client, ClientError, CopyMode, CopyPath,
};
use ggml_rpc_server::ServerConfig;
use proto_core::wire::{
    Command, Dialect, ProtocolVersion, RemoteCopyRequest, RemoteCopyStatus, Request, RpcTensor,
    Tensor2dHeader, EXTENSION_REMOTE_COPY, HELLO_FLAG_EXTENSIONS,
};
use shell_common::PeerAllowList;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SIZES: [u64; 4] = [1 << 10, (1 << 20) + 3, 64 << 20, 256 << 20];

/// Server B (default config), and server A allowed to push to `peers`.
fn pair(shell: &str, version: ProtocolVersion, peers: &[String]) -> (TestServer, TestServer) {
    let b = TestServer::start(shell, ServerConfig::new(version));
    let mut config = ServerConfig::new(version);
    let mut all: Vec<String> = peers.to_vec();
    all.push(b.addr.to_string());
    config.peers = PeerAllowList::resolve(&all).unwrap();
    let a = TestServer::start(shell, config);
    (a, b)
}

/// A buffer of `size` bytes on the client's server and a byte tensor spanning it.
async fn tensor(client: &mut Client, size: u64) -> RpcTensor {
    let buffer = client.alloc_buffer(0, size).await.unwrap().unwrap();
    let base = client.buffer_base(buffer.handle).await.unwrap();
    bytes_tensor(1, buffer.handle, base, u32::try_from(size).unwrap())
}

/// Compares `len` bytes at `offset` of `tensor` with `expected`, in 64 MiB pieces.
async fn assert_bytes(client: &mut Client, tensor: &RpcTensor, offset: u64, expected: &[u8]) {
    let mut done = 0usize;
    while done < expected.len() {
        let piece = (expected.len() - done).min(64 << 20);
        let got = within(client.get_tensor(tensor, offset + done as u64, piece as u64))
            .await
            .unwrap();
        assert!(
            got[..] == expected[done..done + piece],
            "bytes differ in [{done}, {})",
            done + piece
        );
        done += piece;
    }
}

async fn byte_exact_copies_direct_and_relayed(shell: &'static str) {
    for version in [ProtocolVersion::V7_0_0, ProtocolVersion::V8_0_0] {
        let (a, b) = pair(shell, version, &[]);
        let endpoint = b.addr.to_string();
        let mut src = a.client(version).await;
        let mut dst = b.client(version).await;
        assert!(src.offers_extensions() && dst.offers_extensions());
        for size in SIZES {
            // Odd offsets on both sides; the destination holds a direct and a relayed copy.
            let src_tensor = tensor(&mut src, size + 7).await;
            let dst_tensor = tensor(&mut dst, 2 * size + 16).await;
            let data = pattern(size as usize, size as u8);
            src.set_tensor(&src_tensor, 5, data.clone()).await.unwrap();
            let path = within(copy_between_servers(
                &mut src,
                &src_tensor,
                5,
                &mut dst,
                &dst_tensor,
                3,
                size,
                &endpoint,
                CopyMode::Direct,
            ))
            .await
            .unwrap();
            assert_eq!(path, CopyPath::Direct, "{version} {size}");
            let relayed = within(copy_between_servers(
                &mut src,
                &src_tensor,
                5,
                &mut dst,
                &dst_tensor,
                size + 11,
                size,
                &endpoint,
                CopyMode::Relay,
            ))
            .await
            .unwrap();
            assert_eq!(relayed, CopyPath::Relayed { refused: None });
            assert_bytes(&mut dst, &dst_tensor, 3, &data).await;
            assert_bytes(&mut dst, &dst_tensor, size + 11, &data).await;
            src.free_buffer(src_tensor.buffer).await.unwrap();
            dst.free_buffer(dst_tensor.buffer).await.unwrap();
            a.wait_live_buffers(0).await;
            b.wait_live_buffers(0).await;
        }
        drop((src, dst));
        a.wait_live_buffers(0).await;
        b.wait_live_buffers(0).await;
        a.shutdown().await;
        b.shutdown().await;
    }
}

/// Strided rows (SET_TENSOR_2D's shape), direct and relayed: small rows, and rows longer than
/// the 16 MiB pieces A streams in; a protocol-7 destination refuses rows.
async fn strided_rows_direct_and_relayed(shell: &'static str) {
    let version = ProtocolVersion::V8_0_0;
    let (a, b) = pair(shell, version, &[]);
    let endpoint = b.addr.to_string();
    let mut src = a.client(version).await;
    let mut dst = b.client(version).await;
    // (row size, rows, source stride, destination stride)
    for (size, n, src_stride, dst_stride) in [
        (3000u64, 64u64, 8192u64, 4096u64),
        (20 << 20, 2, 24 << 20, 21 << 20),
    ] {
        let src_len = 5 + (n - 1) * src_stride + size;
        let dst_len = 7 + (n - 1) * dst_stride + size;
        let src_tensor = tensor(&mut src, src_len).await;
        let data = pattern(src_len as usize, 77);
        src.set_tensor(&src_tensor, 0, data.clone()).await.unwrap();
        let src_rows = Tensor2dHeader {
            tensor: src_tensor.clone(),
            offset: 5,
            size,
            n_copies: n,
            stride: src_stride,
        };
        for mode in [CopyMode::Direct, CopyMode::Relay] {
            let dst_tensor = tensor(&mut dst, dst_len).await;
            dst.memset_tensor(&dst_tensor, 0, dst_len, 0xEE)
                .await
                .unwrap();
            let dst_rows = Tensor2dHeader {
                tensor: dst_tensor.clone(),
                offset: 7,
                size,
                n_copies: n,
                stride: dst_stride,
            };
            let path = within(copy_rows_between_servers(
                &mut src, &src_rows, &mut dst, &dst_rows, &endpoint, mode,
            ))
            .await
            .unwrap();
            assert_eq!(path == CopyPath::Direct, mode == CopyMode::Direct);
            // Every row in place, and the gaps between them untouched.
            let mut expected = vec![0xEEu8; dst_len as usize];
            for row in 0..n {
                let from = (5 + row * src_stride) as usize;
                let to = (7 + row * dst_stride) as usize;
                expected[to..to + size as usize].copy_from_slice(&data[from..from + size as usize]);
            }
            assert_bytes(&mut dst, &dst_tensor, 0, &expected).await;
            dst.free_buffer(dst_tensor.buffer).await.unwrap();
        }
        src.free_buffer(src_tensor.buffer).await.unwrap();
    }
    drop((src, dst));
    a.wait_live_buffers(0).await;
    b.wait_live_buffers(0).await;
    a.shutdown().await;
    b.shutdown().await;

    // Protocol 7 has no SET_TENSOR_2D: B refuses a ticket for rows.
    let version = ProtocolVersion::V7_0_0;
    let (a, b) = pair(shell, version, &[]);
    let mut src = a.client(version).await;
    let mut dst = b.client(version).await;
    let src_tensor = tensor(&mut src, 4096).await;
    let dst_tensor = tensor(&mut dst, 4096).await;
    let rows = |tensor: &RpcTensor| Tensor2dHeader {
        tensor: tensor.clone(),
        offset: 0,
        size: 16,
        n_copies: 4,
        stride: 32,
    };
    let direct = copy_rows_between_servers(
        &mut src,
        &rows(&src_tensor),
        &mut dst,
        &rows(&dst_tensor),
        &b.addr.to_string(),
        CopyMode::Direct,
    )
    .await;
    assert!(matches!(
        direct,
        Err(ClientError::RemoteCopy(RemoteCopyStatus::BadDestination))
    ));
    // Relayed row by row instead.
    let data = pattern(4096, 5);
    src.set_tensor(&src_tensor, 0, data.clone()).await.unwrap();
    let path = copy_rows_between_servers(
        &mut src,
        &rows(&src_tensor),
        &mut dst,
        &rows(&dst_tensor),
        &b.addr.to_string(),
        CopyMode::Relay,
    )
    .await
    .unwrap();
    assert_eq!(path, CopyPath::Relayed { refused: None });
    for row in 0..4usize {
        assert_bytes(
            &mut dst,
            &dst_tensor,
            row as u64 * 32,
            &data[row * 32..row * 32 + 16],
        )
        .await;
    }
    drop((src, dst));
    a.wait_live_buffers(0).await;
    b.wait_live_buffers(0).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Both clients still answer, and hold their buffers.
async fn still_usable(src: &mut Client, dst: &mut Client) {
    assert_eq!(within(src.device_count()).await.unwrap(), 1);
    assert_eq!(within(dst.device_count()).await.unwrap(), 1);
}

fn request(
    src: &RpcTensor,
    src_offset: u64,
    size: u64,
    dst: &RpcTensor,
    dst_offset: u64,
    ticket: u64,
    endpoint: &str,
) -> RemoteCopyRequest {
    RemoteCopyRequest {
        src: src.clone(),
        src_offset,
        size,
        n_copies: 1,
        src_stride: 0,
        dst: dst.clone(),
        dst_offset,
        dst_stride: 0,
        ticket,
        endpoint: RemoteCopyRequest::endpoint_field(endpoint).unwrap(),
    }
}

fn refused(result: Result<(), ClientError>) -> RemoteCopyStatus {
    match result {
        Err(ClientError::RemoteCopy(status)) => status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A port nothing listens on.
fn dead_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// A fake server B: answers HELLO (extensions bit), EXTENSIONS and ATTACH as ours would,
/// then reads `read_before_close` bytes of the SET_TENSOR and closes.
async fn fake_b_closing_mid_stream(read_before_close: usize) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut frame = vec![0u8; 9 + 24];
        socket.read_exact(&mut frame).await.unwrap();
        let mut hello = vec![28, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, HELLO_FLAG_EXTENSIONS];
        hello.extend_from_slice(&[0; 24]);
        socket.write_all(&hello).await.unwrap();
        let mut frame = vec![0u8; 9 + 8];
        socket.read_exact(&mut frame).await.unwrap();
        let mut granted = 8u64.to_le_bytes().to_vec();
        granted.extend_from_slice(&EXTENSION_REMOTE_COPY.to_le_bytes());
        socket.write_all(&granted).await.unwrap();
        let mut frame = vec![0u8; 9 + 32];
        socket.read_exact(&mut frame).await.unwrap();
        socket
            .write_all(&[1, 0, 0, 0, 0, 0, 0, 0, 0])
            .await
            .unwrap();
        let mut sink = vec![0u8; read_before_close];
        socket.read_exact(&mut sink).await.unwrap();
        drop(socket);
    });
    addr
}

async fn refusals_close_nothing_but_what_they_must(shell: &'static str) {
    let version = ProtocolVersion::V8_0_0;
    let dead = dead_port();
    let fake = fake_b_closing_mid_stream(1 << 20).await;
    let (a, b) = pair(shell, version, &[dead.to_string(), fake.to_string()]);
    let endpoint = b.addr.to_string();
    let mut src = a.client(version).await;
    let mut dst = b.client(version).await;
    let size = 4 << 20;
    let src_tensor = tensor(&mut src, size).await;
    let dst_tensor = tensor(&mut dst, size).await;
    let data = pattern(size as usize, 9);
    src.set_tensor(&src_tensor, 0, data.clone()).await.unwrap();
    assert!(src.enable_remote_copy().await.unwrap());
    assert!(dst.enable_remote_copy().await.unwrap());

    // Peer not allowed: another port of this host, and a name the list does not hold.
    for endpoint in [dead_port().to_string(), "localhost:1".to_owned()] {
        let ticket = dst.remote_copy_expect(&dst_tensor, 0, size).await.unwrap();
        let result = src
            .remote_copy_tensor(request(
                &src_tensor,
                0,
                size,
                &dst_tensor,
                0,
                ticket,
                &endpoint,
            ))
            .await;
        assert_eq!(refused(result), RemoteCopyStatus::PeerNotAllowed);
    }
    still_usable(&mut src, &mut dst).await;

    // Bad source region (past the tensor) and bad destination region (EXPECT past it).
    let ticket = dst.remote_copy_expect(&dst_tensor, 0, size).await.unwrap();
    let result = src
        .remote_copy_tensor(request(
            &src_tensor,
            1,
            size,
            &dst_tensor,
            0,
            ticket,
            &endpoint,
        ))
        .await;
    assert_eq!(refused(result), RemoteCopyStatus::BadSource);
    let result = dst.remote_copy_expect(&dst_tensor, 1, size).await;
    assert!(matches!(
        result,
        Err(ClientError::RemoteCopy(RemoteCopyStatus::BadDestination))
    ));
    // A request whose destination differs from its ticket's region: B refuses the attach.
    let ticket = dst
        .remote_copy_expect(&dst_tensor, 0, size / 2)
        .await
        .unwrap();
    let result = src
        .remote_copy_tensor(request(
            &src_tensor,
            0,
            size / 2,
            &dst_tensor,
            1,
            ticket,
            &endpoint,
        ))
        .await;
    assert_eq!(refused(result), RemoteCopyStatus::BadDestination);
    // A used or unknown ticket.
    let result = src
        .remote_copy_tensor(request(
            &src_tensor,
            0,
            size / 2,
            &dst_tensor,
            0,
            ticket,
            &endpoint,
        ))
        .await;
    assert_eq!(refused(result), RemoteCopyStatus::TicketRefused);
    still_usable(&mut src, &mut dst).await;

    // B unreachable, B closing mid-stream.
    let result = src
        .remote_copy_tensor(request(
            &src_tensor,
            0,
            size,
            &dst_tensor,
            0,
            1,
            &dead.to_string(),
        ))
        .await;
    assert_eq!(refused(result), RemoteCopyStatus::PeerUnreachable);
    let result = within(src.remote_copy_tensor(request(
        &src_tensor,
        0,
        size,
        &dst_tensor,
        0,
        1,
        &fake.to_string(),
    )))
    .await;
    assert_eq!(refused(result), RemoteCopyStatus::PeerClosed);
    still_usable(&mut src, &mut dst).await;

    // Auto falls back to the relay when A may not reach B; the data is the same.
    let path = within(copy_between_servers(
        &mut src,
        &src_tensor,
        0,
        &mut dst,
        &dst_tensor,
        0,
        size,
        &dead.to_string(),
        CopyMode::Auto,
    ))
    .await
    .unwrap();
    assert_eq!(
        path,
        CopyPath::Relayed {
            refused: Some(RemoteCopyStatus::PeerUnreachable)
        }
    );
    assert_bytes(&mut dst, &dst_tensor, 0, &data).await;
    // Direct and nothing refused: the destination's data is the source's.
    dst.memset_tensor(&dst_tensor, 0, size, 0).await.unwrap();
    let path = within(copy_between_servers(
        &mut src,
        &src_tensor,
        0,
        &mut dst,
        &dst_tensor,
        0,
        size,
        &endpoint,
        CopyMode::Auto,
    ))
    .await
    .unwrap();
    assert_eq!(path, CopyPath::Direct);
    assert_bytes(&mut dst, &dst_tensor, 0, &data).await;

    // The extension ids without EXTENSIONS: that connection alone is closed.
    for command in [
        Command::RemoteCopyExpect,
        Command::RemoteCopyAttach,
        Command::RemoteCopyTensor,
    ] {
        let mut raw = Raw::connect_hello(a.addr, Dialect::V8).await;
        let mut frame = vec![command.id()];
        let size = match command.request_size(Dialect::V8) {
            proto_core::wire::RequestSize::Exact(n) => n,
            proto_core::wire::RequestSize::AtLeast(n) => n,
        };
        frame.extend_from_slice(&size.to_le_bytes());
        frame.resize(9 + size as usize, 0);
        raw.write(&frame).await;
        raw.expect_closed().await;
    }
    // Granted, then a wrong size: closed too.
    let mut raw = Raw::connect_hello(b.addr, Dialect::V8).await;
    let granted = raw
        .call(
            &Request::Extensions {
                wanted: EXTENSION_REMOTE_COPY | 0x100,
            },
            8,
        )
        .await;
    assert_eq!(granted, EXTENSION_REMOTE_COPY.to_le_bytes());
    raw.write(&[Command::RemoteCopyAttach.id(), 7, 0, 0, 0, 0, 0, 0, 0])
        .await;
    raw.expect_closed().await;
    still_usable(&mut src, &mut dst).await;

    // An attached connection may do nothing but its one write.
    let ticket = dst.remote_copy_expect(&dst_tensor, 0, 16).await.unwrap();
    let mut raw = Raw::connect_hello(b.addr, Dialect::V8).await;
    raw.call(
        &Request::Extensions {
            wanted: EXTENSION_REMOTE_COPY,
        },
        8,
    )
    .await;
    let attached = raw
        .call(
            &Request::RemoteCopyAttach {
                ticket,
                buffer: dst_tensor.buffer,
                start: dst_tensor.data,
                size: 16,
                n_copies: 1,
                stride: 0,
            },
            1,
        )
        .await;
    assert_eq!(attached, [0]);
    raw.send(&Request::FreeBuffer {
        buffer: dst_tensor.buffer,
    })
    .await;
    raw.expect_closed().await;
    // The lent buffer is still the client's.
    assert_bytes(&mut dst, &dst_tensor, 0, &data).await;

    drop((src, dst));
    a.wait_live_buffers(0).await;
    b.wait_live_buffers(0).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A server started without extensions looks like llama.cpp's: no bit, nothing granted, and
/// `Auto` relays.
async fn without_extensions_the_client_relays(shell: &'static str) {
    let version = ProtocolVersion::V8_0_0;
    let mut config = ServerConfig::new(version);
    config.remote_copy = false;
    let b = TestServer::start(shell, config);
    let (a, unused) = pair(shell, version, &[b.addr.to_string()]);
    let mut src = a.client(version).await;
    let mut dst = b.client(version).await;
    assert!(!dst.offers_extensions());
    assert!(!dst.enable_remote_copy().await.unwrap());
    let src_tensor = tensor(&mut src, 4096).await;
    let dst_tensor = tensor(&mut dst, 4096).await;
    let data = pattern(4096, 3);
    src.set_tensor(&src_tensor, 0, data.clone()).await.unwrap();
    let endpoint = b.addr.to_string();
    let direct = copy_between_servers(
        &mut src,
        &src_tensor,
        0,
        &mut dst,
        &dst_tensor,
        0,
        4096,
        &endpoint,
        CopyMode::Direct,
    )
    .await;
    assert!(matches!(direct, Err(ClientError::RemoteCopyUnavailable)));
    let path = copy_between_servers(
        &mut src,
        &src_tensor,
        0,
        &mut dst,
        &dst_tensor,
        0,
        4096,
        &endpoint,
        CopyMode::Auto,
    )
    .await
    .unwrap();
    assert_eq!(path, CopyPath::Relayed { refused: None });
    assert_bytes(&mut dst, &dst_tensor, 0, &data).await;
    // EXTENSIONS there grants nothing.
    let mut raw = Raw::connect_hello(b.addr, Dialect::V8).await;
    let granted = raw
        .call(
            &Request::Extensions {
                wanted: EXTENSION_REMOTE_COPY,
            },
            8,
        )
        .await;
    assert_eq!(granted, [0; 8]);
    drop((src, dst));
    a.wait_live_buffers(0).await;
    b.wait_live_buffers(0).await;
    a.shutdown().await;
    b.shutdown().await;
    unused.shutdown().await;
}

for_each_shell!(
    byte_exact_copies_direct_and_relayed,
    refusals_close_nothing_but_what_they_must,
    without_extensions_the_client_relays,
    strided_rows_direct_and_relayed,
);
