//! The peer handshake on one comm connection (PROTOCOL.md §6.2, §6.3 steps 2–4).
//!
//! Both variants start with the raw 24-byte `conn_caps` exchange, in an order that cannot
//! deadlock: the acceptor (rank 0) receives first, the connector (rank > 0) sends first. Each
//! side then applies the peer's caps, which may move the connection to RDMA, so every later byte
//! travels on the upgraded transport. The newest upstream link adds one more message after that:
//! the connector's rank as a u32 (LE), which the acceptor checks against the world size.
//!
//! ```text
//!            acceptor (rank 0)                connector (rank r)
//! V8_0:      recv caps, send caps, apply      send caps, recv caps, apply
//! Ranked:    ... apply, recv rank             ... apply, send rank
//! ```
//!
//! The machine walks that script one step at a time: it offers a transmit only when the current
//! step is a send, consumes input only when it is a receive, and stops at the "apply" step until
//! the driver has taken the [`HandshakeEvent::CapsExchanged`] event.

use bytes::Bytes;

use super::error::CommError;
use super::recv::RecvBuf;
use super::transmit::Transmit;

/// Size of a `conn_caps` block on the comm link (and in HELLO), PROTOCOL.md §10.2.
pub const CAPS_SIZE: usize = 24;

/// Size of the rank message of the newest upstream link (u32, little-endian).
pub const RANK_MSG_SIZE: usize = 4;

/// A 24-byte `conn_caps` block. All zeros means "TCP only".
pub type ConnCaps = [u8; CAPS_SIZE];

/// Which comm-link byte stream the servers speak; the two are not compatible (§6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkVariant {
    /// Protocol 8.0.0: exactly two ranks, caps exchange only.
    V8_0,
    /// The newest upstream change: two or more ranks, caps exchange then the connector's rank.
    Ranked,
}

/// Which end of the connection this machine plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandshakeRole {
    /// Rank 0, which accepted the connection and receives first.
    Acceptor,
    /// A rank > 0, which connected to rank 0 and sends first.
    Connector,
}

/// Something the driver must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeEvent {
    /// The caps exchange is complete. Apply `peer_caps` to the connection's transport now (it may
    /// switch to RDMA); every later byte on this connection uses the transport as applied.
    CapsExchanged {
        /// The caps the peer sent.
        peer_caps: ConnCaps,
    },
}

/// What a completed handshake established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeOutcome {
    /// The caps the peer sent.
    pub peer_caps: ConnCaps,
    /// The peer's rank: received and range-checked on a `Ranked` acceptor; implied otherwise
    /// (a connector's peer is rank 0; an 8.0.0 acceptor's peer is rank 1).
    pub peer_rank: u32,
}

/// One step of the reference's blocking sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    SendCaps,
    RecvCaps,
    /// Wait for the driver to take the `CapsExchanged` event (it applies the caps).
    Apply,
    SendRank,
    RecvRank,
}

// The four scripts, in the reference's order. The acceptor sends its caps before applying the
// peer's, the connector applies after receiving; either way the rank goes over the applied
// transport.
const ACCEPTOR_V8: &[Step] = &[Step::RecvCaps, Step::SendCaps, Step::Apply];
const ACCEPTOR_RANKED: &[Step] = &[Step::RecvCaps, Step::SendCaps, Step::Apply, Step::RecvRank];
const CONNECTOR_V8: &[Step] = &[Step::SendCaps, Step::RecvCaps, Step::Apply];
const CONNECTOR_RANKED: &[Step] = &[Step::SendCaps, Step::RecvCaps, Step::Apply, Step::SendRank];

/// The handshake of one comm connection, as a sans-IO state machine.
#[derive(Debug, Clone)]
pub struct Handshake {
    role: HandshakeRole,
    variant: LinkVariant,
    world: u32,
    /// Own rank (0 for the acceptor).
    rank: u32,
    local_caps: ConnCaps,
    script: &'static [Step],
    pos: usize,
    /// The receive of the current step (unused while the step is not a receive).
    recv: RecvBuf,
    peer_caps: Option<ConnCaps>,
    peer_rank: Option<u32>,
    error: Option<CommError>,
}

