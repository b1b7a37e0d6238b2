//! The kit's side of a connection: blocking `std::net` with a deadline on every wait, as a
//! [`SessionTarget`] the vectors' replay drives, and the server probe / liveness check.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ggml_rpc_tests::check::{FinalReaction, SessionTarget};
use ggml_rpc_tests::harness::expected_response_len;
use proto_core::wire::{Dialect, Request};

/// A wait on the server that did not end well.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// Nothing came within the timeout.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// The server closed (or reset) the connection.
    #[error("the server closed the connection ({0})")]
    Closed(String),
    /// The connection could not be opened.
    #[error("cannot connect: {0}")]
    Connect(String),
}

/// Opens a connection within `timeout` (no Nagle delay: the cases are many small frames).
pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, WaitError> {
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| WaitError::Connect(e.to_string()))?;
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| WaitError::Connect(e.to_string()))?;
    Ok(stream)
}

fn is_timeout(error: &std::io::Error) -> bool {
    matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Writes everything; a write that stalls past the socket's write timeout is a timeout.
pub fn write_all(stream: &mut TcpStream, bytes: &[u8], timeout: Duration) -> Result<(), WaitError> {
    stream.write_all(bytes).map_err(|e| {
        if is_timeout(&e) {
            WaitError::TimedOut(timeout)
        } else {
            WaitError::Closed(e.to_string())
        }
    })
}

/// Reads exactly `n` bytes before `timeout` has passed.
pub fn read_exact(
    stream: &mut TcpStream,
    n: usize,
    timeout: Duration,
) -> Result<Vec<u8>, WaitError> {
    let deadline = Instant::now() + timeout;
    let mut out = vec![0; n];
    let mut filled = 0;
    while filled < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(WaitError::TimedOut(timeout));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| WaitError::Closed(e.to_string()))?;
        match stream.read(&mut out[filled..]) {
            Ok(0) => return Err(WaitError::Closed(format!("after {filled} of {n} bytes"))),
            Ok(got) => filled += got,
            Err(e) if is_timeout(&e) => return Err(WaitError::TimedOut(timeout)),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(WaitError::Closed(e.to_string())),
        }
    }
    Ok(out)
}

/// Bytes that already arrived, without waiting (what a server sent beyond its answer).
fn read_pending(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    if stream.set_nonblocking(true).is_err() {
        return out;
    }
    let mut buf = [0u8; 4096];
    while let Ok(got @ 1..) = stream.read(&mut buf) {
        out.extend_from_slice(&buf[..got]);
    }
    let _ = stream.set_nonblocking(false);
    out
}

/// Sends `request` and reads its whole answer (`None` for a command without one).
pub fn call(
    stream: &mut TcpStream,
    dialect: Dialect,
    request: &Request,
    timeout: Duration,
) -> Result<Vec<u8>, WaitError> {
    let frame = request
        .to_frame(dialect)
        .map_err(|e| WaitError::Closed(format!("cannot encode {request:?}: {e}")))?;
    write_all(stream, &frame, timeout)?;
    match expected_response_len(request) {
        // The answer is the 8-byte size and the payload.
        Some(len) => read_exact(stream, 8 + len as usize, timeout),
        None => Ok(Vec::new()),
    }
}

/// What HELLO and DEVICE_COUNT tell about a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerFacts {
    /// Major, minor, patch of its HELLO answer.
    pub version: (u8, u8, u8),
    /// Byte 3 of its HELLO answer (flags in the newest change, bit 7 our extensions).
    pub hello_flags: u8,
    /// Its devices.
    pub devices: u32,
}

/// HELLO (zero caps) and DEVICE_COUNT on a fresh connection, closed afterwards (llama.cpp's
/// server serves one client at a time).
pub fn probe(addr: SocketAddr, timeout: Duration) -> Result<ServerFacts, WaitError> {
    let mut stream = connect(addr, timeout)?;
    // HELLO and DEVICE_COUNT have the same layout in both dialects.
    let hello = call(
        &mut stream,
        Dialect::V8,
        &Request::Hello { caps: [0; 24] },
        timeout,
    )?;
    let count = call(&mut stream, Dialect::V8, &Request::DeviceCount, timeout)?;
    let _ = stream.shutdown(Shutdown::Both);
    Ok(ServerFacts {
        version: (hello[8], hello[9], hello[10]),
        hello_flags: hello[11],
        devices: u32::from_le_bytes([count[8], count[9], count[10], count[11]]),
    })
}

