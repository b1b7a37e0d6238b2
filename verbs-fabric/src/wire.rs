//! The fabric between processes: each QP listens on `<dir>/qp-<qpn>.sock`; at RTR it connects to
//! the peer QP's socket. Each connection carries one direction's SENDs and their acknowledgements:
//!
//! * connector → acceptor: HELLO (magic, src qpn, dst qpn, src gid, dst gid), 44 bytes;
//! * acceptor → connector: READY (1 byte) once the acceptor's QP is in RTR towards that address;
//! * connector → acceptor: SEND header (u32 LE length, u32 reserved) + payload;
//! * acceptor → connector: ACK (1 byte: 0 ok, 1 receive too small, 2 receive protection error)
//!   once the SEND landed in a posted receive. No receive posted = no ACK yet (RNR retry forever).
use crate::error::{FabricError, Result};
use crate::ffi::*;
use crate::qp::{QpInner, Remote, SendWr};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAGIC: u32 = 0x5646_4231; // "VFB1"
const READY: u8 = 0x52;
const ACK_OK: u8 = 0;
const ACK_LEN: u8 = 1;
const ACK_PROT: u8 = 2;
const DISCARD_CHUNK: usize = 64 * 1024;
const SUN_PATH_MAX: usize = 107;

pub fn sock_path(dir: &Path, qpn: u32) -> PathBuf {
    dir.join(format!("qp-{qpn:06x}.sock"))
}