/// Checks the world size a variant allows.
fn check_world(variant: LinkVariant, world: u32) -> Result<(), CommError> {
    let ok = match variant {
        LinkVariant::V8_0 => world == 2,
        LinkVariant::Ranked => world >= 2,
    };
    if ok {
        Ok(())
    } else {
        Err(CommError::InvalidWorld {
            world: u64::from(world),
        })
    }
}

impl Handshake {
    /// Rank 0's side of one accepted connection.
    ///
    /// Fails if `world` is not allowed for `variant` (8.0.0: exactly 2; newest: at least 2).
    pub fn acceptor(
        variant: LinkVariant,
        world: u32,
        local_caps: ConnCaps,
    ) -> Result<Self, CommError> {
        check_world(variant, world)?;
        let script = match variant {
            LinkVariant::V8_0 => ACCEPTOR_V8,
            LinkVariant::Ranked => ACCEPTOR_RANKED,
        };
        Ok(Self::with_script(
            HandshakeRole::Acceptor,
            variant,
            world,
            0,
            local_caps,
            script,
        ))
    }

    /// The side of rank `rank` (> 0), which connected to rank 0.
    ///
    /// Fails if `world` is not allowed for `variant` or `rank` is not in `1..world`.
    pub fn connector(
        variant: LinkVariant,
        rank: u32,
        world: u32,
        local_caps: ConnCaps,
    ) -> Result<Self, CommError> {
        check_world(variant, world)?;
        if rank == 0 || rank >= world {
            return Err(CommError::InvalidRank { rank, world });
        }
        let script = match variant {
            LinkVariant::V8_0 => CONNECTOR_V8,
            LinkVariant::Ranked => CONNECTOR_RANKED,
        };
        Ok(Self::with_script(
            HandshakeRole::Connector,
            variant,
            world,
            rank,
            local_caps,
            script,
        ))
    }

    fn with_script(
        role: HandshakeRole,
        variant: LinkVariant,
        world: u32,
        rank: u32,
        local_caps: ConnCaps,
        script: &'static [Step],
    ) -> Self {
        let mut hs = Self {
            role,
            variant,
            world,
            rank,
            local_caps,
            script,
            pos: 0,
            recv: RecvBuf::default(),
            peer_caps: None,
            peer_rank: None,
            error: None,
        };
        hs.enter_step();
        hs
    }

    /// Which end this machine plays.
    pub fn role(&self) -> HandshakeRole {
        self.role
    }

    /// Which link variant this machine speaks.
    pub fn variant(&self) -> LinkVariant {
        self.variant
    }

    fn step(&self) -> Option<Step> {
        self.script.get(self.pos).copied()
    }

    /// Moves to the next step and prepares its receive, if it is one.
    fn advance(&mut self) {
        self.pos = self.pos.saturating_add(1);
        self.enter_step();
    }

    fn enter_step(&mut self) {
        self.recv = match self.step() {
            Some(Step::RecvCaps) => RecvBuf::new(CAPS_SIZE),
            Some(Step::RecvRank) => RecvBuf::new(RANK_MSG_SIZE),
            _ => RecvBuf::default(),
        };
    }

    fn fail(&mut self, e: CommError) -> CommError {
        self.error = Some(e.clone());
        e
    }

