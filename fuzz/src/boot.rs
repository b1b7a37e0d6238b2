//! `bootstrap`: two modes, chosen by bit 7 of the first input byte ([`fuzz`]).
//!
//! * Star mode (bit 7 clear, this module): the rank-ordered bootstrap exchange
//!   ([`BootstrapExchange`]) run on every rank of a simulated star network, with an arbitrary
//!   world, block size, arrival order and splits, optionally with one misbehaving party. Input
//!   is offered as it arrives (more than `wanted()` too), so the machine's own checks are hit.
//! * Ranked mode (bit 7 set, [`crate::ranked`]): the whole set-up of the newest link (rank 0's
//!   accepts and handshakes, the vote, negotiation, the communicator's exchange) on every rank,
//!   sequenced as the shells drive it over blocking sockets.
//!
//! Star-mode input layout: `world: u8` (2 + w % 7; bit 7 clear), `size: u8` (modulo 65),
//! `salt: u8`, `kind: u8` (a [`Garbage`] kind, modulo 5), `a: u8`, `b: u8`, `len: u8`
//! (1 + len % 16 garbage bytes follow), the garbage bytes, then the schedule: pairs
//! `(pipe, piece)` choosing which non-empty connection delivers next and how much
//! (`piece < 128`: 1 + piece % 32 bytes, else all). Once the schedule runs out, connections
//! deliver whole, in order.

use std::collections::VecDeque;

use arbitrary::Unstructured;
use proto_core::comm::{BootstrapExchange, CommError};

use crate::{byte, ranked};

/// Runs one `bootstrap` input in the mode its first byte selects. Panics on a broken invariant.
pub fn fuzz(data: &[u8]) {
    if data.first().is_some_and(|b| b & ranked::MODE_BIT != 0) {
        ranked::run(data);
    } else {
        run(data);
    }
}

/// Caller's limit on `world · size`.
pub const LIMIT: usize = 1 << 20;

/// What goes wrong in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Garbage {
    /// Nothing: an honest run.
    None = 0,
    /// Peer `1 + a % (world − 1)` sends bytes after its block, before it got the array:
    /// rank 0 must fail with `UnexpectedData`.
    ExtraFromPeer = 1,
    /// Rank `a % world` gets input attributed to a rank that is not its peer, at schedule step
    /// `len % 8`: it must fail with `UnknownPeer`.
    WrongSender = 2,
    /// Rank `a % world` sees a connection close at schedule step `len % 8`: an error unless it
    /// was finished with that connection.
    EarlyClose = 3,
    /// Rank 0 sends bytes after the array to peer `1 + a % (world − 1)`: they belong to the next
    /// stage, so that peer must consume exactly the array and leave them.
    SurplusFromRoot = 4,
}

/// A decoded `bootstrap` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootInput {
    /// Number of ranks, 2..=8.
    pub world: u32,
    /// Bytes per rank, 0..=64.
    pub size: usize,
    /// Varies the blocks' contents.
    pub salt: u8,
    /// The misbehaviour.
    pub garbage: Garbage,
    /// Garbage parameter `a`.
    pub a: u8,
    /// Garbage parameter `b`.
    pub b: u8,
    /// Garbage parameter `len` (also the injection step).
    pub len: u8,
    /// The garbage bytes.
    pub bytes: Vec<u8>,
    /// The delivery schedule.
    pub schedule: Vec<u8>,
}

impl BootInput {
    /// Reads the layout.
    pub fn parse(data: &[u8]) -> BootInput {
        let mut u = Unstructured::new(data);
        let world = 2 + u32::from(byte(&mut u) % 7);
        let size = usize::from(byte(&mut u) % 65);
        let salt = byte(&mut u);
        let garbage = match byte(&mut u) % 5 {
            0 => Garbage::None,
            1 => Garbage::ExtraFromPeer,
            2 => Garbage::WrongSender,
            3 => Garbage::EarlyClose,
            _ => Garbage::SurplusFromRoot,
        };
        let (a, b, len) = (byte(&mut u), byte(&mut u), byte(&mut u));
        let bytes = (0..1 + len % 16).map(|_| byte(&mut u)).collect();
        BootInput { world, size, salt, garbage, a, b, len, bytes, schedule: u.take_rest().to_vec() }
    }

    /// Writes the layout (`bytes` must hold `1 + len % 16` bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![
            (self.world - 2) as u8,
            self.size as u8,
            self.salt,
            self.garbage as u8,
            self.a,
            self.b,
            self.len,
        ];
        out.extend_from_slice(&self.bytes);
        out.extend_from_slice(&self.schedule);
        out
    }
}

