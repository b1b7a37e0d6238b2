//! The receive low-water mark (`SO_RCVLOWAT`) of a socket while a bulk payload streams in.
//!
//! A reader that keeps up with its sender wakes for every burst of segments: about 140 KiB a
//! `recv` on loopback, each wake an `epoll_wait`, a context switch and a window update the
//! sender must process. With the mark raised the socket reports readable only once a sizeable
//! piece is queued, so a 256 MiB payload takes a few hundred `recv`s instead of tens of
//! thousands (measured: a GET_TENSOR of 256 MiB went from 38,683 `recv`s to 1,353, and the
//! client's context switches from 16,365 to 1,516).
//!
//! The mark never exceeds the payload bytes still owed, so the payload alone always wakes the
//! reader; and it goes back to one byte before the next message is awaited, or a short command
//! would never wake it. Linux also caps the mark at half the largest receive buffer and grows
//! the buffer to hold it, so a mark cannot wait for more than the socket can queue.
//!
//! The client library uses it for large replies. The servers do not: raised on a server's
//! socket for a 256 MiB SET_TENSOR, it made the next GET_TENSOR on that socket slower (3.9-5.2
//! against 4.7-5.8 GB/s, tokio shell, interleaved runs), more than the write gained.

use std::io;

/// Payloads (or what is left of them) below this size are read with the default mark.
pub const BULK_MIN: u64 = 1 << 20;
/// The highest mark set: 4 MiB (Linux lowers it to `tcp_rmem[2] / 2` where that is less).
pub const BULK_MARK: u64 = 4 << 20;

/// The mark a socket has while one payload streams in; one per connection.
#[derive(Debug, Default)]
pub struct LowWater {
    /// The mark last set; 0 or 1: the default.
    current: u64,
}

impl LowWater {
    /// Sets the mark for a payload with `remaining` bytes still to come: up to [`BULK_MARK`]
    /// for a bulk payload, never above `remaining`. Only changes cost a system call.
    pub fn expect<S: SocketFd + ?Sized>(&mut self, socket: &S, remaining: u64) -> io::Result<()> {
        let target = if remaining >= BULK_MIN {
            remaining.min(BULK_MARK)
        } else if self.current > 1 {
            // Lowered to what is left: one wake for the tail.
            remaining.max(1)
        } else {
            return Ok(());
        };
        self.set(socket, target)
    }

    /// Back to the default mark of one byte (before the next message is awaited).
    pub fn reset<S: SocketFd + ?Sized>(&mut self, socket: &S) -> io::Result<()> {
        if self.current > 1 {
            self.set(socket, 1)?;
        }
        Ok(())
    }

    /// Whether a mark above the default is set.
    pub fn raised(&self) -> bool {
        self.current > 1
    }

    fn set<S: SocketFd + ?Sized>(&mut self, socket: &S, mark: u64) -> io::Result<()> {
        if mark == self.current {
            return Ok(());
        }
        let bytes = i32::try_from(mark).unwrap_or(i32::MAX);
        socket.set_receive_low_water(bytes)?;
        self.current = mark;
        Ok(())
    }
}

/// A socket whose receive low-water mark can be set.
pub trait SocketFd {
    /// Sets `SO_RCVLOWAT` to `bytes`.
    fn set_receive_low_water(&self, bytes: i32) -> io::Result<()>;
}

#[cfg(unix)]
impl<T: std::os::fd::AsFd + ?Sized> SocketFd for T {
    fn set_receive_low_water(&self, bytes: i32) -> io::Result<()> {
        set_rcvlowat(self.as_fd(), bytes)
    }
}

/// `setsockopt(SOL_SOCKET, SO_RCVLOWAT)`: no crate of the dependency set wraps this option.
#[cfg(unix)]
#[allow(unsafe_code)]
fn set_rcvlowat(fd: std::os::fd::BorrowedFd<'_>, bytes: i32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let value: libc::c_int = bytes;
    // SAFETY: `fd` is a descriptor borrowed for the call; `value` is a live `c_int` and the
    // length passed is exactly its size, which is what SO_RCVLOWAT reads.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            std::ptr::from_ref(&value).cast::<libc::c_void>(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// The mark the kernel holds for `socket`.
    fn mark(socket: &TcpStream) -> i32 {
        use std::os::fd::AsRawFd;
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a live socket, `value` and `len` are live and sized for SO_RCVLOWAT.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                std::ptr::from_mut(&mut value).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        value
    }

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    #[test]
    fn the_mark_follows_the_payload_and_returns_to_one_byte() {
        let (_peer, socket) = pair();
        let mut water = LowWater::default();
        water.expect(&socket, 100).unwrap();
        assert_eq!(mark(&socket), 1, "a small payload keeps the default");
        water.expect(&socket, 256 << 20).unwrap();
        assert!(water.raised());
        let bulk = mark(&socket);
        assert!(bulk > 1 && bulk as u64 <= BULK_MARK, "{bulk}");
        water.expect(&socket, BULK_MIN + 7).unwrap();
        assert!(mark(&socket) as u64 <= BULK_MIN + 7);
        water.expect(&socket, 5000).unwrap();
        assert_eq!(mark(&socket), 5000, "never above what is still owed");
        water.reset(&socket).unwrap();
        assert_eq!(mark(&socket), 1);
        assert!(!water.raised());
    }

    /// Whether `socket` polls readable within 100 ms (what an epoll-driven runtime sees).
    fn readable(socket: &TcpStream) -> bool {
        use std::os::fd::AsRawFd;
        let mut fds = libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live `pollfd` for a live socket, and the count passed is one.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::poll(&mut fds, 1, 100) };
        assert!(rc >= 0);
        rc == 1
    }

    #[test]
    fn a_raised_mark_holds_readiness_until_enough_bytes_are_queued() {
        let (mut peer, mut socket) = pair();
        let mut water = LowWater::default();
        water.expect(&socket, 2 << 20).unwrap();
        peer.write_all(&[7; 1000]).unwrap();
        assert!(!readable(&socket), "readable below the mark");
        // Lowered to the bytes that are there, the socket is readable with them.
        water.expect(&socket, 1000).unwrap();
        assert!(readable(&socket));
        let mut buf = vec![0u8; 4096];
        assert_eq!(socket.read(&mut buf).unwrap(), 1000);
        // Back at one byte, a one-byte message wakes the reader.
        water.reset(&socket).unwrap();
        peer.write_all(&[1]).unwrap();
        assert!(readable(&socket));
        assert_eq!(socket.read(&mut buf).unwrap(), 1);
    }
}
