//! The loopback ceiling of the 256 MiB transfers: the same bytes moved over a loopback TCP
//! connection between the same kind of client (tokio, header then one write of the whole
//! buffer; reads into a reused buffer) and a peer that does nothing but move them (a blocking
//! `recv` into a reused buffer of the full size, one `send` from memory). No server can move
//! a tensor faster than this on the same machine, so it says how far a server is from the
//! best possible, and whether a ratio to the reference is reachable at all here.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::BoxError;

/// The request: what to do (`0` receive, `1` send) and how many bytes.
const RECEIVE: u8 = 0;
const SEND: u8 = 1;

/// GB/s of the best of `repeat` client → peer and peer → client transfers of `data`.
pub async fn loopback(data: &Bytes, repeat: usize) -> Result<(f64, f64), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let len = data.len();
    let peer = std::thread::spawn(move || -> Result<(), BoxError> {
        let (mut socket, _) = listener.accept()?;
        socket.set_nodelay(true)?;
        // Touched before the first transfer, as a server's tensor buffer is.
        let mut buffer = vec![1u8; len];
        let mut request = [0u8; 9];
        loop {
            match socket.read_exact(&mut request) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(error) => return Err(error.into()),
            }
            let n = usize::try_from(u64::from_le_bytes(request[1..].try_into()?))?;
            let region = buffer
                .get_mut(..n)
                .ok_or("request larger than the buffer")?;
            match request[0] {
                RECEIVE => {
                    socket.read_exact(region)?;
                    socket.write_all(&[1])?;
                }
                SEND => socket.write_all(region)?,
                other => return Err(format!("unknown request {other}").into()),
            }
        }
    });
    let mut socket = tokio::net::TcpStream::connect(addr).await?;
    socket.set_nodelay(true)?;
    let mut back = vec![0u8; len];
    let (mut set, mut get) = (0f64, 0f64);
    for _ in 0..repeat.max(1) {
        let start = Instant::now();
        socket.write_all(&request(RECEIVE, len)).await?;
        socket.write_all(data).await?;
        let mut ack = [0u8; 1];
        socket.read_exact(&mut ack).await?;
        set = set.max(crate::gbps(len, start.elapsed()));
        let start = Instant::now();
        socket.write_all(&request(SEND, len)).await?;
        socket.read_exact(&mut back).await?;
        get = get.max(crate::gbps(len, start.elapsed()));
        if back[..4096] != data[..4096] {
            return Err("the peer sent back other data".into());
        }
    }
    drop(socket);
    peer.join().map_err(|_| "loopback peer panicked")??;
    Ok((set, get))
}

fn request(kind: u8, len: usize) -> [u8; 9] {
    let mut request = [kind; 9];
    request[1..].copy_from_slice(&(len as u64).to_le_bytes());
    request
}