    /// Offers bytes received on this connection; returns how many were consumed.
    ///
    /// Only the current receive consumes: bytes offered while the machine still has to transmit
    /// or deliver an event are left to the caller (offer them again afterwards), and bytes after
    /// the last receive are the next stage's. Fails if the peer's rank is out of range.
    pub fn handle_input(&mut self, data: &[u8]) -> Result<usize, CommError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let n = self.recv.fill(data);
        if !self.recv.is_full() {
            return Ok(n);
        }
        match self.step() {
            Some(Step::RecvCaps) => {
                // Converting a full 24-byte receive cannot fail; treat a failure as "not yet".
                if let Ok(caps) = ConnCaps::try_from(self.recv.as_slice()) {
                    self.peer_caps = Some(caps);
                    self.advance();
                }
            }
            Some(Step::RecvRank) => {
                if let Ok(raw) = <[u8; RANK_MSG_SIZE]>::try_from(self.recv.as_slice()) {
                    let rank = u32::from_le_bytes(raw);
                    if rank == 0 || rank >= self.world {
                        return Err(self.fail(CommError::PeerRankOutOfRange {
                            rank,
                            world: self.world,
                        }));
                    }
                    self.peer_rank = Some(rank);
                    self.advance();
                }
            }
            // Not receiving: `fill` took nothing (an idle receive wants 0 bytes).
            _ => {}
        }
        Ok(n)
    }

    /// The next write to perform on this connection, if the protocol allows one now.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.error.is_some() {
            return None;
        }
        let data = match self.step()? {
            Step::SendCaps => Bytes::copy_from_slice(&self.local_caps),
            Step::SendRank => Bytes::copy_from_slice(&self.rank.to_le_bytes()),
            _ => return None,
        };
        self.advance();
        Some(Transmit { peer: None, data })
    }

    /// The next event for the driver. Taking [`HandshakeEvent::CapsExchanged`] is what lets the
    /// handshake continue (the driver applies the caps first).
    pub fn poll_event(&mut self) -> Option<HandshakeEvent> {
        if self.error.is_some() || self.step()? != Step::Apply {
            return None;
        }
        let peer_caps = self.peer_caps?;
        self.advance();
        Some(HandshakeEvent::CapsExchanged { peer_caps })
    }

    /// The connection closed (or failed). Before the handshake is complete that is an error.
    pub fn handle_close(&mut self) -> Result<(), CommError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.is_done() {
            Ok(())
        } else {
            Err(self.fail(CommError::ConnectionClosed { peer: None }))
        }
    }

    /// How many more bytes the current receive needs (0 when the machine is not receiving).
    /// Drivers that must read exact lengths (7.0.0-style RDMA) read this many.
    pub fn wanted(&self) -> usize {
        if self.error.is_some() {
            0
        } else {
            self.recv.remaining()
        }
    }

    /// Whether the handshake completed.
    pub fn is_done(&self) -> bool {
        self.error.is_none() && self.pos >= self.script.len()
    }

    /// The error the machine failed with, if any.
    pub fn error(&self) -> Option<&CommError> {
        self.error.as_ref()
    }

    /// The outcome, once the handshake completed.
    pub fn outcome(&self) -> Option<HandshakeOutcome> {
        if !self.is_done() {
            return None;
        }
        let peer_rank = match (self.role, self.variant) {
            (HandshakeRole::Connector, _) => 0,
            (HandshakeRole::Acceptor, LinkVariant::V8_0) => 1,
            (HandshakeRole::Acceptor, LinkVariant::Ranked) => self.peer_rank?,
        };
        Some(HandshakeOutcome {
            peer_caps: self.peer_caps?,
            peer_rank,
        })
    }

    /// The outcome; fails with the machine's error, or [`CommError::NotDone`].
    pub fn into_result(self) -> Result<HandshakeOutcome, CommError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.outcome().ok_or(CommError::NotDone)
    }
}

#[cfg(test)]
mod tests {
    use super::super::sim::{self, Node, SimError};
    use super::*;
    use proptest::prelude::*;

    fn caps(seed: u8) -> ConnCaps {
        let mut c = [0u8; CAPS_SIZE];
        for (i, b) in c.iter_mut().enumerate() {
            *b = seed.wrapping_mul(31).wrapping_add(i as u8);
        }
        c
    }

    /// What a driver saw, in order (consecutive consumes merged).
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Op {
        Consumed(usize),
        Sent(Vec<u8>),
        Event(HandshakeEvent),
    }

    fn push_consumed(trace: &mut Vec<Op>, n: usize) {
        if n == 0 {
            return;
        }
        if let Some(Op::Consumed(m)) = trace.last_mut() {
            *m += n;
        } else {
            trace.push(Op::Consumed(n));
        }
    }

