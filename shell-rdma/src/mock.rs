//! An in-memory RC queue-pair pair with RC semantics that matter to the data path: a SEND
//! completes only once the peer has a slot posted ("receiver not ready" otherwise), a SEND
//! longer than the slot fails on both sides, CQ events only when armed, and a hang-up flag
//! standing for the TCP socket (feature `mock`, and the crate's tests).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::verbs::{Completion, Cq, Verbs, VerbsError, Wake, RDMA_CHUNK, RDMA_RX_DEPTH};

#[derive(Default)]
struct Side {
    slots: Vec<Vec<u8>>,
    posted: VecDeque<usize>,
    /// SENDs from the peer waiting for a posted slot (RNR retries).
    incoming: VecDeque<Vec<u8>>,
    send_cq: VecDeque<Completion>,
    recv_cq: VecDeque<Completion>,
    armed: [bool; 2],
    events: usize,
    /// This side's TCP socket is closed.
    closed: bool,
    sends_posted: usize,
}

struct Fabric {
    sides: [Side; 2],
}

type Shared = Arc<(Mutex<Fabric>, Condvar)>;

/// One end of an in-memory connected queue pair.
pub struct MockVerbs {
    shared: Shared,
    me: usize,
    inline: usize,
}

/// Two connected ends, every receive slot posted.
pub fn pair() -> (MockVerbs, MockVerbs) {
    let side = || Side {
        slots: vec![Vec::new(); RDMA_RX_DEPTH],
        posted: (0..RDMA_RX_DEPTH).collect(),
        ..Side::default()
    };
    let shared: Shared = Arc::new((
        Mutex::new(Fabric {
            sides: [side(), side()],
        }),
        Condvar::new(),
    ));
    (
        MockVerbs {
            shared: shared.clone(),
            me: 0,
            inline: 256,
        },
        MockVerbs {
            shared,
            me: 1,
            inline: 256,
        },
    )
}

fn cq_index(cq: Cq) -> usize {
    match cq {
        Cq::Send => 0,
        Cq::Recv => 1,
    }
}

impl Side {
    fn complete(&mut self, cq: Cq, done: Completion) -> bool {
        match cq {
            Cq::Send => self.send_cq.push_back(done),
            Cq::Recv => self.recv_cq.push_back(done),
        }
        let armed = &mut self.armed[cq_index(cq)];
        if std::mem::take(armed) {
            self.events += 1;
            return true;
        }
        false
    }
}

impl MockVerbs {
    fn lock(&self) -> MutexGuard<'_, Fabric> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes this end's "TCP socket": the peer's sleeps and liveness checks see a hang-up.
    pub fn hang_up(&self) {
        self.lock().sides[self.me].closed = true;
        self.shared.1.notify_all();
    }

    /// Fails the peer's oldest posted receive as a destroyed QP does ("flushed").
    pub fn flush_peer_receive(&self) {
        let mut fabric = self.lock();
        let peer = &mut fabric.sides[1 - self.me];
        let slot = peer.posted.pop_front().unwrap_or_default();
        peer.complete(
            Cq::Recv,
            Completion {
                wr_id: slot as u64,
                status: Err("Work Request Flushed Error".into()),
            },
        );
        drop(fabric);
        self.shared.1.notify_all();
    }

    /// SENDs this end posted so far.
    pub fn sends_posted(&self) -> usize {
        self.lock().sides[self.me].sends_posted
    }

    /// Receive slots posted now.
    pub fn slots_posted(&self) -> usize {
        self.lock().sides[self.me].posted.len()
    }

    /// Posts a SEND of any length, as a hostile peer may (no 256 KiB limit).
    pub fn post_raw(&mut self, data: &[u8]) {
        let mut fabric = self.lock();
        fabric.sides[self.me].sends_posted += 1;
        fabric.sides[1 - self.me].incoming.push_back(data.to_vec());
        deliver(&mut fabric, 1 - self.me);
        drop(fabric);
        self.shared.1.notify_all();
    }
}

