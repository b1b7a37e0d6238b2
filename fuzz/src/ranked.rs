//! `bootstrap`, ranked mode: the whole set-up of the newest upstream comm link (PROTOCOL.md
//! §6.3) run in memory on every rank, sequenced the way `shell_common::comm_link::ranked`
//! drives the machines over blocking sockets.
//!
//! * Rank 0 runs [`Rank0Setup`]: it accepts the queued connections one at a time, in the
//!   fuzzer's arrival order, and completes each handshake before accepting the next; every
//!   rank r > 0 runs a [`Handshake::connector`] of the ranked link on its own connection (it
//!   connected and sent its caps before anything else happened).
//! * Then every rank runs the vote exchange (one [`BootstrapExchange`] of 1 byte per rank, the
//!   fuzzer's votes), calls [`negotiate`], and on the backend-communicator path runs a second
//!   exchange of 14-byte blocks (`ip (4) | port (2, LE) | token (8, LE)`, the CPU
//!   communicator's set-up in `backend-cpu/src/ring.rs`). On success with the backend
//!   communicator every comm socket closes; the pairwise path (world 2) keeps its socket.
//! * Every read is a blocking read as the shell does it: the machine says how many bytes it
//!   `wanted()`, the read returns between 1 and that many of the bytes in flight (the fuzzer
//!   picks how many), and they are offered until consumed; rank 0 of an exchange reads the
//!   peers in rank order. A read on a closed connection is EOF (the machine's `handle_close`),
//!   on a connection still queued when rank 0 closed its listener a reset. Writes never block;
//!   a write to a connection whose reader closed is dropped.
//! * A failed rank drops its sockets (rank 0: every peer connection and the listener), which
//!   the others see as EOF or reset.
//!
//! Input layout (the first byte's bit 7 selects this mode; the star mode of [`crate::boot`]
//! never sets it): `0x80 | w` (world `2 + w % 7`, the bits 0..=6), `votes: u8` (rank r votes
//! yes when bit r is set), `salt: u8` (varies the 14-byte blocks), `fault: u8` (a [`Fault`],
//! modulo 6), `a: u8`, `b: u8`, `c: u8` (the fault's parameters), `len: u8` (`len % 64` fault
//! bytes follow), the fault bytes, one arrival byte per connection (the next connection to
//! queue at rank 0 is `byte % remaining`, from the peers in rank order and the stranger last),
//! then the schedule: pairs `(node, piece)` choosing which blocked rank whose read (or rank 0's
//! accept) can complete goes next and how much it gets (`piece < 128`: up to `1 + piece % 32`
//! bytes, else all it wants). Once the schedule runs out, the lowest such rank reads everything
//! it wants.
//!
//! Invariants checked (a panic is a finding):
//! * no machine consumes more than it `wanted()`: the shell offers at most that many, every
//!   such offer is consumed whole (else the shell would fail with `OutOfTurn`), and a clone of
//!   the machine offered everything in flight never takes more either; a rank never waits on
//!   nothing (`wanted() == 0` while not done); errors stick;
//! * honest runs (any arrival order, split and votes) end on every rank with the same path and
//!   identical arrays, equal to the blocks in rank order, or with `PairwiseNeedsTwoRanks` on
//!   every rank (a no vote at world > 2), and leave no byte in flight;
//! * a hang (every unfinished rank waits on a connection with nothing in flight) is a finding,
//!   except for the faults the machines cannot detect ([`Fault::WorldMismatch`] with the true
//!   rank, [`Fault::Inject`] towards a peer), where the shell's comm timeout ends it and is
//!   modelled as [`CommError::Timeout`] on every waiting rank;
//! * each fault ends as documented on [`Fault`], with the exact [`CommError`] where one is
//!   determined; a run takes a bounded number of steps.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::ErrorKind;

use arbitrary::Unstructured;
use proto_core::comm::{
    negotiate, path_offer, BootstrapExchange, CommError, Handshake, LinkVariant, Path, Rank0Event,
    Rank0Setup, CAPS_SIZE, RANK_MSG_SIZE,
};

use crate::byte;

/// Bit of the first input byte that selects this mode.
pub const MODE_BIT: u8 = 0x80;
/// Bytes per rank of the communicator exchange (backend-cpu's ring set-up block).
pub const COMM_BLOCK: usize = 14;
/// The shells' limit on one exchange.
const LIMIT: usize = 1 << 20;
/// Bound on scheduler steps (every step consumes a byte or ends a read for good).
const MAX_STEPS: usize = 100_000;
/// Bytes a stranger needs to pass for a peer through the vote exchange: caps, rank, vote.
const THROUGH_VOTE: usize = CAPS_SIZE + RANK_MSG_SIZE + 1;

