//! The rank-ordered bootstrap exchange and path negotiation (PROTOCOL.md §6.3 steps 5–6).
//!
//! The bootstrap exchange is an all-gather of `size` bytes per rank over the star topology that
//! the set-up built (rank 0 holds one connection per peer, every other rank one to rank 0):
//!
//! * rank 0 puts its own block at index 0, collects `size` bytes from each peer into index
//!   `rank`, then sends the whole `world · size`-byte array to every peer, in rank order;
//! * rank r > 0 sends its block, then receives the `world · size`-byte array.
//!
//! The reference reads the peers' blocks in rank order with blocking reads; a sans-IO rank 0
//! takes them in whatever order they arrive, which yields the same array. A peer that sends more
//! than its block before rank 0 broadcast the array to it is out of turn (a conforming peer waits
//! for the array) and fails the exchange.
//!
//! Exchange #1 of the newest link carries one byte per rank ([`path_offer`]); [`negotiate`]
//! turns the gathered bytes into the [`Path`] every rank takes. A backend communicator may then
//! run further exchanges with the same framing (NCCL: 129 bytes per rank), one
//! [`BootstrapExchange`] each.

use bytes::Bytes;

use super::error::CommError;
use super::recv::RecvBuf;
use super::transmit::Transmit;

/// The reduction path the ranks agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// Every rank offered a backend communicator (e.g. NCCL): it is built with further bootstrap
    /// exchanges, then the comm sockets are closed.
    BackendCommunicator,
    /// At least one rank did not: the pairwise exchange over the one socket (world = 2 only).
    Pairwise,
}

/// This rank's byte in exchange #1: 1 if its backend offers a multi-process communicator (and
/// `GGML_RPC_NO_BACKEND_COMMUNICATOR` is not set), else 0.
pub const fn path_offer(can_use_backend_communicator: bool) -> u8 {
    if can_use_backend_communicator {
        1
    } else {
        0
    }
}

/// Chooses the path from exchange #1's gathered bytes (one per rank, in rank order).
///
/// All non-zero → [`Path::BackendCommunicator`]; otherwise [`Path::Pairwise`], which only exists
/// for two ranks ([`CommError::PairwiseNeedsTwoRanks`] otherwise). Fewer than two bytes is not
/// a world at all ([`CommError::InvalidWorld`]).
pub fn negotiate(offers: &[u8]) -> Result<Path, CommError> {
    let world = u64::try_from(offers.len()).unwrap_or(u64::MAX);
    if world < 2 {
        return Err(CommError::InvalidWorld { world });
    }
    if offers.iter().all(|&b| b != 0) {
        Ok(Path::BackendCommunicator)
    } else if world == 2 {
        Ok(Path::Pairwise)
    } else {
        Err(CommError::PairwiseNeedsTwoRanks { world })
    }
}

/// The result of an exchange: every rank's block, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gathered {
    data: Bytes,
    size: usize,
    world: u32,
}

impl Gathered {
    /// All blocks back to back (`world · size` bytes).
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    /// All blocks back to back, without copying.
    pub fn into_bytes(self) -> Bytes {
        self.data
    }

    /// Bytes per rank.
    pub fn block_size(&self) -> usize {
        self.size
    }

    /// Number of ranks.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// The block of `rank`, if `rank < world`.
    pub fn block(&self, rank: u32) -> Option<&[u8]> {
        if rank >= self.world {
            return None;
        }
        let start = usize::try_from(rank).ok()?.checked_mul(self.size)?;
        let end = start.checked_add(self.size)?;
        self.data.get(start..end)
    }
}

/// Rank 0's progress.
#[derive(Debug, Clone)]
struct Root {
    /// The array being gathered; `Vec` until complete, then frozen for the broadcast.
    array: Vec<u8>,
    /// Bytes received per peer (index `rank − 1`). Empty when `size == 0`, so it is only
    /// allocated when `world ≤ world · size ≤ limit`.
    filled: Vec<usize>,
    /// Peers whose block is not complete yet.
    missing: usize,
    /// The gathered array once complete.
    frozen: Option<Bytes>,
    /// The next peer to broadcast to; peers below it have been sent the array.
    next_send: u32,
}