/// How long a send waits for the peer QP to exist and reach RTR: `$GGML_VERBS_FABRIC_TIMEOUT_MS`,
/// default 10 s.
pub fn peer_timeout() -> Duration {
    let ms = std::env::var("GGML_VERBS_FABRIC_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok());
    Duration::from_millis(ms.unwrap_or(10_000))
}

fn random_u32() -> u32 {
    let mut v = 0u32;
    // SAFETY: getrandom writes at most 4 bytes into the local.
    let n = unsafe { libc::getrandom((&mut v as *mut u32).cast(), 4, 0) };
    if n != 4 {
        // Fallback: pid and time are distinct enough for a retry loop that checks bind().
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        v = std::process::id().wrapping_mul(2_654_435_761) ^ t.subsec_nanos();
    }
    v
}

/// Picks a QPN unique among all processes sharing `dir` by binding its socket; stale sockets
/// (nobody listening) are replaced.
pub fn bind_qpn(dir: &Path) -> Result<(u32, UnixListener, PathBuf)> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o777)
        .create(dir)?;
    for _ in 0..256 {
        let qpn = random_u32() & 0xff_ffff;
        if qpn < 2 {
            continue;
        }
        let path = sock_path(dir, qpn);
        if path.as_os_str().len() > SUN_PATH_MAX {
            return Err(FabricError::PathTooLong);
        }
        match UnixListener::bind(&path) {
            Ok(l) => return Ok((qpn, l, path)),
            Err(e) if e.kind() == ErrorKind::AddrInUse => {
                if let Err(ce) = UnixStream::connect(&path) {
                    if ce.kind() == ErrorKind::ConnectionRefused {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(FabricError::NoQpn)
}

fn hello(src: u32, dst: u32, src_gid: &ibv_gid, dst_gid: &ibv_gid) -> [u8; 44] {
    let mut b = [0u8; 44];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&src.to_le_bytes());
    b[8..12].copy_from_slice(&dst.to_le_bytes());
    b[12..28].copy_from_slice(&src_gid.raw);
    b[28..44].copy_from_slice(&dst_gid.raw);
    b
}

/// A connection that is shut down when dropped, even while `QpState::streams` holds a clone of
/// its descriptor: the peer must see EOF as soon as this side gives the connection up.
struct Conn(UnixStream);

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

impl std::ops::Deref for Conn {
    type Target = UnixStream;
    fn deref(&self) -> &UnixStream {
        &self.0
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut UnixStream {
        &mut self.0
    }
}

fn register(qp: &QpInner, s: &UnixStream) -> bool {
    let mut st = qp.lock();
    if qp.stop.load(Ordering::Acquire) {
        return false;
    }
    if let Ok(c) = s.try_clone() {
        st.streams.push(c);
    }
    true
}

/// True if the peer closed or sent something before READY (it never should): drop the connection.
fn peer_hung_up(s: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd on a descriptor we own, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// Acceptor thread: takes the inbound connection of the peer QP, then delivers its SENDs.
pub fn run_acceptor(qp: Arc<QpInner>, listener: UnixListener) {
    for conn in listener.incoming() {
        if qp.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(s) = conn else { continue };
        let mut s = Conn(s);
        if !register(&qp, &s) {
            return;
        }
        let mut h = [0u8; 44];
        let _ = s.set_read_timeout(Some(qp.timeout));
        if s.read_exact(&mut h).is_err() {
            continue;
        }
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let mut src_gid = ibv_gid::default();
        src_gid.raw.copy_from_slice(&h[12..28]);
        let mut dst_gid = ibv_gid::default();
        dst_gid.raw.copy_from_slice(&h[28..44]);
        if word(0) != MAGIC || word(8) != qp.qpn || !qp.gids.iter().any(|g| g.gid == dst_gid) {
            continue;
        }
        let from = Remote {
            qpn: word(4),
            gid: src_gid,
        };
        // Wait until our QP is in RTR (or later) towards exactly that address.
        let ok = loop {
            let st = qp.lock();
            if qp.stop.load(Ordering::Acquire) {
                return;
            }
            if matches!(st.state, IBV_QPS_RTR | IBV_QPS_RTS) && st.remote.is_some() {
                break st.remote == Some(from);
            }
            if st.state == IBV_QPS_ERR {
                break false;
            }
            let _ = qp.cv.wait_timeout(st, Duration::from_millis(50));
            if peer_hung_up(&s) {
                break false;
            }
        };
        if !ok || s.set_read_timeout(None).is_err() || s.write_all(&[READY]).is_err() {
            continue;
        }
        deliver(&qp, s, from.qpn);
        return;
    }
}

fn discard(s: &mut UnixStream, mut len: usize) -> std::io::Result<()> {
    let mut buf = vec![0u8; DISCARD_CHUNK.min(len)];
    while len > 0 {
        let n = len.min(buf.len());
        s.read_exact(&mut buf[..n])?;
        len -= n;
    }
    Ok(())
}

/// Receives SENDs into posted receives, in order, until the peer goes away or the QP breaks.
fn deliver(qp: &QpInner, mut s: Conn, src: u32) {
    loop {
        let mut hdr = [0u8; 8];
        if s.read_exact(&mut hdr).is_err() {
            break;
        }
        let len = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
        let wr = {
            let mut st = qp.lock();
            loop {
                if qp.stop.load(Ordering::Acquire) || st.state == IBV_QPS_ERR {
                    return; // dropping the stream fails the peer's send
                }
                if let Some(r) = st.recvs.pop_front() {
                    break r;
                }
                st = qp.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let room: usize = wr.sges.as_ref().map_or(0, |v| v.iter().map(|p| p.1).sum());
        let (status, ack) = match &wr.sges {
            None => (IBV_WC_LOC_PROT_ERR, ACK_PROT),
            Some(_) if len > room => (IBV_WC_LOC_LEN_ERR, ACK_LEN),
            Some(_) => (IBV_WC_SUCCESS, ACK_OK),
        };
        let io = if status == IBV_WC_SUCCESS {
            scatter(&mut s, wr.sges.as_deref().unwrap_or(&[]), len)
        } else {
            discard(&mut s, len)
        };
        if io.is_err() {
            qp.lock().recvs.push_front(wr);
            break;
        }
        let byte_len = if status == IBV_WC_SUCCESS {
            len as u32
        } else {
            0
        };
        // Acknowledge before completing, as a NIC's ACK leaves before the CQE is visible: an
        // application that tears down on seeing the receive must not cut off the sender's ACK.
        let sent = s.write_all(&[ack]);
        qp.complete_recv(wr.wr_id, status, byte_len, src);
        if status != IBV_WC_SUCCESS {
            qp.enter_error(&mut qp.lock());
            return;
        }
        if sent.is_err() {
            break;
        }
    }
    if !qp.stop.load(Ordering::Acquire) {
        qp.enter_error(&mut qp.lock());
    }
}

fn scatter(s: &mut UnixStream, sges: &[(usize, usize)], mut len: usize) -> std::io::Result<()> {
    for &(addr, cap) in sges {
        let n = cap.min(len);
        if n == 0 {
            continue;
        }
        // SAFETY: (addr, cap) lies in a region registered with local-write access that the
        // application keeps alive until this receive completes.
        let dst = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, n) };
        s.read_exact(dst)?;
        len -= n;
    }
    Ok(())
}

/// Fails the send being transmitted and breaks the QP (flushing the rest).
fn fail(qp: &QpInner, cur: Option<&SendWr>, status: u32) {
    let mut st = qp.lock();
    st.in_flight = false;
    if let Some(w) = cur {
        qp.complete_send(w, status);
    } else if let Some(w) = st.sends.pop_front() {
        qp.complete_send(&w, status);
    }
    qp.enter_error(&mut st);
}

fn connect_peer(qp: &QpInner, remote: Remote, sgid: ibv_gid) -> Option<Conn> {
    let deadline = Instant::now() + qp.timeout;
    let path = sock_path(&qp.dir, remote.qpn);
    let mut s = loop {
        if qp.stop.load(Ordering::Acquire) {
            return None;
        }
        match UnixStream::connect(&path) {
            Ok(s) => break Conn(s),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => return None,
        }
    };
    if !register(qp, &s) {
        return None;
    }
    s.write_all(&hello(qp.qpn, remote.qpn, &sgid, &remote.gid))
        .ok()?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).ok()?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).ok()?;
    s.set_read_timeout(None).ok()?;
    (b[0] == READY).then_some(s)
}

/// Sender thread (started at RTR): connects, then transmits queued SENDs one at a time.
pub fn run_sender(qp: Arc<QpInner>, remote: Remote, sgid: ibv_gid) {
    let Some(mut s) = connect_peer(&qp, remote, sgid) else {
        if !qp.stop.load(Ordering::Acquire) {
            // Peer absent or never reached RTR: transport retries exhausted.
            let mut st = qp.lock();
            loop {
                if qp.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(w) = st.sends.pop_front() {
                    qp.complete_send(&w, IBV_WC_RETRY_EXC_ERR);
                    qp.enter_error(&mut st);
                    return;
                }
                if st.state == IBV_QPS_ERR || st.state == IBV_QPS_RESET {
                    return;
                }
                st = qp.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
        return;
    };
    loop {
        let wr = {
            let mut st = qp.lock();
            loop {
                if qp.stop.load(Ordering::Acquire)
                    || matches!(st.state, IBV_QPS_ERR | IBV_QPS_RESET)
                {
                    return;
                }
                if let Some(w) = st.sends.pop_front() {
                    st.in_flight = true;
                    break w;
                }
                st = qp.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let mut hdr = [0u8; 8];
        hdr[..4].copy_from_slice(&(wr.data.len() as u32).to_le_bytes());
        let mut ack = [0u8; 1];
        let io = s
            .write_all(&hdr)
            .and_then(|_| s.write_all(&wr.data))
            .and_then(|_| s.read_exact(&mut ack));
        if qp.stop.load(Ordering::Acquire) {
            return;
        }
        match (io, ack[0]) {
            (Ok(()), ACK_OK) => {
                let mut st = qp.lock();
                st.in_flight = false;
                qp.complete_send(&wr, IBV_WC_SUCCESS);
                qp.cv.notify_all();
            }
            // The responder NAKs a too-small receive as an invalid request; protection likewise.
            (Ok(()), ACK_LEN) => return fail(&qp, Some(&wr), IBV_WC_REM_INV_REQ_ERR),
            (Ok(()), _) => return fail(&qp, Some(&wr), IBV_WC_REM_ACCESS_ERR),
            (Err(_), _) => return fail(&qp, Some(&wr), IBV_WC_RETRY_EXC_ERR),
        }
    }
}

/// Stops a QP's threads and removes its socket; nothing is left behind.
pub fn shutdown(qp: &QpInner) {
    let (streams, sender) = {
        let mut st = qp.lock();
        qp.stop.store(true, Ordering::Release);
        qp.cv.notify_all();
        (std::mem::take(&mut st.streams), st.sender.take())
    };
    for s in &streams {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    // Wakes an acceptor blocked in accept(); it sees `stop` and returns.
    let _ = UnixStream::connect(&qp.sock_path);
    if let Some(h) = sender {
        let _ = h.join();
    }
}