    /// Drives one machine against a scripted peer stream delivered in `pieces`, the way a real
    /// driver does: drain transmits and events, offer everything pending, keep what is left.
    fn drive(hs: &mut Handshake, pieces: &[&[u8]]) -> (Vec<Op>, Vec<u8>, Result<(), CommError>) {
        let mut trace = Vec::new();
        let mut pending = Vec::new();
        let pump = |hs: &mut Handshake, pending: &mut Vec<u8>, trace: &mut Vec<Op>| loop {
            let mut moved = false;
            while let Some(t) = hs.poll_transmit() {
                assert_eq!(t.peer, None);
                trace.push(Op::Sent(t.data.to_vec()));
                moved = true;
            }
            while let Some(ev) = hs.poll_event() {
                trace.push(Op::Event(ev));
                moved = true;
            }
            let n = hs.handle_input(pending)?;
            assert!(n <= pending.len());
            pending.drain(..n);
            push_consumed(trace, n);
            if !moved && n == 0 {
                return Ok::<(), CommError>(());
            }
        };
        let mut result = pump(hs, &mut pending, &mut trace);
        for piece in pieces {
            if result.is_err() {
                break;
            }
            pending.extend_from_slice(piece);
            result = pump(hs, &mut pending, &mut trace);
        }
        (trace, pending, result)
    }

    struct Case {
        make: fn() -> Handshake,
        /// What the peer sends, followed by `surplus`.
        stream: Vec<u8>,
        surplus: Vec<u8>,
        trace: Vec<Op>,
        outcome: HandshakeOutcome,
    }

    const LOCAL: u8 = 7;
    const PEER: u8 = 9;
    const SURPLUS: &[u8] = &[0xaa, 0xbb, 0xcc, 0xdd, 0xee];

    fn cases() -> Vec<Case> {
        let ev = Op::Event(HandshakeEvent::CapsExchanged {
            peer_caps: caps(PEER),
        });
        let mut ranked_stream = caps(PEER).to_vec();
        ranked_stream.extend_from_slice(&5u32.to_le_bytes());
        vec![
            Case {
                make: || Handshake::acceptor(LinkVariant::V8_0, 2, caps(LOCAL)).unwrap(),
                stream: caps(PEER).to_vec(),
                surplus: SURPLUS.to_vec(),
                trace: vec![Op::Consumed(24), Op::Sent(caps(LOCAL).to_vec()), ev.clone()],
                outcome: HandshakeOutcome {
                    peer_caps: caps(PEER),
                    peer_rank: 1,
                },
            },
            Case {
                make: || Handshake::acceptor(LinkVariant::Ranked, 8, caps(LOCAL)).unwrap(),
                stream: ranked_stream,
                surplus: SURPLUS.to_vec(),
                trace: vec![
                    Op::Consumed(24),
                    Op::Sent(caps(LOCAL).to_vec()),
                    ev.clone(),
                    Op::Consumed(4),
                ],
                outcome: HandshakeOutcome {
                    peer_caps: caps(PEER),
                    peer_rank: 5,
                },
            },
            Case {
                make: || Handshake::connector(LinkVariant::V8_0, 1, 2, caps(LOCAL)).unwrap(),
                stream: caps(PEER).to_vec(),
                surplus: SURPLUS.to_vec(),
                trace: vec![Op::Sent(caps(LOCAL).to_vec()), Op::Consumed(24), ev.clone()],
                outcome: HandshakeOutcome {
                    peer_caps: caps(PEER),
                    peer_rank: 0,
                },
            },
            Case {
                make: || Handshake::connector(LinkVariant::Ranked, 3, 4, caps(LOCAL)).unwrap(),
                stream: caps(PEER).to_vec(),
                surplus: SURPLUS.to_vec(),
                trace: vec![
                    Op::Sent(caps(LOCAL).to_vec()),
                    Op::Consumed(24),
                    ev,
                    Op::Sent(3u32.to_le_bytes().to_vec()),
                ],
                outcome: HandshakeOutcome {
                    peer_caps: caps(PEER),
                    peer_rank: 0,
                },
            },
        ]
    }

    fn check(case: &Case, pieces: &[&[u8]]) {
        let mut hs = (case.make)();
        let (trace, leftover, result) = drive(&mut hs, pieces);
        result.unwrap();
        assert_eq!(trace, case.trace, "pieces {pieces:?}");
        assert_eq!(
            leftover, case.surplus,
            "surplus must be kept, pieces {pieces:?}"
        );
        assert!(hs.is_done());
        assert_eq!(hs.wanted(), 0);
        assert_eq!(hs.into_result().unwrap(), case.outcome);
    }