/// Progress of a rank > 0.
#[derive(Debug, Clone)]
struct Leaf {
    /// Own block, until it was handed out for transmission.
    own: Option<Bytes>,
    recv: RecvBuf,
}

#[derive(Debug, Clone)]
enum Role {
    Root(Root),
    Leaf(Leaf),
}

/// One bootstrap exchange on one rank, as a sans-IO state machine.
///
/// Connections are addressed by rank: input is tagged with the rank it came from, and every
/// [`Transmit`] names the rank to send to (`Some(0)` on ranks > 0).
#[derive(Debug, Clone)]
pub struct BootstrapExchange {
    rank: u32,
    world: u32,
    size: usize,
    role: Role,
    error: Option<CommError>,
}

impl BootstrapExchange {
    /// Starts an exchange on `rank` of `world`, contributing `local` (its length is the block
    /// size, which every rank must use).
    ///
    /// Fails if `world < 2`, `rank ≥ world`, or `world · local.len()` overflows or exceeds
    /// `limit` bytes. Memory use is bounded by a small multiple of `limit`.
    pub fn new(
        rank: u32,
        world: u32,
        local: impl Into<Bytes>,
        limit: usize,
    ) -> Result<Self, CommError> {
        let local: Bytes = local.into();
        if world < 2 {
            return Err(CommError::InvalidWorld {
                world: u64::from(world),
            });
        }
        if rank >= world {
            return Err(CommError::InvalidRank { rank, world });
        }
        let size = local.len();
        let overflow = CommError::SizeOverflow {
            size,
            world: u64::from(world),
        };
        let world_us = usize::try_from(world).map_err(|_| overflow.clone())?;
        let total = size.checked_mul(world_us).ok_or(overflow)?;
        if total > limit {
            return Err(CommError::SizeLimit { total, limit });
        }
        let role = if rank == 0 {
            let mut array = vec![0; total];
            if let Some(own) = array.get_mut(..size) {
                own.copy_from_slice(&local);
            }
            // With empty blocks there is nothing to gather and no per-peer state is needed;
            // otherwise `world ≤ total ≤ limit` bounds the per-peer counters.
            let (filled, missing) = if size == 0 {
                (Vec::new(), 0)
            } else {
                let peers = world_us.saturating_sub(1);
                (vec![0; peers], peers)
            };
            let mut root = Root {
                array,
                filled,
                missing,
                frozen: None,
                next_send: 1,
            };
            if root.missing == 0 {
                root.frozen = Some(Bytes::from(std::mem::take(&mut root.array)));
            }
            Role::Root(root)
        } else {
            Role::Leaf(Leaf {
                own: Some(local),
                recv: RecvBuf::new(total),
            })
        };
        Ok(Self {
            rank,
            world,
            size,
            role,
            error: None,
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Bytes per rank.
    pub fn block_size(&self) -> usize {
        self.size
    }

    fn fail(&mut self, e: CommError) -> CommError {
        self.error = Some(e.clone());
        e
    }

    /// Offers bytes received from rank `from`; returns how many were consumed.
    ///
    /// Rank 0 takes each peer's block as it arrives; bytes beyond a peer's block before the
    /// array was broadcast to it fail the exchange ([`CommError::UnexpectedData`]), bytes after
    /// that are the next stage's and are not consumed. A rank > 0 consumes the array only after
    /// its own block was handed out, and never beyond the array. Input tagged with a rank that
    /// is not a peer fails with [`CommError::UnknownPeer`].
    pub fn handle_input(&mut self, from: u32, data: &[u8]) -> Result<usize, CommError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let size = self.size;
        let result = match &mut self.role {
            Role::Root(root) => root_input(root, size, self.world, from, data),
            Role::Leaf(leaf) => {
                if from != 0 {
                    Err(CommError::UnknownPeer { peer: from })
                } else if leaf.own.is_some() {
                    // Own block not sent yet: rank 0 has nothing to send before that.
                    Ok(0)
                } else {
                    Ok(leaf.recv.fill(data))
                }
            }
        };
        result.map_err(|e| self.fail(e))
    }

    /// The next write: on rank 0 the gathered array to each peer in rank order, once complete;
    /// on a rank > 0 its own block, once.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.error.is_some() {
            return None;
        }
        match &mut self.role {
            Role::Root(root) => {
                let data = root.frozen.clone()?;
                if root.next_send >= self.world {
                    return None;
                }
                let peer = root.next_send;
                root.next_send = peer.saturating_add(1);
                Some(Transmit {
                    peer: Some(peer),
                    data,
                })
            }
            Role::Leaf(leaf) => leaf.own.take().map(|data| Transmit {
                peer: Some(0),
                data,
            }),
        }
    }

