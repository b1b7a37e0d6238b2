//! A hostile RDMA client (`scripts/conformance/rdma_ours.sh` runs it against our server on the
//! verbs fabric): HELLO with caps, the switch, then one SEND longer than any receive slot
//! (256 KiB + 1 byte by default). Exits 0 once the server closed the connection (its TCP
//! socket ends) within 30 s, with an error otherwise.
//!
//! usage: rdma_overrun HOST:PORT [BYTES]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use shell_rdma::{RdmaCaps, TransportMode, CAPS_LEN, RDMA_CHUNK};

/// HELLO's command id.
const HELLO: u8 = 14;
/// HELLO's answer: major, minor, patch, flags, then the caps.
const ANSWER_LEN: usize = 4 + CAPS_LEN;
const VERDICT_WAIT: Duration = Duration::from_secs(30);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().ok_or("usage: rdma_overrun HOST:PORT [BYTES]")?;
    let len: usize = args.next().map_or(Ok(RDMA_CHUNK + 1), |s| s.parse())?;
    let mut tcp = TcpStream::connect(&endpoint)?;
    tcp.set_read_timeout(Some(VERDICT_WAIT))?;
    let local = tcp.local_addr()?.ip();
    let (caps, prepared) = shell_rdma::client::offer(TransportMode::Rdma, local)?;
    let prepared = prepared.ok_or("no RDMA device for this connection")?;

    let mut hello = vec![HELLO];
    hello.extend_from_slice(&(CAPS_LEN as u64).to_le_bytes());
    hello.extend_from_slice(&caps);
    tcp.write_all(&hello)?;
    let mut size = [0u8; 8];
    tcp.read_exact(&mut size)?;
    if u64::from_le_bytes(size) != ANSWER_LEN as u64 {
        return Err(format!("HELLO's answer has {} bytes", u64::from_le_bytes(size)).into());
    }
    let mut answer = [0u8; ANSWER_LEN];
    tcp.read_exact(&mut answer)?;
    let mut server = [0u8; CAPS_LEN];
    server.copy_from_slice(&answer[4..]);
    let server = RdmaCaps::decode(&server).ok_or("the server offered no RDMA")?;
    let mut qp = prepared.activate(server, tcp.as_fd().try_clone_to_owned()?)?;

    qp.post_oversized_send(len)?;
    println!("sent one SEND of {len} bytes");
    // The server's verdict: it closes the connection.
    let start = Instant::now();
    let mut byte = [0u8; 1];
    match tcp.read(&mut byte) {
        Ok(0) => {}
        Err(error) if error.kind() == ErrorKind::ConnectionReset => {}
        Ok(_) => return Err("the server sent bytes over TCP after the switch".into()),
        Err(error) => {
            return Err(format!("the server kept the connection open: {error}").into());
        }
    }
    println!(
        "the server closed the connection after {:?}",
        start.elapsed()
    );
    Ok(())
}