    #[test]
    fn every_two_and_three_piece_split() {
        for case in cases() {
            let mut full = case.stream.clone();
            full.extend_from_slice(&case.surplus);
            let len = full.len();
            for i in 0..=len {
                for j in i..=len {
                    let pieces = [&full[..i], &full[i..j], &full[j..]];
                    check(&case, &pieces);
                }
            }
        }
    }

    #[test]
    fn one_byte_at_a_time() {
        for case in cases() {
            let mut full = case.stream.clone();
            full.extend_from_slice(&case.surplus);
            let pieces: Vec<&[u8]> = full.chunks(1).collect();
            check(&case, &pieces);
        }
    }

    #[test]
    fn without_surplus_nothing_is_left() {
        for mut case in cases() {
            case.surplus.clear();
            let stream = case.stream.clone();
            check(&case, &[&stream]);
        }
    }

    #[test]
    fn connector_does_not_read_before_sending() {
        let mut hs = Handshake::connector(LinkVariant::Ranked, 1, 2, caps(1)).unwrap();
        assert_eq!(hs.wanted(), 0);
        assert_eq!(hs.handle_input(&caps(2)).unwrap(), 0);
        assert_eq!(hs.poll_event(), None);
        let t = hs.poll_transmit().unwrap();
        assert_eq!(&t.data[..], &caps(1));
        assert_eq!(
            hs.poll_transmit(),
            None,
            "rank goes only after the caps were applied"
        );
        assert_eq!(hs.wanted(), CAPS_SIZE);
        assert_eq!(hs.handle_input(&caps(2)).unwrap(), CAPS_SIZE);
        assert_eq!(hs.poll_transmit(), None, "caps not applied yet");
        assert_eq!(
            hs.poll_event(),
            Some(HandshakeEvent::CapsExchanged { peer_caps: caps(2) })
        );
        assert_eq!(
            hs.poll_transmit().unwrap().data.as_ref(),
            &1u32.to_le_bytes()
        );
        assert!(hs.is_done());
        assert_eq!(hs.poll_transmit(), None);
        assert_eq!(hs.poll_event(), None);
    }

    #[test]
    fn acceptor_sends_only_after_receiving() {
        let mut hs = Handshake::acceptor(LinkVariant::Ranked, 3, caps(1)).unwrap();
        assert_eq!(hs.poll_transmit(), None);
        assert_eq!(hs.handle_input(&caps(2)[..23]).unwrap(), 23);
        assert_eq!(hs.poll_transmit(), None);
        assert_eq!(hs.wanted(), 1);
        // Caps completed together with the rank: only the caps are taken for now.
        let mut rest = vec![caps(2)[23]];
        rest.extend_from_slice(&2u32.to_le_bytes());
        assert_eq!(hs.handle_input(&rest).unwrap(), 1);
        assert_eq!(
            hs.handle_input(&rest[1..]).unwrap(),
            0,
            "must send its caps first"
        );
        assert!(hs.poll_transmit().is_some());
        assert_eq!(
            hs.handle_input(&rest[1..]).unwrap(),
            0,
            "must apply caps first"
        );
        assert!(hs.poll_event().is_some());
        assert_eq!(hs.handle_input(&rest[1..]).unwrap(), 4);
        assert_eq!(hs.into_result().unwrap().peer_rank, 2);
    }

    #[test]
    fn constructor_validation() {
        use LinkVariant::*;
        let c = caps(0);
        assert_eq!(
            Handshake::acceptor(V8_0, 3, c).unwrap_err(),
            CommError::InvalidWorld { world: 3 }
        );
        assert!(Handshake::acceptor(V8_0, 1, c).is_err());
        assert!(Handshake::acceptor(Ranked, 1, c).is_err());
        assert!(Handshake::acceptor(Ranked, 0, c).is_err());
        assert!(Handshake::acceptor(Ranked, u32::MAX, c).is_ok());
        assert!(Handshake::connector(V8_0, 1, 2, c).is_ok());
        assert_eq!(
            Handshake::connector(V8_0, 0, 2, c).unwrap_err(),
            CommError::InvalidRank { rank: 0, world: 2 }
        );
        assert!(Handshake::connector(V8_0, 2, 2, c).is_err());
        assert!(Handshake::connector(V8_0, 1, 3, c).is_err());
        assert!(Handshake::connector(Ranked, 0, 4, c).is_err());
        assert!(Handshake::connector(Ranked, 4, 4, c).is_err());
        assert!(Handshake::connector(Ranked, 3, 4, c).is_ok());
        let hs = Handshake::connector(Ranked, 3, 4, c).unwrap();
        assert_eq!(hs.role(), HandshakeRole::Connector);
        assert_eq!(hs.variant(), Ranked);
    }