    /// The connection to rank `peer` closed. Before this exchange is finished with that
    /// connection (block received and array sent on rank 0; array received on a rank > 0) that
    /// is an error.
    pub fn handle_close(&mut self, peer: u32) -> Result<(), CommError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let finished_with_peer = match &self.role {
            Role::Root(root) => {
                if peer == 0 || peer >= self.world {
                    return Err(self.fail(CommError::UnknownPeer { peer }));
                }
                root.frozen.is_some() && peer < root.next_send
            }
            Role::Leaf(_) => {
                if peer != 0 {
                    return Err(self.fail(CommError::UnknownPeer { peer }));
                }
                self.is_done()
            }
        };
        if finished_with_peer {
            Ok(())
        } else {
            Err(self.fail(CommError::ConnectionClosed { peer: Some(peer) }))
        }
    }

    /// How many more bytes this rank needs from rank `from` (0 if none, or not a peer).
    pub fn wanted(&self, from: u32) -> usize {
        if self.error.is_some() {
            return 0;
        }
        match &self.role {
            Role::Root(root) => {
                let idx = from.checked_sub(1).and_then(|i| usize::try_from(i).ok());
                match idx.and_then(|i| root.filled.get(i)) {
                    Some(&got) => self.size.saturating_sub(got),
                    None => 0,
                }
            }
            Role::Leaf(leaf) if from == 0 && leaf.own.is_none() => leaf.recv.remaining(),
            Role::Leaf(_) => 0,
        }
    }

    /// Whether the exchange is complete on this rank (everything received and handed out).
    pub fn is_done(&self) -> bool {
        if self.error.is_some() {
            return false;
        }
        match &self.role {
            Role::Root(root) => root.frozen.is_some() && root.next_send >= self.world,
            Role::Leaf(leaf) => leaf.own.is_none() && leaf.recv.is_full(),
        }
    }

    /// The error the exchange failed with, if any.
    pub fn error(&self) -> Option<&CommError> {
        self.error.as_ref()
    }

    /// All blocks in rank order; fails with the exchange's error or [`CommError::NotDone`].
    pub fn into_result(self) -> Result<Gathered, CommError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if !self.is_done() {
            return Err(CommError::NotDone);
        }
        let data = match self.role {
            Role::Root(root) => root.frozen.ok_or(CommError::NotDone)?,
            Role::Leaf(leaf) => Bytes::from(leaf.recv.into_vec()),
        };
        Ok(Gathered {
            data,
            size: self.size,
            world: self.world,
        })
    }
}

