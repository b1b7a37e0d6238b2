//! Rank 0's link set-up: accepting the `world − 1` peers (PROTOCOL.md §6.2, §6.3 steps 1–4).
//!
//! Like the reference, rank 0 accepts one connection at a time and completes its handshake before
//! accepting the next, so there is only ever one "current" connection. Peers may connect in any
//! rank order: with the newest link each one names its rank after the caps exchange, and rank 0
//! files the connection under that rank. A rank that is out of range, or that was already seen,
//! fails the whole set-up (the driver then drops every peer connection and answers `ok = 0`).

use std::collections::BTreeMap;
use std::collections::VecDeque;

use super::error::CommError;
use super::handshake::{ConnCaps, Handshake, HandshakeEvent, LinkVariant};
use super::transmit::Transmit;

/// Something rank 0's driver must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rank0Event {
    /// Accept the next connection on the listening socket, then call
    /// [`Rank0Setup::handle_accepted`].
    Accept,
    /// The caps exchange on the current connection is complete: apply `peer_caps` to its
    /// transport before any further byte is sent or read on it.
    CapsExchanged {
        /// The caps the peer sent.
        peer_caps: ConnCaps,
    },
    /// The current connection finished its handshake: it is the connection to `rank` from now
    /// on. Bytes already received on it beyond what the set-up consumed belong to that peer's
    /// next stage (the bootstrap exchange).
    PeerJoined {
        /// The peer's rank.
        rank: u32,
        /// The caps the peer sent.
        peer_caps: ConnCaps,
    },
}

/// A peer that completed its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinedPeer {
    /// The peer's rank (`1..world`).
    pub rank: u32,
    /// The caps it sent.
    pub peer_caps: ConnCaps,
}

#[derive(Debug, Clone)]
enum State {
    /// Waiting for the driver to accept the next connection.
    AwaitingAccept,
    /// Handshaking on the current connection.
    Handshaking(Box<Handshake>),
    Done,
    Failed(CommError),
}

/// Rank 0's side of the comm-link set-up, as a sans-IO state machine.
#[derive(Debug, Clone)]
pub struct Rank0Setup {
    variant: LinkVariant,
    world: u32,
    local_caps: ConnCaps,
    state: State,
    /// Joined peers by rank. Grows one entry per completed handshake, so its size is driven by
    /// real connections, never by the (client-chosen) world size.
    joined: BTreeMap<u32, ConnCaps>,
    events: VecDeque<Rank0Event>,
}

impl Rank0Setup {
    /// Starts the set-up; the first event asks the driver to accept a connection.
    ///
    /// Fails if `world` is not allowed for `variant` (8.0.0: exactly 2; newest: at least 2).
    pub fn new(variant: LinkVariant, world: u32, local_caps: ConnCaps) -> Result<Self, CommError> {
        // Validate through the handshake constructor so both agree on the rule.
        Handshake::acceptor(variant, world, local_caps)?;
        let mut events = VecDeque::new();
        events.push_back(Rank0Event::Accept);
        Ok(Self {
            variant,
            world,
            local_caps,
            state: State::AwaitingAccept,
            joined: BTreeMap::new(),
            events,
        })
    }

    fn fail(&mut self, e: CommError) -> CommError {
        self.state = State::Failed(e.clone());
        self.events.clear();
        e
    }

