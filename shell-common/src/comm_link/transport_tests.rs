//! The comm link's switch after the caps exchange, with an in-memory transport standing for
//! RDMA: both sides offering caps move every byte after them off the TCP socket; a side
//! offering none keeps both on TCP.

use std::collections::HashMap;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto_core::comm::{CommError, ConnCaps};
use proto_core::wire::{CommInitRequest, COMM_HOST_SIZE};

use super::transport::{CommTransport, LinkTransport, LinkUpgrade, PendingLink};
use super::{CommLink, CommPeers, CommTls};
use crate::tls::test_certs::Ca;
use crate::tls::ServerTls;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Queues by caps id: what a side's transport receives.
#[derive(Default)]
struct Fabric {
    next: Mutex<u8>,
    inboxes: Mutex<HashMap<u8, Sender<Vec<u8>>>>,
    /// Bytes written over the fake transport.
    moved: AtomicUsize,
}

struct Upgrade(Arc<Fabric>);

impl LinkUpgrade for Upgrade {
    fn offer(&self, _local: IpAddr) -> Option<(ConnCaps, Box<dyn PendingLink>)> {
        let id = {
            let mut next = self.0.next.lock().unwrap();
            *next += 1;
            *next
        };
        let (tx, rx) = channel();
        self.0.inboxes.lock().unwrap().insert(id, tx);
        let mut caps = [0u8; 24];
        caps[0] = id;
        Some((caps, Box::new(Pending(self.0.clone(), rx))))
    }
}

struct Pending(Arc<Fabric>, Receiver<Vec<u8>>);

impl PendingLink for Pending {
    fn activate(
        self: Box<Self>,
        peer: &ConnCaps,
        _tcp: &TcpStream,
        _timeout: Duration,
    ) -> Option<Box<dyn LinkTransport>> {
        let tx = self.0.inboxes.lock().unwrap().get(&peer[0])?.clone();
        Some(Box::new(Fake {
            fabric: self.0,
            tx,
            rx: Mutex::new(self.1),
            pending: Vec::new(),
        }))
    }
}

struct Fake {
    fabric: Arc<Fabric>,
    tx: Sender<Vec<u8>>,
    rx: Mutex<Receiver<Vec<u8>>>,
    pending: Vec<u8>,
}

impl std::fmt::Debug for Fake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fake")
    }
}

impl LinkTransport for Fake {
    fn write(&mut self, data: &[u8]) -> Result<(), CommError> {
        self.fabric.moved.fetch_add(data.len(), Ordering::SeqCst);
        self.tx
            .send(data.to_vec())
            .map_err(|_| CommError::ConnectionClosed { peer: None })
    }

    fn read_into(&mut self, buf: &mut [u8], within: Duration) -> Result<usize, CommError> {
        if self.pending.is_empty() {
            match self.rx.lock().unwrap().recv_timeout(within) {
                Ok(data) => self.pending = data,
                Err(_) => return Err(CommError::Timeout { millis: 0 }),
            }
        }
        let take = buf.len().min(self.pending.len());
        for (out, byte) in buf.iter_mut().zip(self.pending.drain(..take)) {
            *out = byte;
        }
        Ok(take)
    }
}

fn request(rank: u32, port: u16) -> CommInitRequest {
    let mut host = [0u8; COMM_HOST_SIZE];
    if rank > 0 {
        host[..9].copy_from_slice(b"127.0.0.1");
    }
    CommInitRequest {
        device: 0,
        rank,
        world: 2,
        port: u32::from(port),
        host,
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A pairwise link between two threads, each side with its transport; the sums of one
/// all-reduce of `n` elements on each side, and whether each side switched.
fn pair(t0: CommTransport, t1: CommTransport, n: usize) -> [(bool, Vec<f32>); 2] {
    pair_over([None, None], t0, t1, n)
}

/// [`pair`], each side with its TLS.
fn pair_over(
    [tls0, tls1]: [Option<CommTls>; 2],
    t0: CommTransport,
    t1: CommTransport,
    n: usize,
) -> [(bool, Vec<f32>); 2] {
    let port = free_port();
    let peers = CommPeers::any();
    let rank1 = std::thread::spawn(move || {
        let peers = CommPeers::any();
        let mut link =
            CommLink::establish(&request(1, port), TIMEOUT, &peers, tls1.as_ref(), &t1).unwrap();
        let sums = link.allreduce(vec![2.0; n]).unwrap();
        (link.switched(), sums)
    });
    let mut link =
        CommLink::establish(&request(0, port), TIMEOUT, &peers, tls0.as_ref(), &t0).unwrap();
    let sums = link.allreduce(vec![1.0; n]).unwrap();
    [(link.switched(), sums), rank1.join().unwrap()]
}

#[test]
fn both_sides_offering_caps_move_the_link_off_tcp() {
    let fabric = Arc::new(Fabric::default());
    let transport = CommTransport::with(Arc::new(Upgrade(fabric.clone())));
    let n = 1000;
    for (switched, sums) in pair(transport.clone(), transport, n) {
        assert!(switched);
        assert_eq!(sums, vec![3.0; n]);
    }
    // Each side's F32 partial went over the fake transport.
    assert!(fabric.moved.load(Ordering::SeqCst) >= 2 * 4 * n);
}

#[test]
fn a_side_without_caps_keeps_both_on_tcp() {
    let fabric = Arc::new(Fabric::default());
    let transport = CommTransport::with(Arc::new(Upgrade(fabric.clone())));
    for (switched, sums) in pair(transport, CommTransport::tcp(), 100) {
        assert!(!switched);
        assert_eq!(sums, vec![3.0; 100]);
    }
    assert_eq!(fabric.moved.load(Ordering::SeqCst), 0);
}

#[test]
fn a_tls_link_offers_no_caps_and_stays_encrypted() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("comm CA");
    let tls = |stem| {
        let files = ca.leaf(dir.path(), stem, &["localhost", "127.0.0.1"]);
        Some(CommTls::new(&ServerTls::load(&files).unwrap()))
    };
    let fabric = Arc::new(Fabric::default());
    let transport = CommTransport::with(Arc::new(Upgrade(fabric.clone())));
    let sides = pair_over([tls("a"), tls("b")], transport.clone(), transport, 100);
    for (switched, sums) in sides {
        assert!(!switched);
        assert_eq!(sums, vec![3.0; 100]);
    }
    // RDMA would carry the link's bytes unencrypted: nothing was even offered.
    assert!(fabric.inboxes.lock().unwrap().is_empty());
    assert_eq!(fabric.moved.load(Ordering::SeqCst), 0);
}
