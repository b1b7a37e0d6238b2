//! A complete ggml RPC server over blocking `std::net`, one thread per client: the canonical
//! loop around [`Connection`] that every shell runs (tokio, io_uring and smol only add
//! readiness, submission and thread pools to it). Devices are [`MemoryBackend`]'s: memory
//! commands work as on any server, graphs are accepted but not computed, and COMM_INIT is
//! refused (a comm link needs `shell-common`).
//!
//! ```sh
//! cargo run -p proto-core --example blocking_server -- 127.0.0.1:50052 8
//! ```

use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

use bytes::Bytes;
use proto_core::backend::MemoryBackend;
use proto_core::dispatch::DispatcherConfig;
use proto_core::driver::{Action, CommWork, Connection, Place, Receive};
use proto_core::session::ServerSessionConfig;
use proto_core::wire::ProtocolVersion;

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:50052".into());
    let version = match args.next().as_deref() {
        Some("7") => ProtocolVersion::V7_0_0,
        _ => ProtocolVersion::V8_0_0,
    };
    let backend = Arc::new(MemoryBackend::new(1, 4 << 30));
    let listener = TcpListener::bind(&addr)?;
    println!(
        "blocking_server: protocol {version} on {}",
        listener.local_addr()?
    );
    for stream in listener.incoming() {
        let (stream, backend) = (stream?, backend.clone());
        std::thread::spawn(move || match serve(stream, backend, version) {
            Ok(()) => println!("client closed"),
            Err(error) => println!("client closed on error: {error}"),
        });
    }
    Ok(())
}

/// Serves one client until it closes or fails; dropping `conn` frees what it held.
fn serve(
    mut stream: TcpStream,
    backend: Arc<MemoryBackend>,
    version: ProtocolVersion,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let dialect = version.dialect().expect("a version we speak");
    let (session, dispatcher) = (
        ServerSessionConfig::new(dialect),
        DispatcherConfig::new(version),
    );
    let mut conn =
        Connection::new(backend, &session, &dispatcher, true).map_err(io::Error::other)?;
    loop {
        // This thread serves no one else, so heavy work runs right here.
        let action = match conn.poll(Place::Blocking) {
            Ok(action) => action,
            Err(error) => {
                write_out(&mut stream, &mut conn)?; // responses owed before the error
                return Err(io::Error::other(error));
            }
        };
        match action {
            Action::Transmit => write_out(&mut stream, &mut conn)?,
            Action::Offload => {} // not returned on Place::Blocking
            Action::Comm(CommWork::Init(request)) => conn
                .comm_init_done(request.device, false)
                .map_err(io::Error::other)?,
            // No server-to-server sockets here: a remote copy's peer is unreachable (only
            // offered with `DispatcherConfig::remote_copy`, which this example leaves off).
            Action::Comm(CommWork::RemoteCopy(_)) => conn
                .remote_copy_done(proto_core::wire::RemoteCopyStatus::PeerUnreachable)
                .map_err(io::Error::other)?,
            Action::Comm(_) => {}
            // TCP only: all-zero caps (only asked with `negotiate_transport`, left off here).
            Action::Upgrade(_) => conn.answer_hello([0; 24]).map_err(io::Error::other)?,
            Action::SendInPlace => {
                // Straight from backend memory to the socket.
                let mut failed = None;
                conn.send_in_place(&mut |src| {
                    stream.write(src).unwrap_or_else(|e| {
                        failed = Some(e);
                        0
                    })
                })
                .map_err(io::Error::other)?;
                if let Some(error) = failed {
                    return Err(error);
                }
            }
            Action::Receive(receive) => {
                if let Receive::Stream { in_place: true, .. } = receive {
                    // Tensor data straight from the socket into backend memory.
                    let mut got = Ok(0);
                    conn.receive_in_place(&mut |dst| {
                        got = stream.read(dst);
                        *got.as_ref().unwrap_or(&0)
                    })
                    .map_err(io::Error::other)?;
                    match got? {
                        0 => return conn.handle_eof().map_err(io::Error::other),
                        _ => continue,
                    }
                }
                // A fresh buffer each read: the connection keeps slices of it.
                let want = match receive {
                    Receive::Stream { remaining, .. } => remaining.min(8 << 20) as usize,
                    Receive::Idle => 64 << 10,
                };
                let mut chunk = vec![0u8; want];
                let n = stream.read(&mut chunk)?;
                if n == 0 {
                    return conn.handle_eof().map_err(io::Error::other);
                }
                chunk.truncate(n);
                conn.handle_input(Bytes::from(chunk));
            }
        }
    }
}

/// Writes out every queued transmit with vectored writes straight from its `Bytes`.
fn write_out(stream: &mut TcpStream, conn: &mut Connection<MemoryBackend>) -> io::Result<()> {
    let mut queue: Vec<Bytes> = std::iter::from_fn(|| conn.poll_transmit()).collect();
    while !queue.is_empty() {
        let slices: Vec<IoSlice<'_>> = queue.iter().map(|b| IoSlice::new(b)).collect();
        let mut written = stream.write_vectored(&slices)?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while written > 0 && !queue.is_empty() {
            let step = written.min(queue[0].len());
            let _ = queue[0].split_to(step);
            written -= step;
            if queue[0].is_empty() {
                queue.remove(0);
            }
        }
    }
    Ok(())
}