/// Rank 0's handling of input from peer `from`.
fn root_input(
    root: &mut Root,
    size: usize,
    world: u32,
    from: u32,
    data: &[u8],
) -> Result<usize, CommError> {
    if from == 0 || from >= world {
        return Err(CommError::UnknownPeer { peer: from });
    }
    if data.is_empty() {
        return Ok(0);
    }
    if root.frozen.is_some() && from < root.next_send {
        // The array went to this peer already: these are its next stage's bytes.
        return Ok(0);
    }
    let out_of_turn = CommError::UnexpectedData { peer: from };
    let idx = usize::try_from(from - 1).map_err(|_| out_of_turn.clone())?;
    // With `size == 0` there is no counter: any byte is beyond the (empty) block.
    let Some(got) = root.filled.get_mut(idx) else {
        return Err(out_of_turn);
    };
    let room = size.saturating_sub(*got);
    if data.len() > room {
        return Err(out_of_turn);
    }
    let start = usize::try_from(from)
        .ok()
        .and_then(|r| r.checked_mul(size))
        .and_then(|o| o.checked_add(*got))
        .ok_or(out_of_turn.clone())?;
    let end = start.checked_add(data.len()).ok_or(out_of_turn.clone())?;
    let dst = root.array.get_mut(start..end).ok_or(out_of_turn)?;
    dst.copy_from_slice(data);
    *got += data.len();
    if *got == size {
        root.missing = root.missing.saturating_sub(1);
        if root.missing == 0 {
            root.frozen = Some(Bytes::from(std::mem::take(&mut root.array)));
        }
    }
    Ok(data.len())
}

#[cfg(test)]
mod tests {
    use super::super::sim::{self, Node};
    use super::*;
    use proptest::prelude::*;

    const LIMIT: usize = 1 << 20;

    impl Node for BootstrapExchange {
        fn input(&mut self, from: u32, data: &[u8]) -> Result<usize, CommError> {
            self.handle_input(from, data)
        }
        fn transmit(&mut self) -> Option<(u32, Bytes)> {
            self.poll_transmit().map(|t| (t.peer.unwrap(), t.data))
        }
        fn done(&self) -> bool {
            self.is_done()
        }
    }

    fn block(rank: u32, size: usize, salt: u8) -> Vec<u8> {
        (0..size)
            .map(|i| (rank as u8).wrapping_mul(101) ^ (i as u8).wrapping_mul(7) ^ salt)
            .collect()
    }

    fn check_exchange(world: u32, size: usize, salt: u8, seed: u64) {
        let blocks: Vec<Vec<u8>> = (0..world).map(|r| block(r, size, salt)).collect();
        let mut nodes: Vec<BootstrapExchange> = (0..world)
            .map(|r| BootstrapExchange::new(r, world, blocks[r as usize].clone(), LIMIT).unwrap())
            .collect();
        let net = sim::run(&mut nodes, seed).unwrap();
        assert!(net.pipes.values().all(Vec::is_empty));
        let want: Vec<u8> = blocks.concat();
        // One write per peer block, then rank 0's array to each peer once, in rank order.
        let from_root: Vec<(u32, usize)> = net
            .log
            .iter()
            .filter(|l| l.0 == 0)
            .map(|&(_, to, n)| (to, n))
            .collect();
        let expected: Vec<(u32, usize)> = (1..world).map(|r| (r, want.len())).collect();
        assert_eq!(from_root, expected);
        for r in 1..world {
            let sent: Vec<(u32, usize)> = net
                .log
                .iter()
                .filter(|l| l.0 == r)
                .map(|&(_, to, n)| (to, n))
                .collect();
            assert_eq!(sent, vec![(0, size)]);
        }
        for (r, node) in nodes.into_iter().enumerate() {
            let g = node.into_result().unwrap();
            assert_eq!(g.as_bytes(), &want[..], "rank {r}");
            assert_eq!(g.world(), world);
            assert_eq!(g.block_size(), size);
            for q in 0..world {
                assert_eq!(g.block(q).unwrap(), &blocks[q as usize][..]);
            }
            assert_eq!(g.block(world), None);
        }
    }

    fn sizes() -> impl Strategy<Value = usize> {
        prop_oneof![Just(0usize), Just(1), Just(129), 0usize..300]
    }

