//! In-memory network for the tests: wires the machines' transmits into each other's inputs,
//! delivering bytes in random pieces and in a random interleaving of connections.
//!
//! Every ordered pair of nodes has a pipe (a byte stream). A step either drains every node's
//! transmits into the pipes, or offers a random-length prefix of a random non-empty pipe to its
//! receiver; whatever the receiver does not consume stays at the front of the pipe, exactly as a
//! driver keeps unconsumed bytes. When nothing can move and some node is not done, the run
//! reports a stall (a deadlock, or a machine that never takes its input).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::error::CommError;

/// A deterministic random source (splitmix64), so a failing proptest seed replays exactly.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A piece length for a pipe holding `len > 0` bytes: often tiny, sometimes all of it.
    pub(super) fn piece(&mut self, len: usize) -> usize {
        match self.below(10) {
            0..=4 => 1 + self.below(len.min(8)),
            5..=7 => len,
            _ => 1 + self.below(len),
        }
    }

    pub(super) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// One simulated rank (or one end of a connection).
pub(super) trait Node {
    /// Offers bytes from node `from`; returns how many were consumed.
    fn input(&mut self, from: u32, data: &[u8]) -> Result<usize, CommError>;
    /// The next write, as (destination node, bytes). Also where a node takes its events.
    fn transmit(&mut self) -> Option<(u32, Bytes)>;
    /// Whether this node finished.
    fn done(&self) -> bool;
    /// Whether this node reads from `from` at all right now (e.g. rank 0 reads only from the
    /// connection it accepted). Bytes from other nodes wait in their pipe.
    fn readable(&self, _from: u32) -> bool {
        true
    }
}

/// Why a simulated run stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SimError {
    /// A node's machine returned an error.
    Comm { node: u32, error: CommError },
    /// Nothing could move while some node was not done.
    Stalled,
}

/// What a completed run leaves behind.
#[derive(Debug, Default)]
pub(super) struct Net {
    /// Bytes still in each (from, to) pipe.
    pub(super) pipes: BTreeMap<(u32, u32), Vec<u8>>,
    /// Every transmit in order: (from, to, length).
    pub(super) log: Vec<(u32, u32, usize)>,
}

impl Net {
    pub(super) fn leftover(&self, from: u32, to: u32) -> &[u8] {
        self.pipes
            .get(&(from, to))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

/// Runs the nodes until all are done (Ok) or something fails or stalls.
pub(super) fn run<N: Node>(nodes: &mut [N], seed: u64) -> Result<Net, SimError> {
    run_with(nodes, seed, Vec::new())
}

/// Like [`run`], with bytes already in some pipes (e.g. a hostile peer's stream).
pub(super) fn run_with<N: Node>(
    nodes: &mut [N],
    seed: u64,
    preload: Vec<((u32, u32), Vec<u8>)>,
) -> Result<Net, SimError> {
    let mut rng = Rng::new(seed);
    let mut net = Net::default();
    for (k, v) in preload {
        net.pipes.entry(k).or_default().extend(v);
    }
    // A generous bound: every step moves at least one byte or one transmit.
    for _ in 0..10_000_000u64 {
        let mut progress = false;
        for (i, node) in nodes.iter_mut().enumerate() {
            while let Some((to, data)) = node.transmit() {
                net.log.push((i as u32, to, data.len()));
                net.pipes
                    .entry((i as u32, to))
                    .or_default()
                    .extend_from_slice(&data);
                progress = true;
            }
        }
        if nodes.iter().all(Node::done) {
            return Ok(net);
        }
        let mut cands: Vec<(u32, u32)> = net
            .pipes
            .iter()
            .filter(|(&(from, to), v)| !v.is_empty() && nodes[to as usize].readable(from))
            .map(|(&k, _)| k)
            .collect();
        rng.shuffle(&mut cands);
        for (from, to) in cands {
            let pipe = net.pipes.get_mut(&(from, to)).unwrap();
            let len = rng.piece(pipe.len());
            let n = nodes[to as usize]
                .input(from, &pipe[..len])
                .map_err(|error| SimError::Comm { node: to, error })?;
            assert!(n <= len, "consumed more than offered");
            if n > 0 {
                pipe.drain(..n);
                progress = true;
                break;
            }
        }
        if !progress {
            return Err(SimError::Stalled);
        }
    }
    Err(SimError::Stalled)
}