impl MockVerbs {
    /// Places `data` in the peer's next posted slot and completes that receive claiming
    /// `claimed` bytes and work request id `wr_id` (`None`: the slot's own), as a broken or
    /// hostile provider might: a length past the slot, a slot never posted. Returns whether a
    /// slot was posted (nothing happens otherwise).
    pub fn complete_peer_receive(&self, data: &[u8], claimed: u32, wr_id: Option<u64>) -> bool {
        let mut fabric = self.lock();
        let peer = &mut fabric.sides[1 - self.me];
        let Some(slot) = peer.posted.pop_front() else {
            return false;
        };
        peer.slots[slot] = data.to_vec();
        peer.complete(
            Cq::Recv,
            Completion {
                wr_id: wr_id.unwrap_or(slot as u64),
                status: Ok(claimed),
            },
        );
        drop(fabric);
        self.shared.1.notify_all();
        true
    }
}

/// Places the SENDs waiting for side `to` into its posted slots.
fn deliver(fabric: &mut Fabric, to: usize) {
    let from = 1 - to;
    loop {
        let side = &mut fabric.sides[to];
        if side.incoming.is_empty() || side.posted.is_empty() {
            return;
        }
        let data = side.incoming.pop_front().unwrap_or_default();
        let slot = side.posted.pop_front().unwrap_or_default();
        if data.len() > RDMA_CHUNK {
            // The receiver's slot is too short: both work requests fail, as on a real RC QP.
            side.complete(
                Cq::Recv,
                Completion {
                    wr_id: slot as u64,
                    status: Err("local length error".into()),
                },
            );
            fabric.sides[from].complete(
                Cq::Send,
                Completion {
                    wr_id: 0,
                    status: Err("remote invalid request error".into()),
                },
            );
            continue;
        }
        let len = data.len() as u32;
        side.slots[slot] = data;
        side.complete(
            Cq::Recv,
            Completion {
                wr_id: slot as u64,
                status: Ok(len),
            },
        );
        fabric.sides[from].complete(
            Cq::Send,
            Completion {
                wr_id: 0,
                status: Ok(len),
            },
        );
    }
}

impl Drop for MockVerbs {
    fn drop(&mut self) {
        self.hang_up();
    }
}

impl Verbs for MockVerbs {
    fn inline_limit(&self) -> usize {
        self.inline
    }

    fn post_send(&mut self, data: &[u8]) -> Result<(), VerbsError> {
        if data.len() > RDMA_CHUNK {
            return Err(VerbsError::errno("ibv_post_send", libc::EINVAL));
        }
        self.post_raw(data);
        Ok(())
    }

    fn post_recv(&mut self, slot: usize) -> Result<(), VerbsError> {
        let mut fabric = self.lock();
        fabric.sides[self.me].posted.push_back(slot);
        deliver(&mut fabric, self.me);
        drop(fabric);
        self.shared.1.notify_all();
        Ok(())
    }

    fn copy_from_slot(&self, slot: usize, offset: usize, dst: &mut [u8]) {
        let fabric = self.lock();
        dst.copy_from_slice(&fabric.sides[self.me].slots[slot][offset..offset + dst.len()]);
    }

    fn poll(&mut self, cq: Cq) -> Result<Option<Completion>, VerbsError> {
        let mut fabric = self.lock();
        let side = &mut fabric.sides[self.me];
        Ok(match cq {
            Cq::Send => side.send_cq.pop_front(),
            Cq::Recv => side.recv_cq.pop_front(),
        })
    }

    fn arm(&mut self, cq: Cq) -> Result<(), VerbsError> {
        self.lock().sides[self.me].armed[cq_index(cq)] = true;
        Ok(())
    }

    fn sleep(&mut self, timeout: Duration) -> Result<Wake, VerbsError> {
        let deadline = Instant::now() + timeout;
        let mut fabric = self.lock();
        loop {
            if fabric.sides[self.me].events > 0 {
                fabric.sides[self.me].events -= 1;
                return Ok(Wake::Event);
            }
            if fabric.sides[1 - self.me].closed {
                return Ok(Wake::HangUp);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Wake::Timeout);
            }
            fabric = self
                .shared
                .1
                .wait_timeout(fabric, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn peer_alive(&mut self) -> Result<bool, VerbsError> {
        Ok(!self.lock().sides[1 - self.me].closed)
    }
}