    proptest! {
        #[test]
        fn two_ranks(size in sizes(), salt in any::<u8>(), seed in any::<u64>()) {
            check_exchange(2, size, salt, seed);
        }

        #[test]
        fn three_ranks(size in sizes(), salt in any::<u8>(), seed in any::<u64>()) {
            check_exchange(3, size, salt, seed);
        }

        #[test]
        fn four_ranks(size in sizes(), salt in any::<u8>(), seed in any::<u64>()) {
            check_exchange(4, size, salt, seed);
        }

        #[test]
        fn eight_ranks(size in sizes(), salt in any::<u8>(), seed in any::<u64>()) {
            check_exchange(8, size, salt, seed);
        }

        #[test]
        fn root_gathers_in_any_arrival_order(
            world in 2u32..9,
            size in sizes(),
            seed in any::<u64>(),
        ) {
            // Feed rank 0 directly: peers' bytes interleaved in random pieces.
            let blocks: Vec<Vec<u8>> = (0..world).map(|r| block(r, size, 3)).collect();
            let mut root = BootstrapExchange::new(0, world, blocks[0].clone(), LIMIT).unwrap();
            let mut rng = sim::Rng::new(seed);
            let mut at = vec![0usize; world as usize];
            loop {
                prop_assert_eq!(root.poll_transmit().is_some(), at[1..].iter().all(|&a| a == size));
                let open: Vec<u32> = (1..world).filter(|&r| at[r as usize] < size).collect();
                if open.is_empty() {
                    break;
                }
                let r = open[rng.below(open.len())];
                let a = at[r as usize];
                let n = rng.piece(size - a);
                prop_assert_eq!(root.wanted(r), size - a);
                prop_assert_eq!(root.handle_input(r, &blocks[r as usize][a..a + n]).unwrap(), n);
                at[r as usize] += n;
            }
            let mut peers = vec![];
            while let Some(t) = root.poll_transmit() {
                peers.push(t.peer.unwrap());
                prop_assert_eq!(&t.data[..], &blocks.concat()[..]);
            }
            // The first poll above already took the broadcast to rank 1.
            let mut want: Vec<u32> = (1..world).collect();
            want.remove(0);
            prop_assert_eq!(peers, want);
            prop_assert!(root.is_done());
        }

        #[test]
        fn chained_exchanges_like_nccl(world in 2u32..9, no_backend in any::<u32>(), seed in any::<u64>()) {
            // Exchange #1: one path byte per rank; then, if every rank offers a backend
            // communicator, a 129-byte exchange (ok flag + 128-byte id), as CUDA/NCCL does.
            // Each node runs its exchanges back to back, so a peer's second block can arrive at
            // rank 0 before rank 0 finished broadcasting the first array.
            let refuser = if no_backend % 3 == 0 { Some(no_backend % world) } else { None };
            let mut nodes: Vec<Chain> = (0..world)
                .map(|r| {
                    let offer = path_offer(Some(r) != refuser);
                    Chain::new(r, world, vec![vec![offer], block(r, 129, 9)])
                })
                .collect();
            let net = sim::run(&mut nodes, seed).unwrap();
            prop_assert!(net.pipes.values().all(Vec::is_empty));
            let offers: Vec<u8> = (0..world).map(|r| path_offer(Some(r) != refuser)).collect();
            let ids: Vec<u8> = (0..world).flat_map(|r| block(r, 129, 9)).collect();
            for node in &nodes {
                prop_assert_eq!(node.results[0].as_bytes(), &offers[..]);
                prop_assert_eq!(node.results[1].as_bytes(), &ids[..]);
                let path = negotiate(node.results[0].as_bytes());
                match (refuser, world) {
                    (None, _) => prop_assert_eq!(path, Ok(Path::BackendCommunicator)),
                    (Some(_), 2) => prop_assert_eq!(path, Ok(Path::Pairwise)),
                    (Some(_), w) => prop_assert_eq!(path, Err(CommError::PairwiseNeedsTwoRanks { world: u64::from(w) })),
                }
                // Every rank uses rank 0's id.
                prop_assert_eq!(node.results[1].block(0).unwrap(), &block(0, 129, 9)[..]);
            }
        }

        #[test]
        fn garbage_never_panics(
            rank in 0u32..4,
            world in 0u32..5,
            size in 0usize..6,
            inputs in proptest::collection::vec((0u32..6, proptest::collection::vec(any::<u8>(), 0..20)), 0..20),
            closes in proptest::collection::vec(0u32..6, 0..3),
        ) {
            let Ok(mut bx) = BootstrapExchange::new(rank, world, vec![1u8; size], 64) else {
                return Ok(());
            };
            for (from, data) in &inputs {
                while bx.poll_transmit().is_some() {}
                let _ = bx.wanted(*from);
                if let Ok(n) = bx.handle_input(*from, data) {
                    prop_assert!(n <= data.len());
                }
            }
            for peer in closes {
                let _ = bx.handle_close(peer);
            }
            let _ = bx.into_result();
        }
    }