    /// Runs an acceptor of `world` against a peer stream claiming `rank`.
    fn acceptor_with_rank(world: u32, rank: u32) -> (Handshake, Result<(), CommError>) {
        let mut hs = Handshake::acceptor(LinkVariant::Ranked, world, caps(1)).unwrap();
        let mut stream = caps(2).to_vec();
        stream.extend_from_slice(&rank.to_le_bytes());
        let (_, _, result) = drive(&mut hs, &[&stream]);
        (hs, result)
    }

    #[test]
    fn bad_peer_ranks_fail_and_stay_failed() {
        for (world, rank) in [
            (2, 0),
            (2, 2),
            (4, 0),
            (4, 4),
            (4, 5),
            (4, u32::MAX),
            (2, 1 << 31),
        ] {
            let (mut hs, result) = acceptor_with_rank(world, rank);
            let want = CommError::PeerRankOutOfRange { rank, world };
            assert_eq!(result.unwrap_err(), want);
            assert!(!hs.is_done());
            assert_eq!(hs.error(), Some(&want));
            assert_eq!(hs.handle_input(b"x").unwrap_err(), want);
            assert_eq!(hs.poll_transmit(), None);
            assert_eq!(hs.poll_event(), None);
            assert_eq!(hs.handle_close().unwrap_err(), want);
            assert_eq!(hs.wanted(), 0);
            assert_eq!(hs.outcome(), None);
            assert_eq!(hs.into_result().unwrap_err(), want);
        }
        for (world, rank) in [(2, 1), (4, 1), (4, 3)] {
            let (hs, result) = acceptor_with_rank(world, rank);
            result.unwrap();
            assert_eq!(hs.into_result().unwrap().peer_rank, rank);
        }
    }

    #[test]
    fn truncated_streams_fail_on_close() {
        for case in cases() {
            for cut in 0..case.stream.len() {
                let mut hs = (case.make)();
                let (_, _, result) = drive(&mut hs, &[&case.stream[..cut]]);
                result.unwrap();
                assert!(!hs.is_done());
                assert_eq!(hs.clone().into_result().unwrap_err(), CommError::NotDone);
                assert_eq!(
                    hs.handle_close().unwrap_err(),
                    CommError::ConnectionClosed { peer: None }
                );
                assert!(hs.handle_input(&case.stream[cut..]).is_err());
            }
            let mut hs = (case.make)();
            let stream = case.stream.clone();
            drive(&mut hs, &[&stream]).2.unwrap();
            assert_eq!(hs.handle_close(), Ok(()));
            assert!(hs.is_done());
        }
    }

    /// Both ends of one connection as simulation nodes (node 0 accepts, node 1 connects).
    struct End {
        hs: Handshake,
        events: Vec<HandshakeEvent>,
    }

    impl Node for End {
        fn input(&mut self, _from: u32, data: &[u8]) -> Result<usize, CommError> {
            self.hs.handle_input(data)
        }
        fn transmit(&mut self) -> Option<(u32, Bytes)> {
            while let Some(ev) = self.hs.poll_event() {
                self.events.push(ev);
            }
            let to = match self.hs.role() {
                HandshakeRole::Acceptor => 1,
                HandshakeRole::Connector => 0,
            };
            self.hs.poll_transmit().map(|t| (to, t.data))
        }
        fn done(&self) -> bool {
            self.hs.is_done()
        }
    }