/// The vectors' [`SessionTarget`] over a socket; remembers how a failed wait ended, which
/// decides between "refused" and "hung".
pub struct SocketTarget {
    stream: TcpStream,
    timeout: Duration,
    /// The last failed wait.
    pub failure: Option<WaitError>,
    /// Whether every step succeeded and the final bytes were sent.
    pub reached_final: bool,
}

impl SocketTarget {
    /// A fresh connection.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<SocketTarget, WaitError> {
        Ok(SocketTarget {
            stream: connect(addr, timeout)?,
            timeout,
            failure: None,
            reached_final: false,
        })
    }

    /// The connection, for checks after the replay.
    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    fn fail(&mut self, error: WaitError) -> String {
        let text = error.to_string();
        self.failure = Some(error);
        text
    }
}

impl SessionTarget for SocketTarget {
    fn exchange(&mut self, bytes: &[u8], reply_len: usize) -> Result<Vec<u8>, String> {
        if let Err(e) = write_all(&mut self.stream, bytes, self.timeout) {
            return Err(self.fail(e));
        }
        if reply_len == 0 {
            // A command without an answer (SET_TENSOR, GRAPH_COMPUTE, ...): a DEVICE_COUNT
            // behind it shows the server took it, rather than closing, which the next step
            // would only show later, or an invalid session's final frame would take for its
            // own refusal.
            return match call(
                &mut self.stream,
                Dialect::V8,
                &Request::DeviceCount,
                self.timeout,
            ) {
                Ok(_) => Ok(read_pending(&mut self.stream)),
                Err(e) => Err(format!("after this step, DEVICE_COUNT: {}", self.fail(e))),
            };
        }
        let mut out = match read_exact(&mut self.stream, reply_len, self.timeout) {
            Ok(out) => out,
            Err(e) => return Err(self.fail(e)),
        };
        out.extend(read_pending(&mut self.stream));
        Ok(out)
    }

    fn finish(&mut self, bytes: &[u8], eof: bool) -> FinalReaction {
        self.reached_final = true;
        match write_all(&mut self.stream, bytes, self.timeout) {
            Ok(()) => {}
            // Closed while we were still writing: it refused from the bytes it had.
            Err(WaitError::Closed(_) | WaitError::Connect(_)) => {
                return FinalReaction::Failed(None)
            }
            Err(e) => {
                self.failure = Some(e);
                return FinalReaction::Waiting;
            }
        }
        if eof {
            let _ = self.stream.shutdown(Shutdown::Write);
        } else if let Ok(probe) = Request::DeviceCount.to_frame(Dialect::V8) {
            // Tells "accepted the frame and serves on" (DEVICE_COUNT answers at once) from
            // "waits for the rest of a frame it should have refused" (the probe is swallowed
            // as payload) without waiting out the timeout for the first.
            let _ = write_all(&mut self.stream, &probe, self.timeout);
        }
        let _ = self.stream.set_read_timeout(Some(self.timeout));
        let mut buf = [0u8; 4096];
        match self.stream.read(&mut buf) {
            Ok(0) => FinalReaction::Failed(None),
            Ok(got) => {
                let mut out = buf[..got].to_vec();
                out.extend(read_pending(&mut self.stream));
                FinalReaction::Answered(out)
            }
            Err(e) if is_timeout(&e) => {
                self.failure = Some(WaitError::TimedOut(self.timeout));
                FinalReaction::Waiting
            }
            Err(_) => FinalReaction::Failed(None),
        }
    }
}

/// Whether the server still serves: a fresh connection completes HELLO and DEVICE_COUNT.
pub fn alive(addr: SocketAddr, timeout: Duration) -> Result<(), WaitError> {
    probe(addr, timeout).map(|_| ())
}