    /// A rank running several exchanges back to back.
    struct Chain {
        rank: u32,
        world: u32,
        blocks: std::vec::IntoIter<Vec<u8>>,
        current: Option<BootstrapExchange>,
        results: Vec<Gathered>,
    }

    impl Chain {
        fn new(rank: u32, world: u32, blocks: Vec<Vec<u8>>) -> Self {
            let mut c = Self {
                rank,
                world,
                blocks: blocks.into_iter(),
                current: None,
                results: vec![],
            };
            c.advance();
            c
        }

        fn advance(&mut self) {
            if self.current.as_ref().is_some_and(|c| !c.is_done()) {
                return;
            }
            if let Some(done) = self.current.take() {
                self.results.push(done.into_result().unwrap());
            }
            self.current = self
                .blocks
                .next()
                .map(|b| BootstrapExchange::new(self.rank, self.world, b, LIMIT).unwrap());
        }
    }

    impl Node for Chain {
        fn input(&mut self, from: u32, data: &[u8]) -> Result<usize, CommError> {
            match &mut self.current {
                Some(c) => c.handle_input(from, data),
                None => Ok(0),
            }
        }
        fn transmit(&mut self) -> Option<(u32, Bytes)> {
            loop {
                let t = self.current.as_mut()?.poll_transmit();
                if let Some(t) = t {
                    return Some((t.peer.unwrap(), t.data));
                }
                if !self.current.as_ref()?.is_done() {
                    return None;
                }
                self.advance();
            }
        }
        fn done(&self) -> bool {
            self.current.is_none()
        }
    }

    #[test]
    fn root_rejects_a_peer_that_sends_too_much() {
        // In one piece.
        let mut root = BootstrapExchange::new(0, 3, vec![0u8; 4], LIMIT).unwrap();
        assert_eq!(
            root.handle_input(2, &[1; 5]).unwrap_err(),
            CommError::UnexpectedData { peer: 2 }
        );
        assert_eq!(root.poll_transmit(), None);
        assert_eq!(
            root.clone().into_result().unwrap_err(),
            CommError::UnexpectedData { peer: 2 }
        );
        assert_eq!(
            root.handle_input(1, &[1; 4]).unwrap_err(),
            CommError::UnexpectedData { peer: 2 }
        );

        // Block complete, gather still open (rank 2 missing).
        let mut root = BootstrapExchange::new(0, 3, vec![0u8; 4], LIMIT).unwrap();
        assert_eq!(root.handle_input(1, &[1; 4]).unwrap(), 4);
        assert_eq!(root.handle_input(1, &[]).unwrap(), 0);
        assert_eq!(
            root.handle_input(1, &[1]).unwrap_err(),
            CommError::UnexpectedData { peer: 1 }
        );

        // Gather complete, broadcast not yet handed out to rank 2: still out of turn.
        let mut root = BootstrapExchange::new(0, 3, vec![0u8; 4], LIMIT).unwrap();
        root.handle_input(1, &[1; 4]).unwrap();
        root.handle_input(2, &[2; 4]).unwrap();
        assert_eq!(root.poll_transmit().unwrap().peer, Some(1));
        // Rank 1 has its array: its next bytes are the next exchange's and stay with the caller.
        assert_eq!(root.handle_input(1, &[7; 9]).unwrap(), 0);
        assert_eq!(
            root.handle_input(2, &[7]).unwrap_err(),
            CommError::UnexpectedData { peer: 2 }
        );

        // Empty blocks: any byte before the broadcast is out of turn.
        let mut root = BootstrapExchange::new(0, 2, Vec::new(), LIMIT).unwrap();
        assert_eq!(
            root.handle_input(1, &[0]).unwrap_err(),
            CommError::UnexpectedData { peer: 1 }
        );
    }