/// What goes wrong in a run (at most one thing). `p` is the peer `1 + a % (world − 1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: an honest run.
    None = 0,
    /// One more connection than peers, queued at arrival position given by the arrival bytes,
    /// sends the fault bytes and closes. Queued last it is never accepted (honest outcome).
    /// Otherwise rank 0 reads it as a peer: fewer than 28 bytes fail with
    /// `ConnectionClosed { peer: None }`, a rank out of range with `PeerRankOutOfRange`, a rank
    /// seen before with `DuplicatePeerRank`; an unused rank passes (the machines cannot tell a
    /// stranger that speaks the protocol from a peer): the stranger takes that rank's slot,
    /// the displaced peer is reset when the listener closes, and rank 0 either fails with
    /// `ConnectionClosed { peer: Some(rank) }` where the stranger's bytes run out, or ends with
    /// its vote and block in the arrays that every other peer gets too.
    Stranger = 1,
    /// Peer `p` announces a wrong rank (`b % 3`: 0 → rank 0; 1 → another peer's rank, the
    /// `(b / 3) % (world − 2)`-th of them (at world 2 there is none: as 2); 2 → `world + c`, or
    /// `u32::MAX` for `c == 255`): rank 0 fails with `PeerRankOutOfRange` or
    /// `DuplicatePeerRank` (whichever of the two connections comes second), every rank fails.
    BadRank = 2,
    /// Peer `p` was configured with world `W' ≠ world` (`2 + (world − 1 + b % 7) % 8`) and
    /// rank `r' = p` when `c` is even and `p < W'`, else `1 + (c / 2) % (W' − 1)`. An `r'` out
    /// of range or not `p` fails rank 0 with `PeerRankOutOfRange` / `DuplicatePeerRank` (the
    /// only place a rank is checked). With `r' = p` nothing on the wire carries the world, so
    /// the machines cannot detect it: every block has the same size on every rank, so rank 0
    /// gathers correctly, but the peer expects `W'` bytes per array. With `W' > world` it
    /// waits for bytes rank 0 never sends (a hang the comm timeout ends, for rank 0 too when
    /// it then waits for that peer's communicator block); with `W' < world` it leaves the
    /// rest of the array unread, so its next read is shifted: it may take another path,
    /// fail, or finish with wrong arrays. Every other rank that finishes has the honest result.
    WorldMismatch = 3,
    /// The fault bytes are written ahead of a block (`b & 1`: 0 the peer's block to rank 0,
    /// 1 rank 0's array to the peer; `b & 2`: 0 vote exchange, 2 communicator exchange) on
    /// `p`'s connection. The link has no framing and every read takes exactly what the
    /// machine wants, so this is undetectable: towards rank 0 the bytes become `p`'s vote or
    /// block, and every rank ends with the same path and the same arrays (honest except for
    /// `p`'s entries); towards `p` only `p` is misled (it may fail, hang until the timeout,
    /// or finish with wrong arrays) and every other rank that finishes has the honest result.
    Inject = 4,
    /// Rank `a % world` crashes (drops every socket) at scheduler step `b`. A crashed peer
    /// fails rank 0 with `ConnectionClosed` (`peer: None` before its rank message arrived,
    /// `Some(p)` in an exchange it had not sent its block for) and every peer with it;
    /// after its last block rank 0 finishes. A crashed rank 0 leaves finished exactly the
    /// peers it had sent everything to; the others fail on EOF or reset. Never a hang.
    Crash = 5,
}

const FAULTS: u8 = 6;

/// A decoded ranked-mode input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankedInput {
    /// Number of ranks, 2..=8.
    pub world: u32,
    /// Bit r: rank r votes yes.
    pub votes: u8,
    /// Varies the communicator blocks.
    pub salt: u8,
    /// The fault.
    pub fault: Fault,
    /// Fault parameter `a`.
    pub a: u8,
    /// Fault parameter `b`.
    pub b: u8,
    /// Fault parameter `c`.
    pub c: u8,
    /// The fault bytes (at most 63).
    pub bytes: Vec<u8>,
    /// One byte per queued connection.
    pub arrival: Vec<u8>,
    /// The delivery schedule.
    pub schedule: Vec<u8>,
}

impl RankedInput {
    /// Reads the layout (the mode bit is not checked).
    pub fn parse(data: &[u8]) -> RankedInput {
        let mut u = Unstructured::new(data);
        let world = 2 + u32::from(byte(&mut u) & !MODE_BIT) % 7;
        let votes = byte(&mut u);
        let salt = byte(&mut u);
        let fault = match byte(&mut u) % FAULTS {
            0 => Fault::None,
            1 => Fault::Stranger,
            2 => Fault::BadRank,
            3 => Fault::WorldMismatch,
            4 => Fault::Inject,
            _ => Fault::Crash,
        };
        let (a, b, c, len) = (byte(&mut u), byte(&mut u), byte(&mut u), byte(&mut u));
        let bytes = (0..len % 64).map(|_| byte(&mut u)).collect();
        let clients = world as usize - 1 + usize::from(fault == Fault::Stranger);
        let arrival = (0..clients).map(|_| byte(&mut u)).collect();
        RankedInput {
            world,
            votes,
            salt,
            fault,
            a,
            b,
            c,
            bytes,
            arrival,
            schedule: u.take_rest().to_vec(),
        }
    }

    /// Writes the layout (`bytes` at most 63, `arrival` one byte per connection).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![
            MODE_BIT | (self.world - 2) as u8,
            self.votes,
            self.salt,
            self.fault as u8,
            self.a,
            self.b,
            self.c,
            self.bytes.len() as u8,
        ];
        out.extend_from_slice(&self.bytes);
        out.extend_from_slice(&self.arrival);
        out.extend_from_slice(&self.schedule);
        out
    }

    /// The peer the fault is about.
    pub fn target(&self) -> u32 {
        1 + u32::from(self.a) % (self.world - 1)
    }

    fn vote(&self, rank: u32) -> u8 {
        path_offer(rank < 8 && self.votes & (1 << rank) != 0)
    }
}

/// The CPU communicator's block for `rank`: `ip | port (LE) | token (LE)`.
pub fn comm_block(rank: u32, salt: u8) -> Vec<u8> {
    let mut block = vec![10, salt, 0, rank as u8];
    block.extend_from_slice(&(40000u16 + rank as u16 * 7 + u16::from(salt)).to_le_bytes());
    let token = (u64::from(rank) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(salt);
    block.extend_from_slice(&token.to_le_bytes());
    block
}

/// How one rank ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Still waiting (only while running).
    Running,
    /// Pairwise path (world 2), after the given votes.
    Pairwise {
        /// The gathered votes.
        votes: Vec<u8>,
    },
    /// Backend-communicator path, with both gathered arrays.
    Communicator {
        /// The gathered votes.
        votes: Vec<u8>,
        /// The gathered 14-byte blocks.
        blocks: Vec<u8>,
    },
    /// The set-up failed.
    Failed(CommError),
    /// The fault crashed this rank.
    Crashed,
}