    proptest! {
        #[test]
        fn random_pieces(case_idx in 0usize..4, cuts in proptest::collection::vec(0usize..40, 0..12)) {
            let cases = cases();
            let case = &cases[case_idx];
            let mut full = case.stream.clone();
            full.extend_from_slice(&case.surplus);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(full.len())).collect();
            cuts.sort_unstable();
            let mut pieces: Vec<&[u8]> = Vec::new();
            let mut at = 0;
            for c in cuts {
                pieces.push(&full[at..c]);
                at = c;
            }
            pieces.push(&full[at..]);
            check(case, &pieces);
        }

        #[test]
        fn pair_completes_without_deadlock(
            ranked in any::<bool>(),
            world in 2u32..9,
            rank_pick in any::<u32>(),
            a in any::<u8>(),
            b in any::<u8>(),
            seed in any::<u64>(),
        ) {
            let (variant, world) = if ranked { (LinkVariant::Ranked, world) } else { (LinkVariant::V8_0, 2) };
            let rank = 1 + rank_pick % (world - 1);
            let mut nodes = [
                End { hs: Handshake::acceptor(variant, world, caps(a)).unwrap(), events: vec![] },
                End { hs: Handshake::connector(variant, rank, world, caps(b)).unwrap(), events: vec![] },
            ];
            let net = sim::run(&mut nodes, seed).unwrap();
            prop_assert!(net.pipes.values().all(Vec::is_empty));
            let acc = nodes[0].hs.outcome().unwrap();
            let con = nodes[1].hs.outcome().unwrap();
            prop_assert_eq!(acc, HandshakeOutcome { peer_caps: caps(b), peer_rank: rank });
            prop_assert_eq!(con, HandshakeOutcome { peer_caps: caps(a), peer_rank: 0 });
            prop_assert_eq!(&nodes[0].events, &vec![HandshakeEvent::CapsExchanged { peer_caps: caps(b) }]);
            prop_assert_eq!(&nodes[1].events, &vec![HandshakeEvent::CapsExchanged { peer_caps: caps(a) }]);
            // One write per message: caps, caps (+ rank).
            let lens: Vec<usize> = net.log.iter().map(|&(_, _, n)| n).collect();
            let want: Vec<usize> = if ranked { vec![24, 24, 4] } else { vec![24, 24] };
            prop_assert_eq!(lens, want);
            prop_assert_eq!(net.log[0].0, 1, "the connector sends first");
        }

        #[test]
        fn two_acceptors_stall_not_panic(seed in any::<u64>(), ranked in any::<bool>()) {
            // Misconfigured pairs must never progress into a bogus outcome.
            let variant = if ranked { LinkVariant::Ranked } else { LinkVariant::V8_0 };
            let mut nodes = [
                End { hs: Handshake::acceptor(variant, 2, caps(1)).unwrap(), events: vec![] },
                End { hs: Handshake::acceptor(variant, 2, caps(2)).unwrap(), events: vec![] },
            ];
            prop_assert_eq!(sim::run(&mut nodes, seed).unwrap_err(), SimError::Stalled);
        }

        #[test]
        fn garbage_never_panics(
            role in 0usize..4,
            world in 0u32..6,
            bytes in proptest::collection::vec(any::<u8>(), 0..80),
            cuts in proptest::collection::vec(0usize..80, 0..8),
            close in any::<bool>(),
        ) {
            let made = match role {
                0 => Handshake::acceptor(LinkVariant::V8_0, world, caps(0)),
                1 => Handshake::acceptor(LinkVariant::Ranked, world, caps(0)),
                2 => Handshake::connector(LinkVariant::V8_0, 1, world, caps(0)),
                _ => Handshake::connector(LinkVariant::Ranked, world.saturating_sub(1), world, caps(0)),
            };
            let Ok(mut hs) = made else { return Ok(()) };
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut pieces: Vec<&[u8]> = Vec::new();
            let mut at = 0;
            for c in cuts {
                pieces.push(&bytes[at..c]);
                at = c;
            }
            pieces.push(&bytes[at..]);
            let (_, leftover, result) = drive(&mut hs, &pieces);
            if result.is_ok() && hs.is_done() {
                prop_assert!(leftover.len() <= bytes.len());
            }
            if close {
                let _ = hs.handle_close();
            }
            let _ = hs.into_result();
        }
    }
}
