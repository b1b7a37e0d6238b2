//! The stream over the in-memory queue pair.

use std::thread;
use std::time::Duration;

use crate::framing::{Framer, Framing};
use crate::mock::{pair, MockVerbs};
use crate::stream::{RdmaStream, StreamError, Timing};
use crate::verbs::{RDMA_CHUNK, RDMA_RX_DEPTH};

const WAIT: Duration = Duration::from_secs(10);

fn timing() -> Timing {
    Timing {
        spin: Duration::from_millis(5),
        stall: Duration::from_millis(500),
    }
}

fn streams() -> (RdmaStream<MockVerbs>, RdmaStream<MockVerbs>) {
    let (a, b) = pair();
    (RdmaStream::new(a, timing()), RdmaStream::new(b, timing()))
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn large_write_goes_as_chunks_and_reads_of_any_size_reassemble_it() {
    let (mut a, mut b) = streams();
    let data = pattern(3 * RDMA_CHUNK + 1000);
    let sent = data.clone();
    let sender = thread::spawn(move || {
        a.send(&sent).unwrap();
        a
    });
    // Reads that do not line up with the SENDs (the newest partial-slot receive).
    let mut got = vec![0u8; data.len()];
    let mut at = 0;
    let mut step = 1;
    while at < got.len() {
        let end = (at + step).min(got.len());
        at += b.recv(&mut got[at..end], WAIT).unwrap().unwrap();
        step = step * 3 + 1;
    }
    let a = sender.join().unwrap();
    assert_eq!(got, data);
    assert_eq!(
        a.verbs().sends_posted(),
        4,
        "three full chunks and one short one"
    );
    assert_eq!(
        b.verbs().slots_posted(),
        RDMA_RX_DEPTH,
        "every consumed slot re-posted"
    );
}

#[test]
fn a_slot_is_reposted_only_once_fully_consumed() {
    let (mut a, mut b) = streams();
    a.send(b"abcdef").unwrap();
    let mut two = [0u8; 2];
    assert_eq!(b.recv(&mut two, WAIT).unwrap(), Some(2));
    assert_eq!(b.verbs().slots_posted(), RDMA_RX_DEPTH - 1);
    assert!(b.has_buffered());
    let mut rest = [0u8; 10];
    assert_eq!(b.recv(&mut rest, WAIT).unwrap(), Some(4));
    assert_eq!(&rest[..4], b"cdef");
    assert_eq!(b.verbs().slots_posted(), RDMA_RX_DEPTH);
}

#[test]
fn an_idle_receive_times_out_without_error() {
    let (_a, mut b) = streams();
    let mut buf = [0u8; 8];
    assert_eq!(b.recv(&mut buf, Duration::from_millis(50)).unwrap(), None);
}

#[test]
fn a_peer_that_hangs_up_fails_a_waiting_receive() {
    let (a, mut b) = streams();
    let waiter = thread::spawn(move || {
        let mut buf = [0u8; 8];
        b.recv(&mut buf, WAIT)
    });
    thread::sleep(Duration::from_millis(30));
    drop(a);
    assert!(matches!(waiter.join().unwrap(), Err(StreamError::PeerGone)));
}

#[test]
fn a_peer_that_never_reads_stalls_the_sender_within_its_bound() {
    let (mut a, _b) = streams();
    // 24 slots fill, the 25th SEND is never acknowledged (receiver not ready).
    let data = pattern((RDMA_RX_DEPTH + 1) * RDMA_CHUNK);
    let start = std::time::Instant::now();
    assert!(matches!(a.send(&data), Err(StreamError::Stalled(_))));
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn an_oversized_send_fails_the_receiving_read() {
    let (mut a, mut b) = pair();
    a.post_raw(&vec![1u8; RDMA_CHUNK + 1]);
    let mut b = RdmaStream::new(std::mem::replace(&mut b, pair().0), timing());
    let mut buf = vec![0u8; 2 * RDMA_CHUNK];
    let err = b.recv(&mut buf, WAIT).unwrap_err();
    assert!(matches!(err, StreamError::Completion { .. }), "{err}");
}

#[test]
fn framed_requests_reach_a_whole_completion_reader_intact() {
    // A 7.0.0-style reader: one recv per field, each must see whole completions only.
    let (mut a, mut b) = streams();
    let payload = pattern(RDMA_CHUNK + 5);
    let mut wire = vec![6u8];
    wire.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    wire.extend_from_slice(&payload);
    let sender = thread::spawn(move || {
        let mut framer = Framer::new(Framing::Request);
        framer.feed(&wire, &mut |w| a.send(w)).unwrap();
        a
    });
    let mut cmd = [0u8; 1];
    assert_eq!(b.recv(&mut cmd, WAIT).unwrap(), Some(1));
    assert!(!b.has_buffered(), "the command byte was a SEND of its own");
    let mut size = [0u8; 8];
    assert_eq!(b.recv(&mut size, WAIT).unwrap(), Some(8));
    assert!(!b.has_buffered(), "the size was a SEND of its own");
    let mut got = vec![0u8; payload.len()];
    b.recv_exact(&mut got, WAIT).unwrap();
    assert!(!b.has_buffered());
    assert_eq!(got, payload);
    sender.join().unwrap();
}

#[test]
fn a_flushed_receive_is_the_peer_closing_only_if_its_socket_hangs_up() {
    // The peer destroyed its QP (our receive flushed) and closed its TCP socket.
    let (mut a, b) = streams();
    b.verbs().flush_peer_receive();
    drop(b);
    let mut buf = [0u8; 8];
    assert!(matches!(a.recv(&mut buf, WAIT), Err(StreamError::PeerGone)));
    // A failed receive while the socket stays open is an error of its own.
    let (mut a, b) = streams();
    b.verbs().flush_peer_receive();
    let err = a.recv(&mut buf, WAIT).unwrap_err();
    assert!(matches!(err, StreamError::Completion { .. }), "{err}");
    drop(b);
}

#[test]
fn a_completion_claiming_more_than_a_slot_is_an_overrun_and_reads_nothing() {
    let (a, mut b) = streams();
    assert!(a
        .verbs()
        .complete_peer_receive(b"abc", RDMA_CHUNK as u32 + 1, None));
    let mut buf = vec![0u8; 2 * RDMA_CHUNK];
    let err = b.recv(&mut buf, WAIT).unwrap_err();
    assert!(
        matches!(err, StreamError::Overrun { got, .. } if got as usize == RDMA_CHUNK + 1),
        "{err}"
    );
    assert!(!b.has_buffered(), "nothing of the lie is read");
    assert_eq!(
        b.verbs().slots_posted(),
        RDMA_RX_DEPTH,
        "its slot re-posted"
    );
    // A completion naming a slot that was never posted.
    let (a, mut b) = streams();
    assert!(a
        .verbs()
        .complete_peer_receive(b"abc", 3, Some(RDMA_RX_DEPTH as u64)));
    let err = b.recv(&mut buf, WAIT).unwrap_err();
    assert!(
        matches!(err, StreamError::Overrun { slot, .. } if slot == RDMA_RX_DEPTH as u64),
        "{err}"
    );
}