impl End {
    /// Whether the set-up succeeded.
    pub fn is_ok(&self) -> bool {
        matches!(self, End::Pairwise { .. } | End::Communicator { .. })
    }

    /// The error, if it failed.
    pub fn error(&self) -> Option<&CommError> {
        match self {
            End::Failed(e) => Some(e),
            _ => None,
        }
    }
}

/// What a run ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankedOutcome {
    /// Each rank's end (index = the rank the process was started as).
    pub ends: Vec<End>,
    /// What an honest run ends with on every rank.
    pub honest: End,
    /// Whether a hang was ended by the modelled comm timeout.
    pub timed_out: bool,
    /// Scheduler steps taken.
    pub steps: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Client (a peer or the stranger) → rank 0.
    Up,
    /// Rank 0 → client.
    Down,
}

#[derive(Debug, Default)]
struct Pipe {
    bytes: VecDeque<u8>,
    /// The writer closed: EOF once `bytes` are read.
    closed: bool,
    /// The reader gets a reset.
    reset: bool,
    /// The reader closed: writes are dropped.
    reader_gone: bool,
    /// Bytes written that the reader could get.
    written: usize,
}

#[derive(Debug, Default)]
struct Conn {
    up: Pipe,
    down: Pipe,
}

impl Conn {
    fn pipe(&mut self, dir: Dir) -> &mut Pipe {
        match dir {
            Dir::Up => &mut self.up,
            Dir::Down => &mut self.down,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Vote,
    Comm,
}

#[derive(Debug)]
enum State {
    /// Rank 0 accepting its peers.
    Setup {
        setup: Box<Rank0Setup>,
        current: Option<usize>,
        joined: BTreeMap<u32, usize>,
    },
    /// A peer's handshake; `lie` replaces its rank message.
    Handshake {
        hs: Box<Handshake>,
        lie: Option<u32>,
    },
    /// One exchange; `streams[i]` is the connection to rank `i + 1` on rank 0, to rank 0 on a peer.
    Exchange {
        stage: Stage,
        ex: Box<BootstrapExchange>,
        votes: Vec<u8>,
    },
    Over(End),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    None,
    Accept,
    Read {
        conn: usize,
        dir: Dir,
        from: u32,
        max: usize,
    },
}

#[derive(Debug)]
struct Node {
    /// The rank this process believes it has, and its world.
    rank: u32,
    world: u32,
    vote: u8,
    block: Vec<u8>,
    /// Rank 0: connections by peer rank (after the set-up); a peer: its one connection.
    streams: Vec<usize>,
    state: State,
    wait: Wait,
}

struct Sim {
    input: RankedInput,
    world: u32,
    nodes: Vec<Node>,
    conns: Vec<Conn>,
    /// Queued connections not accepted yet, in arrival order.
    backlog: VecDeque<usize>,
    listening: bool,
    /// `(conn, dir, stage)` whose first block gets the fault bytes in front, until written.
    inject: Option<(usize, Dir, Stage)>,
}

fn is_eof_error(e: &CommError) -> bool {
    matches!(
        e,
        CommError::ConnectionClosed { .. }
            | CommError::Socket {
                kind: ErrorKind::ConnectionReset
            }
    )
}

impl Sim {
    fn write(&mut self, conn: usize, dir: Dir, stage: Option<Stage>, data: &[u8]) {
        if let (Some((c, d, s)), Some(stage)) = (self.inject, stage) {
            if (c, d, s) == (conn, dir, stage) {
                self.inject = None;
                let garbage = self.input.bytes.clone();
                self.write(conn, dir, None, &garbage);
            }
        }
        let pipe = self.conns[conn].pipe(dir);
        assert!(!pipe.closed, "write after close");
        if !pipe.reader_gone {
            pipe.bytes.extend(data);
            pipe.written += data.len();
        }
    }

    /// The client end of `conn` closes (a peer or the stranger).
    fn close_client(&mut self, conn: usize) {
        let c = &mut self.conns[conn];
        c.up.closed = true;
        c.down.reader_gone = true;
        c.down.bytes.clear();
    }

    /// Rank 0 drops every socket: its connections and the listener (queued ones are reset).
    fn close_root(&mut self) {
        self.close_listener();
        for conn in 0..self.conns.len() {
            let c = &mut self.conns[conn];
            if !c.down.reset {
                c.down.closed = true;
                c.up.reader_gone = true;
                c.up.bytes.clear();
            }
        }
    }

    fn close_listener(&mut self) {
        self.listening = false;
        while let Some(conn) = self.backlog.pop_front() {
            let c = &mut self.conns[conn];
            c.down.reset = true;
            c.up.reader_gone = true;
            c.up.bytes.clear();
        }
    }

    /// Ends node `i` (closing its sockets unless it keeps the pairwise link).
    fn end(&mut self, i: usize, end: End) {
        let keep = matches!(end, End::Pairwise { .. });
        self.nodes[i].state = State::Over(end);
        self.nodes[i].wait = Wait::None;
        if keep {
            return;
        }
        if i == 0 {
            self.close_root();
        } else {
            let conn = self.nodes[i].streams[0];
            self.close_client(conn);
        }
    }

    fn fail(&mut self, i: usize, e: CommError) {
        self.end(i, End::Failed(e));
    }

    /// Runs node `i` as the shell does until it blocks or ends.
    fn run_node(&mut self, i: usize) {
        loop {
            let node = &mut self.nodes[i];
            match &mut node.state {
                State::Over(_) => {
                    node.wait = Wait::None;
                    return;
                }
                State::Setup {
                    setup,
                    current,
                    joined,
                } => {
                    // Star::accept: transmits, events (accept blocks), done, else read.
                    let mut writes = Vec::new();
                    if let Some(conn) = *current {
                        while let Some(t) = setup.poll_transmit() {
                            assert_eq!(t.peer, None);
                            writes.push((conn, t.data));
                        }
                    }
                    let mut progressed = !writes.is_empty();
                    let mut accept = false;
                    while let Some(event) = setup.poll_event() {
                        progressed = true;
                        match event {
                            Rank0Event::Accept => {
                                assert!(setup.wants_accept());
                                accept = true;
                                break;
                            }
                            Rank0Event::CapsExchanged { .. } => {}
                            Rank0Event::PeerJoined { rank, .. } => {
                                let conn = current
                                    .take()
                                    .expect("a peer joined without a current connection");
                                assert!(
                                    rank >= 1 && rank < node.world,
                                    "joined rank {rank} out of range"
                                );
                                assert!(
                                    joined.insert(rank, conn).is_none(),
                                    "rank {rank} joined twice"
                                );
                            }
                        }
                    }
                    let done = setup.is_done();
                    let wanted = setup.wanted();
                    let current = *current;
                    let joined = joined.clone();
                    for (conn, data) in writes {
                        self.write(conn, Dir::Down, None, &data);
                    }
                    if accept {
                        self.nodes[i].wait = Wait::Accept;
                        return;
                    }
                    if done {
                        assert_eq!(joined.len(), self.world as usize - 1);
                        self.close_listener();
                        self.nodes[i].streams = joined.into_values().collect();
                        self.start_exchange(i, Stage::Vote);
                        continue;
                    }
                    if progressed {
                        continue;
                    }
                    let conn = current.expect("rank 0 set-up waits on nothing (no connection)");
                    assert!(wanted > 0, "rank 0 set-up waits on nothing");
                    self.nodes[i].wait = Wait::Read {
                        conn,
                        dir: Dir::Up,
                        from: 0,
                        max: wanted,
                    };
                    return;
                }
                State::Handshake { hs, lie } => {
                    // drive_handshake.
                    let conn = node.streams[0];
                    let mut writes = Vec::new();
                    while let Some(t) = hs.poll_transmit() {
                        let mut data = t.data.to_vec();
                        if let (Some(lie), RANK_MSG_SIZE) = (*lie, data.len()) {
                            data = lie.to_le_bytes().to_vec();
                        }
                        writes.push(data);
                    }
                    let mut progressed = !writes.is_empty();
                    while hs.poll_event().is_some() {
                        progressed = true;
                    }
                    let done = hs.is_done();
                    let wanted = hs.wanted();
                    for data in writes {
                        self.write(conn, Dir::Up, None, &data);
                    }
                    if done {
                        self.start_exchange(i, Stage::Vote);
                        continue;
                    }
                    if progressed {
                        continue;
                    }
                    assert!(wanted > 0, "handshake waits on nothing");
                    self.nodes[i].wait = Wait::Read {
                        conn,
                        dir: Dir::Down,
                        from: 0,
                        max: wanted,
                    };
                    return;
                }
                State::Exchange { stage, ex, votes } => {
                    // Star::exchange.
                    let stage = *stage;
                    let mut writes = Vec::new();
                    while let Some(t) = ex.poll_transmit() {
                        let peer = t.peer.expect("bootstrap transmits are addressed");
                        writes.push((peer, t.data));
                    }
                    let result = if ex.is_done() {
                        Some(
                            ex.as_ref()
                                .clone()
                                .into_result()
                                .expect("done")
                                .into_bytes()
                                .to_vec(),
                        )
                    } else {
                        None
                    };
                    let from = (0..node.world).find(|&peer| ex.wanted(peer) > 0);
                    let wanted = from.map(|f| ex.wanted(f));
                    let votes = votes.clone();
                    let (rank, world) = (node.rank, node.world);
                    for (peer, data) in writes {
                        let (conn, dir) = self.stream(i, peer);
                        self.write(conn, dir, Some(stage), &data);
                    }
                    if let Some(gathered) = result {
                        let block = if stage == Stage::Vote { 1 } else { COMM_BLOCK };
                        assert_eq!(gathered.len(), world as usize * block);
                        match stage {
                            Stage::Vote => match negotiate(&gathered) {
                                Ok(Path::Pairwise) => {
                                    assert_eq!(world, 2, "pairwise above two ranks");
                                    self.end(i, End::Pairwise { votes: gathered });
                                }
                                Ok(Path::BackendCommunicator) => {
                                    assert!(gathered.iter().all(|&v| v != 0));
                                    if let State::Exchange { votes, .. } = &mut self.nodes[i].state
                                    {
                                        *votes = gathered;
                                    }
                                    self.start_exchange(i, Stage::Comm);
                                }
                                Err(e) => {
                                    assert_eq!(
                                        e,
                                        CommError::PairwiseNeedsTwoRanks {
                                            world: u64::from(world)
                                        }
                                    );
                                    self.fail(i, e);
                                }
                            },
                            Stage::Comm => self.end(
                                i,
                                End::Communicator {
                                    votes,
                                    blocks: gathered,
                                },
                            ),
                        }
                        continue;
                    }
                    let from = from.unwrap_or_else(|| {
                        panic!("rank {rank}: bootstrap exchange waits on nothing")
                    });
                    let (conn, dir) = self.stream(i, from);
                    let dir = match dir {
                        Dir::Up => Dir::Down,
                        Dir::Down => Dir::Up,
                    };
                    self.nodes[i].wait = Wait::Read {
                        conn,
                        dir,
                        from,
                        max: wanted.expect("wanted"),
                    };
                    return;
                }
            }
        }
    }

    /// The connection node `i` uses to talk to `peer`, and the direction it writes in.
    fn stream(&self, i: usize, peer: u32) -> (usize, Dir) {
        let node = &self.nodes[i];
        if i == 0 {
            assert!(
                peer >= 1 && peer < node.world,
                "rank 0 addressed rank {peer}"
            );
            (node.streams[peer as usize - 1], Dir::Down)
        } else {
            assert_eq!(peer, 0, "a peer addressed rank {peer}");
            (node.streams[0], Dir::Up)
        }
    }

    fn start_exchange(&mut self, i: usize, stage: Stage) {
        let node = &mut self.nodes[i];
        let block = match stage {
            Stage::Vote => vec![node.vote],
            Stage::Comm => node.block.clone(),
        };
        let votes = match &node.state {
            State::Exchange { votes, .. } => votes.clone(),
            _ => Vec::new(),
        };
        let ex =
            BootstrapExchange::new(node.rank, node.world, block, LIMIT).expect("valid exchange");
        node.state = State::Exchange {
            stage,
            ex: Box::new(ex),
            votes,
        };
    }

    /// Whether node `i`'s wait can complete now.
    fn runnable(&self, i: usize) -> bool {
        match self.nodes[i].wait {
            Wait::None => false,
            Wait::Accept => {
                assert!(
                    self.listening && !self.backlog.is_empty(),
                    "rank 0 accepts with nothing queued"
                );
                true
            }
            Wait::Read { conn, dir, .. } => {
                let c = &self.conns[conn];
                let pipe = if dir == Dir::Up { &c.up } else { &c.down };
                !pipe.bytes.is_empty() || pipe.closed || pipe.reset
            }
        }
    }

    /// Completes node `i`'s wait with at most `piece` bytes.
    fn deliver(&mut self, i: usize, piece: usize) {
        match self.nodes[i].wait {
            Wait::None => unreachable!(),
            Wait::Accept => {
                let conn = self.backlog.pop_front().expect("queued");
                if let State::Setup { setup, current, .. } = &mut self.nodes[i].state {
                    *current = Some(conn);
                    if let Err(e) = setup.handle_accepted() {
                        panic!("accept refused: {e}");
                    }
                }
            }
            Wait::Read {
                conn,
                dir,
                from,
                max,
            } => {
                let pipe = self.conns[conn].pipe(dir);
                if pipe.reset && pipe.bytes.is_empty() {
                    self.fail(
                        i,
                        CommError::Socket {
                            kind: ErrorKind::ConnectionReset,
                        },
                    );
                    return;
                }
                if pipe.bytes.is_empty() {
                    assert!(pipe.closed);
                    let result = self.machine_close(i, from);
                    self.fail(i, result);
                    return;
                }
                let n = piece.min(max).min(pipe.bytes.len());
                let all: Vec<u8> = pipe.bytes.iter().copied().collect();
                pipe.bytes.drain(..n);
                if let Err(e) = self.offer(i, from, &all[..n], &all) {
                    self.fail(i, e);
                    return;
                }
            }
        }
        self.nodes[i].wait = Wait::None;
        self.run_node(i);
    }

    /// EOF on the read node `i` waits for: the machine's `handle_close` (which must fail), then
    /// the shell's error.
    fn machine_close(&mut self, i: usize, from: u32) -> CommError {
        let (result, want) = match &mut self.nodes[i].state {
            State::Setup { setup, .. } => (
                setup.handle_close(),
                CommError::ConnectionClosed { peer: None },
            ),
            State::Handshake { hs, .. } => (
                hs.handle_close(),
                CommError::ConnectionClosed { peer: None },
            ),
            State::Exchange { ex, .. } => (
                ex.handle_close(from),
                CommError::ConnectionClosed { peer: Some(from) },
            ),
            State::Over(_) => unreachable!(),
        };
        assert_eq!(
            result,
            Err(want.clone()),
            "close while a receive is pending"
        );
        want
    }

    /// The shell's `io::offer` of `data` (at most `wanted()`), after probing a clone of the
    /// machine with everything in flight (`all`).
    fn offer(&mut self, i: usize, from: u32, data: &[u8], all: &[u8]) -> Result<(), CommError> {
        let state = &mut self.nodes[i].state;
        let wanted = match state {
            State::Setup { setup, .. } => setup.wanted(),
            State::Handshake { hs, .. } => hs.wanted(),
            State::Exchange { ex, .. } => ex.wanted(from),
            State::Over(_) => unreachable!(),
        };
        assert!(
            !data.is_empty() && data.len() <= wanted,
            "the shell offers 1..=wanted bytes"
        );
        // A clone offered more than it wants takes at most what it wants.
        let probe = match state {
            State::Setup { setup, .. } => setup.as_ref().clone().handle_input(all),
            State::Handshake { hs, .. } => hs.as_ref().clone().handle_input(all),
            State::Exchange { ex, .. } => ex.as_ref().clone().handle_input(from, all),
            State::Over(_) => unreachable!(),
        };
        if let Ok(n) = probe {
            assert!(
                n <= wanted,
                "consumed {n} of {} offered, wanted {wanted}",
                all.len()
            );
        }
        let mut rest = data;
        while !rest.is_empty() {
            let result = match state {
                State::Setup { setup, .. } => setup.handle_input(rest),
                State::Handshake { hs, .. } => hs.handle_input(rest),
                State::Exchange { ex, .. } => ex.handle_input(from, rest),
                State::Over(_) => unreachable!(),
            };
            match result {
                Ok(n) => {
                    assert!(
                        n > 0,
                        "offered {} of {wanted} wanted bytes, consumed none (OutOfTurn)",
                        rest.len()
                    );
                    assert!(n <= rest.len());
                    rest = &rest[n..];
                }
                Err(e) => {
                    // Sticky, and a failed machine sends nothing.
                    let (again, error) = match state {
                        State::Setup { setup, .. } => {
                            assert!(
                                setup.poll_transmit().is_none() && setup.poll_event().is_none()
                            );
                            (setup.handle_input(rest), setup.error().cloned())
                        }
                        State::Handshake { hs, .. } => {
                            assert!(hs.poll_transmit().is_none() && hs.poll_event().is_none());
                            (hs.handle_input(rest), hs.error().cloned())
                        }
                        State::Exchange { ex, .. } => {
                            assert!(ex.poll_transmit().is_none());
                            (ex.handle_input(from, rest), ex.error().cloned())
                        }
                        State::Over(_) => unreachable!(),
                    };
                    assert_eq!(again, Err(e.clone()), "errors stick");
                    assert_eq!(error, Some(e.clone()));
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn ends(&self) -> Vec<End> {
        self.nodes
            .iter()
            .map(|n| match &n.state {
                State::Over(end) => end.clone(),
                _ => End::Running,
            })
            .collect()
    }
}

/// Runs one ranked-mode input. Panics on a broken invariant.
pub fn run(data: &[u8]) -> RankedOutcome {
    let input = RankedInput::parse(data);
    let world = input.world;
    let p = input.target();
    let stranger = input.fault == Fault::Stranger;

    // The processes: rank 0, then the one started as rank r for each r.
    let mut nodes = Vec::new();
    for r in 0..world {
        let (mut rank, mut node_world, mut lie) = (r, world, None);
        if r == p {
            match input.fault {
                Fault::BadRank => lie = Some(bad_rank(&input)),
                Fault::WorldMismatch => (rank, node_world) = mismatch(&input),
                _ => {}
            }
        }
        let state = if r == 0 {
            let setup =
                Rank0Setup::new(LinkVariant::Ranked, world, [0; CAPS_SIZE]).expect("valid world");
            State::Setup {
                setup: Box::new(setup),
                current: None,
                joined: BTreeMap::new(),
            }
        } else {
            let caps = [rank as u8; CAPS_SIZE];
            let hs = Handshake::connector(LinkVariant::Ranked, rank, node_world, caps)
                .expect("valid connector");
            State::Handshake {
                hs: Box::new(hs),
                lie,
            }
        };
        nodes.push(Node {
            rank,
            world: node_world,
            vote: input.vote(r),
            block: comm_block(rank, input.salt),
            streams: if r == 0 {
                Vec::new()
            } else {
                vec![r as usize - 1]
            },
            state,
            wait: Wait::None,
        });
    }
    // Connections: peer r's is r − 1, the stranger's is world − 1; queued in arrival order.
    let clients = world as usize - 1 + usize::from(stranger);
    let mut remaining: Vec<usize> = (0..clients).collect();
    let mut backlog = VecDeque::new();
    for &pick in &input.arrival {
        backlog.push_back(remaining.remove(usize::from(pick) % remaining.len()));
    }
    let inject = (input.fault == Fault::Inject).then(|| {
        let dir = if input.b & 1 == 0 { Dir::Up } else { Dir::Down };
        let stage = if input.b & 2 == 0 {
            Stage::Vote
        } else {
            Stage::Comm
        };
        (p as usize - 1, dir, stage)
    });
    let mut sim = Sim {
        input: input.clone(),
        world,
        nodes,
        conns: (0..clients).map(|_| Conn::default()).collect(),
        backlog: backlog.clone(),
        listening: true,
        inject,
    };
    if stranger {
        let conn = world as usize - 1;
        let bytes = input.bytes.clone();
        sim.write(conn, Dir::Up, None, &bytes);
        sim.close_client(conn);
    }
    for i in 0..world as usize {
        sim.run_node(i);
    }

    let tolerate_hang = match input.fault {
        Fault::WorldMismatch => mismatch(&input).0 == p,
        Fault::Inject => input.b & 1 == 1,
        _ => false,
    };
    let crash =
        (input.fault == Fault::Crash).then(|| (u32::from(input.a) % world, usize::from(input.b)));
    let mut crashed = None;
    let mut timed_out = false;
    let mut schedule = input.schedule.chunks_exact(2);
    let mut steps = 0usize;
    loop {
        assert!(steps < MAX_STEPS, "no end after {steps} steps");
        if let Some((x, at)) = crash {
            if steps == at
                && crashed.is_none()
                && matches!(
                    sim.nodes[x as usize].state,
                    State::Exchange { .. } | State::Setup { .. } | State::Handshake { .. }
                )
            {
                crashed = Some((x, peer_sent(&sim, x)));
                sim.end(x as usize, End::Crashed);
            }
        }
        let runnable: Vec<usize> = (0..world as usize).filter(|&i| sim.runnable(i)).collect();
        if runnable.is_empty() {
            let waiting: Vec<usize> = (0..world as usize)
                .filter(|&i| !matches!(sim.nodes[i].state, State::Over(_)))
                .collect();
            if waiting.is_empty() {
                break;
            }
            assert!(
                tolerate_hang,
                "hang: ranks {waiting:?} wait with nothing in flight: {:?}",
                sim.ends()
            );
            // The shell's comm timeout.
            timed_out = true;
            for i in waiting {
                sim.fail(i, CommError::Timeout { millis: 0 });
            }
            continue;
        }
        let (choice, piece) = match schedule.next() {
            Some(pair) => (usize::from(pair[0]) % runnable.len(), pair[1]),
            None => (0, u8::MAX),
        };
        let piece = if piece < 128 {
            1 + usize::from(piece) % 32
        } else {
            usize::MAX
        };
        steps += 1;
        sim.deliver(runnable[choice], piece);
    }

    let ends = sim.ends();
    let honest = honest_end(&input);
    check(&input, &sim, &ends, &honest, crashed, timed_out);
    RankedOutcome {
        ends,
        honest,
        timed_out,
        steps,
    }
}

/// Bytes node `x` had sent rank 0 (a peer), or sent each peer (rank 0).
fn peer_sent(sim: &Sim, x: u32) -> Vec<usize> {
    if x == 0 {
        sim.conns.iter().map(|c| c.down.written).collect()
    } else {
        vec![sim.conns[x as usize - 1].up.written]
    }
}

/// The rank message a [`Fault::BadRank`] peer sends.
fn bad_rank(input: &RankedInput) -> u32 {
    let (world, p) = (input.world, input.target());
    match input.b % 3 {
        0 => 0,
        1 if world > 2 => {
            // Another peer's rank: step over p.
            let others: Vec<u32> = (1..world).filter(|&r| r != p).collect();
            others[usize::from(input.b / 3) % others.len()]
        }
        _ if input.c == u8::MAX => u32::MAX,
        _ => world + u32::from(input.c),
    }
}

/// `(rank, world)` of a [`Fault::WorldMismatch`] peer.
fn mismatch(input: &RankedInput) -> (u32, u32) {
    let (world, p) = (input.world, input.target());
    let w = 2 + (world - 1 + u32::from(input.b % 7)) % 8;
    debug_assert_ne!(w, world);
    let rank = if input.c & 1 == 0 && p < w {
        p
    } else {
        1 + u32::from(input.c / 2) % (w - 1)
    };
    (rank, w)
}

/// What every rank ends with in an honest run of `input`'s votes.
fn honest_end(input: &RankedInput) -> End {
    let votes: Vec<u8> = (0..input.world).map(|r| input.vote(r)).collect();
    match negotiate(&votes) {
        Ok(Path::Pairwise) => End::Pairwise { votes },
        Ok(Path::BackendCommunicator) => {
            let blocks = (0..input.world)
                .flat_map(|r| comm_block(r, input.salt))
                .collect();
            End::Communicator { votes, blocks }
        }
        Err(e) => End::Failed(e),
    }
}

/// What rank 0 must end with when a stranger is queued (`None`: never accepted).
fn stranger_root(input: &RankedInput, order: &[usize], honest: &End) -> Option<(End, u32)> {
    let world = input.world;
    let stranger_conn = world as usize - 1;
    let mut seen = BTreeSet::new();
    let mut slot = None;
    for &conn in order.iter().take(world as usize - 1) {
        if conn != stranger_conn {
            let rank = conn as u32 + 1;
            if !seen.insert(rank) {
                return Some((End::Failed(CommError::DuplicatePeerRank { rank }), 0));
            }
            continue;
        }
        let g = &input.bytes;
        if g.len() < CAPS_SIZE + RANK_MSG_SIZE {
            return Some((End::Failed(CommError::ConnectionClosed { peer: None }), 0));
        }
        let rank = u32::from_le_bytes(
            g[CAPS_SIZE..CAPS_SIZE + RANK_MSG_SIZE]
                .try_into()
                .expect("4 bytes"),
        );
        if rank == 0 || rank >= world {
            return Some((
                End::Failed(CommError::PeerRankOutOfRange { rank, world }),
                0,
            ));
        }
        if !seen.insert(rank) {
            return Some((End::Failed(CommError::DuplicatePeerRank { rank }), 0));
        }
        slot = Some(rank);
    }
    let rank = slot?;
    let g = &input.bytes;
    let closed = End::Failed(CommError::ConnectionClosed { peer: Some(rank) });
    let Some(&vote) = g.get(THROUGH_VOTE - 1) else {
        return Some((closed, rank));
    };
    let (mut votes, blocks) = match honest.clone() {
        End::Pairwise { votes } => (votes, None),
        End::Communicator { votes, blocks } => (votes, Some(blocks)),
        End::Failed(_) => ((0..world).map(|r| input.vote(r)).collect(), None),
        _ => unreachable!(),
    };
    votes[rank as usize] = vote;
    let end = match negotiate(&votes) {
        Ok(Path::Pairwise) => End::Pairwise { votes },
        Err(e) => End::Failed(e),
        Ok(Path::BackendCommunicator) => {
            let mut blocks = blocks
                .unwrap_or_else(|| (0..world).flat_map(|r| comm_block(r, input.salt)).collect());
            match g.get(THROUGH_VOTE..THROUGH_VOTE + COMM_BLOCK) {
                Some(own) => {
                    let at = rank as usize * COMM_BLOCK;
                    blocks[at..at + COMM_BLOCK].copy_from_slice(own);
                    End::Communicator { votes, blocks }
                }
                None => closed,
            }
        }
    };
    Some((end, rank))
}

/// Checks how the run ended against what the fault allows.
fn check(
    input: &RankedInput,
    sim: &Sim,
    ends: &[End],
    honest: &End,
    crashed: Option<(u32, Vec<usize>)>,
    timed_out: bool,
) {
    let world = input.world;
    let p = input.target();
    assert!(
        ends.iter().all(|e| *e != End::Running),
        "unfinished ranks: {ends:?}"
    );
    let all_honest = |why: &str| {
        for (r, end) in ends.iter().enumerate() {
            assert_eq!(end, honest, "rank {r} ({why}): {ends:?}");
        }
        assert!(!timed_out);
    };
    // A rank that is not rank 0 and not the one the fault is about: the honest result, an
    // error caused by a closed socket, or the honest negotiation error.
    let bystander_ok = |end: &End| match end {
        End::Failed(e) => {
            is_eof_error(e) || Some(e) == honest.error() || *e == CommError::Timeout { millis: 0 }
        }
        other => other == honest,
    };
    match input.fault {
        Fault::None => {
            all_honest("honest");
            for (i, c) in sim.conns.iter().enumerate() {
                assert!(
                    c.up.bytes.is_empty() && c.down.bytes.is_empty(),
                    "bytes left on connection {i}"
                );
            }
        }
        Fault::Stranger => {
            let order: Vec<usize> = sim_order(input);
            match stranger_root(input, &order, honest) {
                None => all_honest("stranger never accepted"),
                Some((root, displaced)) => {
                    assert_eq!(ends[0], root, "rank 0 with a stranger: {ends:?}");
                    for (r, end) in ends.iter().enumerate().skip(1) {
                        if r as u32 == displaced {
                            assert_eq!(
                                end,
                                &End::Failed(CommError::Socket {
                                    kind: ErrorKind::ConnectionReset
                                }),
                                "displaced rank {r}"
                            );
                        } else if root.is_ok()
                            || root.error() == honest.error() && honest.error().is_some()
                        {
                            assert_eq!(end, &root, "rank {r} with a stranger");
                        } else {
                            let e = end
                                .error()
                                .unwrap_or_else(|| panic!("rank {r} finished: {ends:?}"));
                            assert!(
                                is_eof_error(e) || root.error() == Some(e),
                                "rank {r}: {e:?}"
                            );
                        }
                    }
                }
            }
        }
        Fault::BadRank | Fault::WorldMismatch
            if input.fault == Fault::BadRank || mismatch(input).0 != p =>
        {
            let claimed = if input.fault == Fault::BadRank {
                bad_rank(input)
            } else {
                mismatch(input).0
            };
            let want = if claimed == 0 || claimed >= world {
                CommError::PeerRankOutOfRange {
                    rank: claimed,
                    world,
                }
            } else {
                assert_ne!(claimed, p);
                CommError::DuplicatePeerRank { rank: claimed }
            };
            assert_eq!(ends[0], End::Failed(want), "rank 0 with a bad rank");
            for (r, end) in ends.iter().enumerate().skip(1) {
                let e = end
                    .error()
                    .unwrap_or_else(|| panic!("rank {r} finished: {ends:?}"));
                assert!(is_eof_error(e), "rank {r}: {e:?}");
            }
            assert!(!timed_out);
        }
        Fault::WorldMismatch => {
            // Undetectable: everyone but p ends as a bystander; p anyhow.
            assert!(bystander_ok(&ends[0]), "rank 0: {ends:?}");
            for (r, end) in ends.iter().enumerate().skip(1) {
                if r as u32 != p {
                    assert!(bystander_ok(end), "rank {r}: {ends:?}");
                }
            }
        }
        Fault::Inject if input.b & 1 == 0 => {
            // Towards rank 0: every rank agrees, honest except for p's entries.
            assert!(!timed_out);
            for end in &ends[1..] {
                assert_eq!(end, &ends[0], "ranks disagree after an injection: {ends:?}");
            }
            let entries = |end: &End| -> (Vec<u8>, Vec<u8>) {
                match end {
                    End::Pairwise { votes } => (votes.clone(), Vec::new()),
                    End::Communicator { votes, blocks } => (votes.clone(), blocks.clone()),
                    _ => (Vec::new(), Vec::new()),
                }
            };
            let (votes, blocks) = entries(&ends[0]);
            if !votes.is_empty() {
                for r in (0..world).filter(|&r| r != p) {
                    assert_eq!(votes[r as usize], input.vote(r), "vote of rank {r}");
                    if !blocks.is_empty() {
                        let at = r as usize * COMM_BLOCK;
                        assert_eq!(
                            blocks[at..at + COMM_BLOCK],
                            comm_block(r, input.salt)[..],
                            "block of {r}"
                        );
                    }
                }
            }
            if input.bytes.is_empty()
                || (input.b & 2 != 0 && !matches!(honest, End::Communicator { .. }))
            {
                all_honest("nothing injected");
            }
        }
        Fault::Inject => {
            for (r, end) in ends.iter().enumerate() {
                if r as u32 != p {
                    assert!(bystander_ok(end), "rank {r}: {ends:?}");
                }
            }
            if input.bytes.is_empty()
                || (input.b & 2 != 0 && !matches!(honest, End::Communicator { .. }))
            {
                all_honest("nothing injected");
            }
        }
        Fault::Crash => {
            assert!(!timed_out);
            let Some((x, sent)) = crashed else {
                return all_honest("no crash");
            };
            assert_eq!(ends[x as usize], End::Crashed);
            if x > 0 {
                // What rank 0 got from x decides.
                let sent = sent[0];
                let need_comm = matches!(honest, End::Communicator { .. });
                let root = if sent < CAPS_SIZE + RANK_MSG_SIZE {
                    End::Failed(CommError::ConnectionClosed { peer: None })
                } else if sent < THROUGH_VOTE || (need_comm && sent < THROUGH_VOTE + COMM_BLOCK) {
                    End::Failed(CommError::ConnectionClosed { peer: Some(x) })
                } else {
                    honest.clone()
                };
                assert_eq!(
                    ends[0], root,
                    "rank 0 after rank {x} crashed having sent {sent} bytes"
                );
                for (r, end) in ends
                    .iter()
                    .enumerate()
                    .skip(1)
                    .filter(|&(r, _)| r as u32 != x)
                {
                    if root == *honest {
                        assert_eq!(end, honest, "rank {r}");
                    } else {
                        let e = end
                            .error()
                            .unwrap_or_else(|| panic!("rank {r} finished: {ends:?}"));
                        assert!(is_eof_error(e), "rank {r}: {e:?}");
                    }
                }
            } else {
                // Peers that got all rank 0 had to send end honestly; the others on EOF/reset.
                let full = CAPS_SIZE
                    + world as usize
                    + if matches!(honest, End::Communicator { .. }) {
                        COMM_BLOCK * world as usize
                    } else {
                        0
                    };
                for (r, end) in ends.iter().enumerate().skip(1) {
                    if sent[r - 1] == full {
                        assert_eq!(end, honest, "rank {r} got everything before rank 0 crashed");
                    } else {
                        let e = end
                            .error()
                            .unwrap_or_else(|| panic!("rank {r} finished: {ends:?}"));
                        assert!(is_eof_error(e), "rank {r}: {e:?}");
                    }
                }
            }
        }
        Fault::BadRank => unreachable!(),
    }
}

/// The queue order of the connections (as `run` builds it).
fn sim_order(input: &RankedInput) -> Vec<usize> {
    let clients = input.world as usize - 1 + usize::from(input.fault == Fault::Stranger);
    let mut remaining: Vec<usize> = (0..clients).collect();
    input
        .arrival
        .iter()
        .map(|&pick| remaining.remove(usize::from(pick) % remaining.len()))
        .collect()
}
