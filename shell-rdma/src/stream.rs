//! [`RdmaStream`]: a byte stream over one activated queue pair, as the reference's
//! `rdma_send` / `rdma_recv` with the newest receive path (a completion may be consumed
//! partially) and bounded waits.

use std::time::{Duration, Instant};

use crate::verbs::{
    Completion, Cq, Verbs, VerbsError, Wake, IDLE_CHECK_POLLS, LIVENESS_CHECK_POLLS, RDMA_CHUNK,
    RDMA_RX_DEPTH, RDMA_SPIN_TIME,
};

/// How long a failed receive waits for the peer's TCP hang-up before it counts as an error
/// rather than the peer's close.
const HANG_UP_GRACE: Duration = Duration::from_millis(200);

/// Why the RDMA stream failed; the connection ends.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// A work completion failed (the reference logs "RDMA CQ wc error").
    #[error("RDMA CQ wc error: {status} ({cq:?} CQ)")]
    Completion {
        /// Which queue.
        cq: Cq,
        /// `ibv_wc_status_str`.
        status: String,
    },
    /// A receive completion no slot can hold or with a slot id we never posted.
    #[error("RDMA recv overrun: got={got} in slot {slot}")]
    Overrun {
        /// Bytes the completion claims.
        got: u32,
        /// Its `wr_id`.
        slot: u64,
    },
    /// The peer's TCP socket hung up.
    #[error("the peer went away (TCP socket hung up)")]
    PeerGone,
    /// The peer did not take or deliver the bytes owed in time.
    #[error("the peer stalled for {0:?} in the middle of a transfer")]
    Stalled(Duration),
}

/// How long the stream spins and how long it waits for a peer mid-transfer.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Idle time before the poller arms the CQ and sleeps ([`RDMA_SPIN_TIME`]).
    pub spin: Duration,
    /// The longest wait for the peer in the middle of a transfer: for a SEND's completion (an
    /// RC peer that never re-posts its slots makes the hardware retry for ever, "RNR retry
    /// 7") and for data a message still owes.
    pub stall: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            spin: RDMA_SPIN_TIME,
            stall: Duration::from_secs(120),
        }
    }
}

/// One connection's RDMA byte stream.
pub struct RdmaStream<V: Verbs> {
    verbs: V,
    timing: Timing,
    /// The slot being read (the flags change's `rx_cur`), its bytes taken and its length.
    rx_cur: Option<usize>,
    rx_off: usize,
    rx_len: usize,
    last_active: Instant,
}

impl<V: Verbs> std::fmt::Debug for RdmaStream<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("rx_cur", &self.rx_cur)
            .field("rx_off", &self.rx_off)
            .field("rx_len", &self.rx_len)
            .finish_non_exhaustive()
    }
}

impl<V: Verbs> RdmaStream<V> {
    /// A stream over an activated queue pair whose [`RDMA_RX_DEPTH`] slots are posted.
    pub fn new(verbs: V, timing: Timing) -> RdmaStream<V> {
        RdmaStream {
            verbs,
            timing,
            rx_cur: None,
            rx_off: 0,
            rx_len: 0,
            last_active: Instant::now(),
        }
    }

    /// The bound on a wait for the peer mid-transfer.
    pub fn stall(&self) -> Duration {
        self.timing.stall
    }

    /// The queue pair (tests inspect the mock).
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    /// The queue pair, mutably (tests make the mock misbehave).
    pub fn verbs_mut(&mut self) -> &mut V {
        &mut self.verbs
    }

    /// Sends one transport-level write: SENDs of at most [`RDMA_CHUNK`] bytes, each signalled
    /// and waited for before the next (stop-and-wait). The caller decides where writes begin
    /// and end ([`crate::framing`]), because older receivers need every SEND inside one read.
    pub fn send(&mut self, data: &[u8]) -> Result<(), StreamError> {
        for piece in data.chunks(RDMA_CHUNK) {
            self.verbs.post_send(piece)?;
            self.last_active = Instant::now();
            match self.wait(Cq::Send, self.timing.stall)? {
                Some(done) => {
                    done.status.map_err(|status| StreamError::Completion {
                        cq: Cq::Send,
                        status,
                    })?;
                }
                None => return Err(StreamError::Stalled(self.timing.stall)),
            }
        }
        Ok(())
    }

    /// Whether bytes of a received completion are waiting (a read returns without waiting).
    pub fn has_buffered(&self) -> bool {
        self.rx_cur.is_some()
    }