    fn failed(&self) -> Option<CommError> {
        match &self.state {
            State::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }

    /// Number of peers rank 0 waits for: `world − 1`.
    fn peers_expected(&self) -> usize {
        usize::try_from(self.world.saturating_sub(1)).unwrap_or(usize::MAX)
    }

    /// [`handle_accepted`](Self::handle_accepted) announcing `local_caps` on this connection
    /// (each RDMA queue pair has caps of its own), and on later ones unless changed again.
    pub fn handle_accepted_with(&mut self, local_caps: ConnCaps) -> Result<(), CommError> {
        if matches!(self.state, State::AwaitingAccept) {
            self.local_caps = local_caps;
        }
        self.handle_accepted()
    }

    /// The driver accepted the next connection; it becomes the current connection.
    pub fn handle_accepted(&mut self) -> Result<(), CommError> {
        if let Some(e) = self.failed() {
            return Err(e);
        }
        if !matches!(self.state, State::AwaitingAccept) {
            return Err(self.fail(CommError::InvalidState {
                operation: "accept while no connection is wanted",
            }));
        }
        match Handshake::acceptor(self.variant, self.world, self.local_caps) {
            Ok(hs) => {
                self.state = State::Handshaking(Box::new(hs));
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Offers bytes received on the current connection; returns how many were consumed.
    ///
    /// Bytes not consumed stay with the caller: offer them again after draining
    /// `poll_transmit`/`poll_event`, or, once the peer joined, hand them to its next stage.
    /// Offering input while no connection is current is a driver error.
    pub fn handle_input(&mut self, data: &[u8]) -> Result<usize, CommError> {
        if let Some(e) = self.failed() {
            return Err(e);
        }
        let result = match &mut self.state {
            State::Handshaking(hs) => hs.handle_input(data),
            // The last peer joined: anything else is its next stage's.
            State::Done => return Ok(0),
            _ => {
                return Err(self.fail(CommError::InvalidState {
                    operation: "input while no connection is being set up",
                }))
            }
        };
        match result {
            Ok(n) => {
                self.check_joined()?;
                Ok(n)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The next write to perform on the current connection (`peer` is `None`).
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let t = match &mut self.state {
            State::Handshaking(hs) => hs.poll_transmit(),
            _ => None,
        };
        // No acceptor script ends with a send, so a transmit never completes a handshake.
        t
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<Rank0Event> {
        if let Some(ev) = self.events.pop_front() {
            return Some(ev);
        }
        let ev = match &mut self.state {
            State::Handshaking(hs) => hs.poll_event()?,
            _ => return None,
        };
        // Taking the event may have finished the handshake (8.0.0 ends with "apply"); a
        // resulting `PeerJoined` is queued behind this one. A failure is kept in the state.
        if self.check_joined().is_err() {
            return None;
        }
        match ev {
            HandshakeEvent::CapsExchanged { peer_caps } => {
                Some(Rank0Event::CapsExchanged { peer_caps })
            }
        }
    }

    /// If the current handshake completed, files the peer under its rank and moves on.
    fn check_joined(&mut self) -> Result<(), CommError> {
        let outcome = match &self.state {
            State::Handshaking(hs) => match hs.outcome() {
                Some(o) => o,
                None => return Ok(()),
            },
            _ => return Ok(()),
        };
        if self.joined.contains_key(&outcome.peer_rank) {
            return Err(self.fail(CommError::DuplicatePeerRank {
                rank: outcome.peer_rank,
            }));
        }
        self.joined.insert(outcome.peer_rank, outcome.peer_caps);
        self.events.push_back(Rank0Event::PeerJoined {
            rank: outcome.peer_rank,
            peer_caps: outcome.peer_caps,
        });
        if self.joined.len() >= self.peers_expected() {
            self.state = State::Done;
        } else {
            self.state = State::AwaitingAccept;
            self.events.push_back(Rank0Event::Accept);
        }
        Ok(())
    }

    /// The current connection closed. Before its handshake completed that fails the set-up;
    /// with no connection current it is a no-op (joined peers are the next stage's concern).
    pub fn handle_close(&mut self) -> Result<(), CommError> {
        if let Some(e) = self.failed() {
            return Err(e);
        }
        match &self.state {
            State::Handshaking(_) => Err(self.fail(CommError::ConnectionClosed { peer: None })),
            _ => Ok(()),
        }
    }

    /// Whether the driver should accept the next connection now.
    pub fn wants_accept(&self) -> bool {
        matches!(self.state, State::AwaitingAccept)
    }

    /// How many bytes the current connection's receive still needs (0 if none).
    pub fn wanted(&self) -> usize {
        match &self.state {
            State::Handshaking(hs) => hs.wanted(),
            _ => 0,
        }
    }

    /// Whether every peer joined.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// The error the set-up failed with, if any.
    pub fn error(&self) -> Option<&CommError> {
        match &self.state {
            State::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// The joined peers in rank order; fails with the set-up's error or [`CommError::NotDone`].
    pub fn into_result(self) -> Result<Vec<JoinedPeer>, CommError> {
        match self.state {
            State::Done => Ok(self
                .joined
                .into_iter()
                .map(|(rank, peer_caps)| JoinedPeer { rank, peer_caps })
                .collect()),
            State::Failed(e) => Err(e),
            _ => Err(CommError::NotDone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::handshake::{HandshakeOutcome, CAPS_SIZE};
    use super::super::sim::{self, Node, SimError};
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    fn caps(rank: u32) -> ConnCaps {
        let mut c = [0u8; CAPS_SIZE];
        for (i, b) in c.iter_mut().enumerate() {
            *b = (rank as u8).wrapping_mul(17).wrapping_add(i as u8 + 1);
        }
        c
    }

    #[test]
    fn each_connection_announces_the_caps_it_was_accepted_with() {
        // One RDMA queue pair per comm socket: rank 0's caps differ per connection.
        let mut setup = Rank0Setup::new(LinkVariant::Ranked, 3, caps(0)).unwrap();
        for (peer, own) in [(1u32, 7u32), (2, 9)] {
            assert!(matches!(setup.poll_event(), Some(Rank0Event::Accept)));
            setup.handle_accepted_with(caps(own)).unwrap();
            assert_eq!(setup.handle_input(&caps(peer)).unwrap(), CAPS_SIZE);
            let sent = setup.poll_transmit().unwrap();
            assert_eq!(&sent.data[..], &caps(own)[..]);
            assert!(matches!(
                setup.poll_event(),
                Some(Rank0Event::CapsExchanged { peer_caps }) if peer_caps == caps(peer)
            ));
            assert_eq!(setup.handle_input(&peer.to_le_bytes()).unwrap(), 4);
            assert!(matches!(
                setup.poll_event(),
                Some(Rank0Event::PeerJoined { rank, .. }) if rank == peer
            ));
        }
        assert!(setup.is_done());
    }

    /// Bytes a peer sends right after its handshake (its first bootstrap block, say), so that
    /// they can coalesce with the rank message at rank 0.
    fn surplus(rank: u32) -> Vec<u8> {
        vec![0xf0 | rank as u8; 1 + rank as usize % 3]
    }

    /// Rank 0: accepts the simulated connections in `arrival` order, one at a time.
    struct Root {
        setup: Rank0Setup,
        arrival: Vec<u32>,
        next: usize,
        /// The node whose connection is being set up.
        current: Option<u32>,
        /// (node accepted, rank it announced), in join order.
        joined: Vec<(u32, u32)>,
        caps_events: Vec<ConnCaps>,
    }

    /// A rank > 0: connector handshake, then its surplus bytes.
    struct Peer {
        hs: Handshake,
        surplus: Option<Bytes>,
    }

    enum SetupNode {
        Root(Root),
        Peer(Peer),
    }

    impl Node for SetupNode {
        fn input(&mut self, from: u32, data: &[u8]) -> Result<usize, CommError> {
            match self {
                SetupNode::Root(r) => {
                    assert_eq!(
                        Some(from),
                        r.current,
                        "rank 0 only reads its current connection"
                    );
                    r.setup.handle_input(data)
                }
                SetupNode::Peer(p) => p.hs.handle_input(data),
            }
        }

        fn transmit(&mut self) -> Option<(u32, Bytes)> {
            match self {
                SetupNode::Root(r) => {
                    while let Some(ev) = r.setup.poll_event() {
                        match ev {
                            Rank0Event::Accept => {
                                assert!(r.setup.wants_accept());
                                r.current = Some(r.arrival[r.next]);
                                r.next += 1;
                                r.setup.handle_accepted().unwrap();
                            }
                            Rank0Event::CapsExchanged { peer_caps } => {
                                r.caps_events.push(peer_caps)
                            }
                            Rank0Event::PeerJoined { rank, peer_caps } => {
                                assert_eq!(peer_caps, caps(rank));
                                r.joined.push((r.current.take().unwrap(), rank));
                            }
                        }
                    }
                    let t = r.setup.poll_transmit()?;
                    assert_eq!(t.peer, None);
                    Some((r.current.unwrap(), t.data))
                }
                SetupNode::Peer(p) => {
                    while p.hs.poll_event().is_some() {}
                    if let Some(t) = p.hs.poll_transmit() {
                        return Some((0, t.data));
                    }
                    if p.hs.is_done() {
                        return p.surplus.take().map(|s| (0, s));
                    }
                    None
                }
            }
        }

        fn done(&self) -> bool {
            match self {
                SetupNode::Root(r) => r.setup.is_done(),
                SetupNode::Peer(p) => p.hs.is_done() && p.surplus.is_none(),
            }
        }

        fn readable(&self, from: u32) -> bool {
            match self {
                SetupNode::Root(r) => r.current == Some(from),
                SetupNode::Peer(_) => true,
            }
        }
    }

    /// Nodes for a world: node 0 is rank 0, node i announces `claims[i - 1]`.
    fn nodes(
        variant: LinkVariant,
        world: u32,
        arrival: Vec<u32>,
        claims: &[u32],
    ) -> Vec<SetupNode> {
        let mut v = vec![SetupNode::Root(Root {
            setup: Rank0Setup::new(variant, world, caps(0)).unwrap(),
            arrival,
            next: 0,
            current: None,
            joined: vec![],
            caps_events: vec![],
        })];
        for &rank in claims {
            v.push(SetupNode::Peer(Peer {
                hs: Handshake::connector(variant, rank, world, caps(rank)).unwrap(),
                surplus: Some(Bytes::from(surplus(rank))),
            }));
        }
        v
    }

    fn check_world(variant: LinkVariant, world: u32, arrival: Vec<u32>, seed: u64) {
        let claims: Vec<u32> = (1..world).collect();
        let mut nodes = nodes(variant, world, arrival.clone(), &claims);
        let net = sim::run(&mut nodes, seed).unwrap();
        let SetupNode::Root(root) = nodes.remove(0) else {
            unreachable!()
        };
        // Joined in arrival order, each connection filed under the rank it announced.
        let joined_nodes: Vec<u32> = root.joined.iter().map(|&(n, _)| n).collect();
        assert_eq!(joined_nodes, arrival);
        assert!(root.joined.iter().all(|&(node, rank)| node == rank));
        let want_caps: Vec<ConnCaps> = arrival.iter().map(|&r| caps(r)).collect();
        assert_eq!(root.caps_events, want_caps);
        let peers = root.setup.into_result().unwrap();
        let want: Vec<JoinedPeer> = (1..world)
            .map(|rank| JoinedPeer {
                rank,
                peer_caps: caps(rank),
            })
            .collect();
        assert_eq!(peers, want);
        for (i, node) in nodes.iter().enumerate() {
            let rank = i as u32 + 1;
            let SetupNode::Peer(p) = node else {
                unreachable!()
            };
            assert_eq!(
                p.hs.outcome().unwrap(),
                HandshakeOutcome {
                    peer_caps: caps(0),
                    peer_rank: 0
                }
            );
            // The surplus sent after the handshake is still waiting for the next stage.
            assert_eq!(net.leftover(rank, 0), &surplus(rank)[..]);
            assert!(net.leftover(0, rank).is_empty());
        }
    }

    fn permutation(world: u32) -> impl Strategy<Value = Vec<u32>> {
        Just((1..world).collect::<Vec<u32>>()).prop_shuffle()
    }

    proptest! {
        #[test]
        fn two_ranks(arrival in permutation(2), seed in any::<u64>()) {
            check_world(LinkVariant::Ranked, 2, arrival, seed);
        }

        #[test]
        fn two_ranks_v8(seed in any::<u64>()) {
            check_world(LinkVariant::V8_0, 2, vec![1], seed);
        }

        #[test]
        fn three_ranks(arrival in permutation(3), seed in any::<u64>()) {
            check_world(LinkVariant::Ranked, 3, arrival, seed);
        }

        #[test]
        fn four_ranks(arrival in permutation(4), seed in any::<u64>()) {
            check_world(LinkVariant::Ranked, 4, arrival, seed);
        }

        #[test]
        fn eight_ranks(arrival in permutation(8), seed in any::<u64>()) {
            check_world(LinkVariant::Ranked, 8, arrival, seed);
        }

        #[test]
        fn duplicate_rank_fails_the_whole_setup(
            world in 3u32..9,
            pick in any::<u32>(),
            arrival_seed in any::<u64>(),
            seed in any::<u64>(),
        ) {
            // Every rank is claimed once, except that the last node repeats another's rank.
            let dup = 1 + pick % (world - 2);
            let mut claims: Vec<u32> = (1..world - 1).collect();
            claims.push(dup);
            let mut arrival: Vec<u32> = (1..world).collect();
            sim::Rng::new(arrival_seed).shuffle(&mut arrival);
            let mut nodes = nodes(LinkVariant::Ranked, world, arrival.clone(), &claims);
            let err = sim::run(&mut nodes, seed).unwrap_err();
            prop_assert_eq!(
                err,
                SimError::Comm { node: 0, error: CommError::DuplicatePeerRank { rank: dup } }
            );
            let SetupNode::Root(root) = &mut nodes[0] else { unreachable!() };
            // Whichever of the two claimants came second was rejected.
            let first = arrival.iter().position(|&n| n == dup).unwrap();
            let second = arrival.iter().position(|&n| n == world - 1).unwrap();
            prop_assert_eq!(root.joined.len(), first.max(second));
            prop_assert!(!root.setup.is_done());
            prop_assert!(!root.setup.wants_accept());
            prop_assert_eq!(root.setup.poll_event(), None);
            prop_assert_eq!(root.setup.poll_transmit(), None);
            let want = CommError::DuplicatePeerRank { rank: dup };
            prop_assert_eq!(root.setup.handle_input(b"x").unwrap_err(), want.clone());
            prop_assert_eq!(root.setup.handle_accepted().unwrap_err(), want.clone());
            prop_assert_eq!(root.setup.error(), Some(&want));
        }

        #[test]
        fn garbage_never_panics(
            world in 2u32..6,
            streams in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6),
            pieces in proptest::collection::vec(1usize..16, 1..32),
        ) {
            let mut setup = Rank0Setup::new(LinkVariant::Ranked, world, caps(0)).unwrap();
            let mut pieces = pieces.into_iter().cycle();
            for stream in &streams {
                while setup.poll_event().is_some() {}
                if setup.handle_accepted().is_err() {
                    break;
                }
                let mut at = 0;
                while at < stream.len() {
                    while setup.poll_transmit().is_some() {}
                    while setup.poll_event().is_some() {}
                    let end = (at + pieces.next().unwrap()).min(stream.len());
                    match setup.handle_input(&stream[at..end]) {
                        Ok(0) if !setup.wants_accept() && setup.poll_transmit().is_none()
                            && setup.poll_event().is_none() => break,
                        Ok(n) => at += n,
                        Err(_) => break,
                    }
                }
                let _ = setup.handle_close();
            }
            let _ = setup.into_result();
        }
    }

    /// Drives rank 0 by hand through one peer's handshake claiming `rank`.
    fn one_peer(setup: &mut Rank0Setup, rank: u32) -> Result<(), CommError> {
        assert_eq!(setup.poll_event(), Some(Rank0Event::Accept));
        setup.handle_accepted()?;
        assert_eq!(setup.wanted(), CAPS_SIZE);
        assert_eq!(setup.handle_input(&caps(rank))?, CAPS_SIZE);
        assert_eq!(setup.poll_transmit().unwrap().data.as_ref(), &caps(0));
        assert_eq!(
            setup.poll_event(),
            Some(Rank0Event::CapsExchanged {
                peer_caps: caps(rank)
            })
        );
        assert_eq!(setup.handle_input(&rank.to_le_bytes())?, 4);
        assert_eq!(
            setup.poll_event(),
            Some(Rank0Event::PeerJoined {
                rank,
                peer_caps: caps(rank)
            })
        );
        Ok(())
    }

    #[test]
    fn out_of_range_rank_fails() {
        for bad in [0, 3, 4, u32::MAX] {
            let mut setup = Rank0Setup::new(LinkVariant::Ranked, 3, caps(0)).unwrap();
            one_peer(&mut setup, 2).unwrap();
            let want = CommError::PeerRankOutOfRange {
                rank: bad,
                world: 3,
            };
            assert_eq!(one_peer(&mut setup, bad).unwrap_err(), want);
            assert_eq!(setup.error(), Some(&want));
            assert_eq!(setup.into_result().unwrap_err(), want);
        }
    }

    #[test]
    fn v8_setup_needs_no_rank_message() {
        let mut setup = Rank0Setup::new(LinkVariant::V8_0, 2, caps(0)).unwrap();
        assert!(setup.wants_accept());
        assert_eq!(setup.poll_event(), Some(Rank0Event::Accept));
        setup.handle_accepted().unwrap();
        let mut input = caps(1).to_vec();
        input.extend_from_slice(b"next stage");
        assert_eq!(setup.handle_input(&input).unwrap(), CAPS_SIZE);
        assert_eq!(setup.handle_input(&input[CAPS_SIZE..]).unwrap(), 0);
        assert!(setup.poll_transmit().is_some());
        assert_eq!(
            setup.poll_event(),
            Some(Rank0Event::CapsExchanged { peer_caps: caps(1) })
        );
        assert_eq!(
            setup.poll_event(),
            Some(Rank0Event::PeerJoined {
                rank: 1,
                peer_caps: caps(1)
            })
        );
        assert_eq!(setup.poll_event(), None);
        assert!(setup.is_done());
        assert_eq!(setup.handle_input(&input[CAPS_SIZE..]).unwrap(), 0);
        assert_eq!(setup.handle_close(), Ok(()));
        assert_eq!(
            setup.into_result().unwrap(),
            vec![JoinedPeer {
                rank: 1,
                peer_caps: caps(1)
            }]
        );
    }

    #[test]
    fn driver_misuse_and_truncation() {
        assert_eq!(
            Rank0Setup::new(LinkVariant::V8_0, 3, caps(0)).unwrap_err(),
            CommError::InvalidWorld { world: 3 }
        );
        assert!(Rank0Setup::new(LinkVariant::Ranked, 1, caps(0)).is_err());

        // Input before any accept.
        let mut setup = Rank0Setup::new(LinkVariant::Ranked, 3, caps(0)).unwrap();
        assert!(matches!(
            setup.handle_input(b"x"),
            Err(CommError::InvalidState { .. })
        ));

        // Accepting twice.
        let mut setup = Rank0Setup::new(LinkVariant::Ranked, 3, caps(0)).unwrap();
        setup.handle_accepted().unwrap();
        assert!(matches!(
            setup.handle_accepted(),
            Err(CommError::InvalidState { .. })
        ));

        // Close mid-handshake, at every cut of the stream.
        let mut stream = caps(2).to_vec();
        stream.extend_from_slice(&2u32.to_le_bytes());
        for cut in 0..stream.len() {
            let mut setup = Rank0Setup::new(LinkVariant::Ranked, 3, caps(0)).unwrap();
            one_peer(&mut setup, 1).unwrap();
            assert_eq!(setup.poll_event(), Some(Rank0Event::Accept));
            // Closing while waiting for an accept is fine.
            assert_eq!(setup.handle_close(), Ok(()));
            setup.handle_accepted().unwrap();
            let mut at = 0;
            while at < cut {
                let n = setup.handle_input(&stream[at..cut]).unwrap();
                while setup.poll_transmit().is_some() {}
                while setup.poll_event().is_some() {}
                at += n;
            }
            assert!(!setup.is_done());
            assert_eq!(
                setup.handle_close().unwrap_err(),
                CommError::ConnectionClosed { peer: None }
            );
            assert_eq!(
                setup.into_result().unwrap_err(),
                CommError::ConnectionClosed { peer: None }
            );
        }

        let setup = Rank0Setup::new(LinkVariant::Ranked, 3, caps(0)).unwrap();
        assert_eq!(setup.into_result().unwrap_err(), CommError::NotDone);
    }
}