    #[test]
    fn unknown_peers_are_rejected() {
        let mut root = BootstrapExchange::new(0, 3, vec![0u8; 2], LIMIT).unwrap();
        assert_eq!(
            root.handle_input(0, &[1]).unwrap_err(),
            CommError::UnknownPeer { peer: 0 }
        );
        let mut root = BootstrapExchange::new(0, 3, vec![0u8; 2], LIMIT).unwrap();
        assert_eq!(
            root.handle_input(3, &[1]).unwrap_err(),
            CommError::UnknownPeer { peer: 3 }
        );
        let mut root = BootstrapExchange::new(0, 3, vec![0u8; 2], LIMIT).unwrap();
        assert_eq!(
            root.handle_close(7).unwrap_err(),
            CommError::UnknownPeer { peer: 7 }
        );
        let mut leaf = BootstrapExchange::new(2, 3, vec![0u8; 2], LIMIT).unwrap();
        assert_eq!(
            leaf.handle_input(1, &[1]).unwrap_err(),
            CommError::UnknownPeer { peer: 1 }
        );
        let mut leaf = BootstrapExchange::new(2, 3, vec![0u8; 2], LIMIT).unwrap();
        assert_eq!(
            leaf.handle_close(1).unwrap_err(),
            CommError::UnknownPeer { peer: 1 }
        );
    }

    #[test]
    fn leaf_sends_first_and_keeps_surplus() {
        let mut leaf = BootstrapExchange::new(1, 2, vec![5u8; 3], LIMIT).unwrap();
        assert_eq!(leaf.rank(), 1);
        assert_eq!(leaf.block_size(), 3);
        assert_eq!(leaf.wanted(0), 0);
        // Nothing is read before the own block went out.
        assert_eq!(leaf.handle_input(0, &[1, 2, 3]).unwrap(), 0);
        let t = leaf.poll_transmit().unwrap();
        assert_eq!(
            t,
            Transmit {
                peer: Some(0),
                data: Bytes::from_static(&[5, 5, 5])
            }
        );
        assert_eq!(leaf.poll_transmit(), None);
        assert_eq!(leaf.wanted(0), 6);
        assert_eq!(leaf.handle_input(0, &[9, 9, 9, 5]).unwrap(), 4);
        assert_eq!(leaf.handle_input(0, &[5, 5, 0xee, 0xff]).unwrap(), 2);
        assert!(leaf.is_done());
        assert_eq!(leaf.handle_input(0, &[0xee]).unwrap(), 0);
        assert_eq!(leaf.handle_close(0), Ok(()));
        assert_eq!(leaf.into_result().unwrap().as_bytes(), &[9, 9, 9, 5, 5, 5]);
    }