    /// Reads at most `buf.len()` bytes: from the open slot, or from the next completion,
    /// waiting at most `within` for it. `Ok(None)`: nothing arrived in time.
    pub fn recv(&mut self, buf: &mut [u8], within: Duration) -> Result<Option<usize>, StreamError> {
        if buf.is_empty() {
            return Ok(Some(0));
        }
        let slot = match self.rx_cur {
            Some(slot) => slot,
            None => {
                let Some(done) = self.wait(Cq::Recv, within)? else {
                    return Ok(None);
                };
                let got = match done.status {
                    Ok(got) => got,
                    // A peer that destroys its QP flushes ours; its TCP socket closes with it.
                    Err(_) if self.peer_hung_up(HANG_UP_GRACE)? => {
                        return Err(StreamError::PeerGone)
                    }
                    Err(status) => {
                        return Err(StreamError::Completion {
                            cq: Cq::Recv,
                            status,
                        })
                    }
                };
                let slot = usize::try_from(done.wr_id)
                    .ok()
                    .filter(|&s| s < RDMA_RX_DEPTH)
                    .ok_or(StreamError::Overrun {
                        got,
                        slot: done.wr_id,
                    })?;
                let len = got as usize;
                if len > RDMA_CHUNK {
                    // A device cannot place more than the slot; a provider that claims so is
                    // not trusted with a read past the ring.
                    let _ = self.verbs.post_recv(slot);
                    return Err(StreamError::Overrun {
                        got,
                        slot: done.wr_id,
                    });
                }
                if len == 0 {
                    // A zero-length SEND carries nothing; the slot goes straight back.
                    self.verbs.post_recv(slot)?;
                    return Ok(Some(0));
                }
                self.rx_cur = Some(slot);
                self.rx_off = 0;
                self.rx_len = len;
                slot
            }
        };
        let take = buf.len().min(self.rx_len - self.rx_off);
        self.verbs
            .copy_from_slot(slot, self.rx_off, &mut buf[..take]);
        self.rx_off += take;
        if self.rx_off == self.rx_len {
            self.rx_cur = None;
            self.verbs.post_recv(slot)?;
        }
        Ok(Some(take))
    }

    /// Whether the peer's TCP socket hangs up within `grace` (checked every 10 ms).
    fn peer_hung_up(&mut self, grace: Duration) -> Result<bool, StreamError> {
        let start = Instant::now();
        loop {
            if !self.verbs.peer_alive()? {
                return Ok(true);
            }
            if start.elapsed() >= grace {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Reads exactly `buf.len()` bytes, each wait bounded by `within`.
    pub fn recv_exact(&mut self, buf: &mut [u8], within: Duration) -> Result<(), StreamError> {
        let mut at = 0;
        while at < buf.len() {
            match self.recv(&mut buf[at..], within)? {
                Some(n) => at += n,
                None => return Err(StreamError::Stalled(within)),
            }
        }
        Ok(())
    }

    /// One completion from `cq`: spins while the connection was active within the spin
    /// time, then arms the CQ (polling once more: a completion before arming raises no event)
    /// and sleeps on the channel and the TCP socket. `Ok(None)` after `within`.
    fn wait(&mut self, cq: Cq, within: Duration) -> Result<Option<Completion>, StreamError> {
        let start = Instant::now();
        let mut armed = false;
        let mut polls: u64 = 0;
        loop {
            if let Some(done) = self.verbs.poll(cq)? {
                self.last_active = Instant::now();
                return Ok(Some(done));
            }
            polls += 1;
            if armed {
                let left = within.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Ok(None);
                }
                match self.verbs.sleep(left)? {
                    Wake::HangUp => return Err(StreamError::PeerGone),
                    Wake::Event | Wake::Timeout => {}
                }
                armed = false;
                continue;
            }
            if polls.is_multiple_of(IDLE_CHECK_POLLS) {
                let now = Instant::now();
                if now.duration_since(start) >= within {
                    return Ok(None);
                }
                if now.duration_since(self.last_active) > self.timing.spin {
                    self.verbs.arm(cq)?;
                    armed = true;
                    continue;
                }
            }
            if polls.is_multiple_of(LIVENESS_CHECK_POLLS) && !self.verbs.peer_alive()? {
                return Err(StreamError::PeerGone);
            }
        }
    }
}