fn block(rank: u32, size: usize, salt: u8) -> Vec<u8> {
    (0..size)
        .map(|i| (rank as u8).wrapping_mul(101) ^ (i as u8).wrapping_mul(7) ^ salt)
        .collect()
}

/// One direction of one connection.
#[derive(Debug)]
struct Pipe {
    from: u32,
    to: u32,
    bytes: VecDeque<u8>,
    /// Offered and not consumed since the last change of any state.
    stuck: bool,
}

/// What a run ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootOutcome {
    /// Each rank's error, if it failed.
    pub errors: Vec<Option<CommError>>,
    /// Whether every rank finished.
    pub all_done: bool,
}

/// Runs one input. Panics on a broken invariant.
pub fn run(data: &[u8]) -> BootOutcome {
    let input = BootInput::parse(data);
    let (world, size) = (input.world, input.size);
    let blocks: Vec<Vec<u8>> = (0..world).map(|r| block(r, size, input.salt)).collect();
    let expected: Vec<u8> = blocks.concat();
    let mut nodes: Vec<BootstrapExchange> = (0..world)
        .map(|r| BootstrapExchange::new(r, world, blocks[r as usize].clone(), LIMIT).expect("valid"))
        .collect();
    // pipes[2(r−1)]: r → 0, pipes[2(r−1) + 1]: 0 → r.
    let mut pipes: Vec<Pipe> = (1..world)
        .flat_map(|r| {
            [
                Pipe { from: r, to: 0, bytes: VecDeque::new(), stuck: false },
                Pipe { from: 0, to: r, bytes: VecDeque::new(), stuck: false },
            ]
        })
        .collect();
    let pipe_of = |from: u32, to: u32| -> usize {
        if to == 0 {
            2 * (from as usize - 1)
        } else {
            2 * (to as usize - 1) + 1
        }
    };
    let peer = 1 + u32::from(input.a) % (world - 1);
    let victim = u32::from(input.a) % world;
    let inject_at = usize::from(input.len % 8);
    let mut sent_to = vec![false; world as usize];
    let mut peer_sent = false;
    let mut injected = false;
    let mut schedule = input.schedule.chunks_exact(2);
    let mut step = 0usize;

    loop {
        // Every rank writes what it has (rank 0 held back while a misbehaving peer's extra
        // bytes are in flight, so they reach it before it could have answered that peer).
        let mut changed = false;
        for r in 0..world {
            if r == 0
                && input.garbage == Garbage::ExtraFromPeer
                && (!peer_sent || !pipes[pipe_of(peer, 0)].bytes.is_empty())
                && nodes[0].error().is_none()
            {
                continue;
            }
            while let Some(transmit) = nodes[r as usize].poll_transmit() {
                let to = transmit.peer.expect("bootstrap transmits are addressed");
                assert!(to < world && to != r && (r == 0 || to == 0), "{r} sent to {to}");
                if r == 0 {
                    assert!(!sent_to[to as usize], "array sent twice to {to}");
                    sent_to[to as usize] = true;
                    assert_eq!(&transmit.data[..], &expected[..], "rank 0 broadcast a wrong array");
                    assert!(to == 1 || sent_to[to as usize - 1], "broadcast out of rank order");
                } else {
                    assert_eq!(&transmit.data[..], &blocks[r as usize][..]);
                }
                let pipe = &mut pipes[pipe_of(r, to)];
                pipe.bytes.extend(transmit.data.iter());
                if input.garbage == Garbage::ExtraFromPeer && r == peer {
                    pipe.bytes.extend(&input.bytes);
                    peer_sent = true;
                }
                if input.garbage == Garbage::SurplusFromRoot && r == 0 && to == peer {
                    pipe.bytes.extend(&input.bytes);
                }
                changed = true;
            }
        }
        if !injected && step >= inject_at {
            injected = true;
            changed |= inject(&input, &mut nodes, victim, &sent_to);
        }
        if changed {
            pipes.iter_mut().for_each(|p| p.stuck = false);
        }
        let open: Vec<usize> = (0..pipes.len())
            .filter(|&i| !pipes[i].stuck && !pipes[i].bytes.is_empty())
            .collect();
        if open.is_empty() {
            if injected || step >= inject_at {
                break;
            }
            step = inject_at;
            continue;
        }
        let (choice, piece) = match schedule.next() {
            Some(pair) => (usize::from(pair[0]) % open.len(), pair[1]),
            None => (0, u8::MAX),
        };
        step += 1;
        let pipe = &mut pipes[open[choice]];
        let len = if piece < 128 { 1 + usize::from(piece) % 32 } else { usize::MAX };
        let len = len.min(pipe.bytes.len());
        let offered: Vec<u8> = pipe.bytes.iter().take(len).copied().collect();
        let node = &mut nodes[pipe.to as usize];
        let wanted = node.wanted(pipe.from);
        match node.handle_input(pipe.from, &offered) {
            Ok(n) => {
                assert!(n <= offered.len() && n <= wanted, "consumed {n} of {len}, wanted {wanted}");
                pipe.bytes.drain(..n);
                if n == 0 {
                    pipe.stuck = true;
                } else {
                    pipes.iter_mut().for_each(|p| p.stuck = false);
                }
            }
            Err(error) => {
                assert_eq!(node.error(), Some(&error));
                assert_eq!(node.handle_input(pipe.from, &offered), Err(error.clone()), "sticky");
                assert!(node.poll_transmit().is_none(), "a failed rank transmits");
                pipe.stuck = true;
            }
        }
    }

    let errors: Vec<Option<CommError>> = nodes.iter().map(|n| n.error().cloned()).collect();
    let all_done = nodes.iter().all(BootstrapExchange::is_done);
    match input.garbage {
        Garbage::None | Garbage::SurplusFromRoot => {
            assert!(all_done, "an honest exchange did not finish: {errors:?}");
            for (r, node) in nodes.iter_mut().enumerate() {
                let r = r as u32;
                if r == 0 {
                    (1..world).for_each(|p| assert_eq!(node.handle_close(p), Ok(())));
                } else {
                    assert_eq!(node.handle_close(0), Ok(()));
                }
            }
            for (i, pipe) in pipes.iter().enumerate() {
                if input.garbage == Garbage::SurplusFromRoot && i == pipe_of(0, peer) {
                    assert!(pipe.bytes.iter().eq(input.bytes.iter()), "surplus consumed");
                } else {
                    assert!(pipe.bytes.is_empty(), "bytes left on {}→{}", pipe.from, pipe.to);
                }
            }
            for node in nodes {
                let gathered = node.into_result().expect("done");
                assert_eq!(gathered.as_bytes(), &expected[..], "ranks disagree");
                assert_eq!((gathered.world(), gathered.block_size()), (world, size));
                for r in 0..world {
                    assert_eq!(gathered.block(r), Some(&blocks[r as usize][..]));
                }
                assert_eq!(gathered.block(world), None);
            }
        }
        Garbage::ExtraFromPeer => {
            assert_eq!(errors[0], Some(CommError::UnexpectedData { peer }), "extra bytes accepted");
            assert!(nodes.into_iter().next().expect("rank 0").into_result().is_err());
        }
        Garbage::WrongSender | Garbage::EarlyClose => {
            assert!(injected);
            for node in nodes {
                let done = node.is_done();
                assert_eq!(node.into_result().is_ok(), done);
            }
        }
    }
    BootOutcome { errors, all_done }
}