    #[test]
    fn truncation_fails() {
        // Leaf: rank 0 goes away before the whole array arrived.
        let mut leaf = BootstrapExchange::new(1, 2, vec![5u8; 3], LIMIT).unwrap();
        leaf.poll_transmit().unwrap();
        leaf.handle_input(0, &[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(leaf.clone().into_result().unwrap_err(), CommError::NotDone);
        assert_eq!(
            leaf.handle_close(0).unwrap_err(),
            CommError::ConnectionClosed { peer: Some(0) }
        );
        assert!(leaf.handle_input(0, &[6]).is_err());

        // Root: a peer goes away mid-block, or before its array was handed out.
        let mut root = BootstrapExchange::new(0, 3, vec![0u8; 2], LIMIT).unwrap();
        root.handle_input(1, &[1]).unwrap();
        assert_eq!(
            root.handle_close(1).unwrap_err(),
            CommError::ConnectionClosed { peer: Some(1) }
        );
        let mut root = BootstrapExchange::new(0, 3, vec![0u8; 2], LIMIT).unwrap();
        root.handle_input(1, &[1, 1]).unwrap();
        root.handle_input(2, &[2, 2]).unwrap();
        root.poll_transmit().unwrap();
        assert_eq!(
            root.handle_close(1),
            Ok(()),
            "rank 1 has everything it needs"
        );
        assert_eq!(
            root.handle_close(2).unwrap_err(),
            CommError::ConnectionClosed { peer: Some(2) }
        );
    }

    #[test]
    fn sizes_are_checked_against_the_limit() {
        assert_eq!(
            BootstrapExchange::new(0, 4, vec![0u8; 100], 399).unwrap_err(),
            CommError::SizeLimit {
                total: 400,
                limit: 399
            }
        );
        assert!(BootstrapExchange::new(3, 4, vec![0u8; 100], 400).is_ok());
        // A huge world with 0-byte blocks allocates nothing per peer.
        let mut root = BootstrapExchange::new(0, u32::MAX, Vec::new(), 0).unwrap();
        assert_eq!(root.poll_transmit().unwrap().peer, Some(1));
        assert_eq!(root.poll_transmit().unwrap().data.len(), 0);
        // A huge world with real blocks is refused by the limit before anything is allocated.
        assert_eq!(
            BootstrapExchange::new(0, u32::MAX, vec![0u8; 2], LIMIT).unwrap_err(),
            CommError::SizeLimit {
                total: 2 * u32::MAX as usize,
                limit: LIMIT
            }
        );
        assert_eq!(
            BootstrapExchange::new(0, 1, vec![0u8; 2], LIMIT).unwrap_err(),
            CommError::InvalidWorld { world: 1 }
        );
        assert_eq!(
            BootstrapExchange::new(2, 2, vec![0u8; 2], LIMIT).unwrap_err(),
            CommError::InvalidRank { rank: 2, world: 2 }
        );
    }

    #[test]
    fn negotiation() {
        assert_eq!(path_offer(true), 1);
        assert_eq!(path_offer(false), 0);
        assert_eq!(negotiate(&[1, 1]), Ok(Path::BackendCommunicator));
        assert_eq!(negotiate(&[1; 8]), Ok(Path::BackendCommunicator));
        assert_eq!(negotiate(&[2, 255, 1]), Ok(Path::BackendCommunicator));
        assert_eq!(negotiate(&[1, 0]), Ok(Path::Pairwise));
        assert_eq!(negotiate(&[0, 1]), Ok(Path::Pairwise));
        assert_eq!(negotiate(&[0, 0]), Ok(Path::Pairwise));
        assert_eq!(
            negotiate(&[1, 0, 1]),
            Err(CommError::PairwiseNeedsTwoRanks { world: 3 })
        );
        assert_eq!(
            negotiate(&[0; 8]),
            Err(CommError::PairwiseNeedsTwoRanks { world: 8 })
        );
        assert_eq!(negotiate(&[1]), Err(CommError::InvalidWorld { world: 1 }));
        assert_eq!(negotiate(&[]), Err(CommError::InvalidWorld { world: 0 }));
    }

    #[test]
    fn gathered_blocks_with_empty_size() {
        let g = Gathered {
            data: Bytes::new(),
            size: 0,
            world: 3,
        };
        assert_eq!(g.block(2), Some(&[][..]));
        assert_eq!(g.block(3), None);
        assert_eq!(g.block(u32::MAX), None);
        assert!(g.into_bytes().is_empty());
    }
}