/// Injects a [`Garbage::WrongSender`] or [`Garbage::EarlyClose`] event into `victim` and checks
/// its reaction. Returns whether state changed.
fn inject(
    input: &BootInput,
    nodes: &mut [BootstrapExchange],
    victim: u32,
    sent_to: &[bool],
) -> bool {
    let world = input.world;
    let node = &mut nodes[victim as usize];
    let failed_before = node.error().cloned();
    match input.garbage {
        Garbage::WrongSender => {
            let from = if victim == 0 {
                if input.b & 1 == 0 {
                    0
                } else {
                    world + u32::from(input.b >> 1)
                }
            } else {
                1 + u32::from(input.b)
            };
            let result = node.handle_input(from, &input.bytes);
            match failed_before {
                Some(error) => assert_eq!(result, Err(error)),
                None => assert_eq!(result, Err(CommError::UnknownPeer { peer: from })),
            }
            assert!(node.error().is_some());
            true
        }
        Garbage::EarlyClose => {
            let peer = if victim == 0 { 1 + u32::from(input.b) % (world - 1) } else { 0 };
            let finished = if victim == 0 { sent_to[peer as usize] } else { node.is_done() };
            let result = node.handle_close(peer);
            match (failed_before, finished) {
                (Some(error), _) => assert_eq!(result, Err(error)),
                (None, true) => assert_eq!(result, Ok(())),
                (None, false) => {
                    assert_eq!(result, Err(CommError::ConnectionClosed { peer: Some(peer) }))
                }
            }
            true
        }
        _ => false,
    }
}
