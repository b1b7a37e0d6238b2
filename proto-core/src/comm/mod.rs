//! The server-to-server "comm" link (PROTOCOL.md §5.21–5.23 and §6) as sans-IO state machines.
//!
//! Nothing in this module touches a socket, a clock or a thread. Each machine is driven the same
//! way (the quinn-proto / str0m shape):
//!
//! * [`handle_input`](handshake::Handshake::handle_input) offers bytes that arrived on a
//!   connection and returns how many of them the machine **consumed**. Bytes that were not
//!   consumed still belong to the caller: either the machine first has something to send or an
//!   event to deliver (offer them again after draining `poll_transmit` / `poll_event`), or they lie
//!   beyond the end of this stage and are the first bytes of the next one. Nothing is ever dropped.
//! * `poll_transmit` yields the next [`Transmit`]: one write, to be flushed on its own. The link
//!   carries raw bytes without framing, and 7.0.0/8.0.0 RDMA receivers require every caps block,
//!   rank, bootstrap block and all-reduce payload to be its own write (§10.3), so a machine never
//!   coalesces two of them into one `Transmit`.
//! * `poll_event` (where a machine has events) tells the driver to act on its transport, e.g. to
//!   apply the peer's connection caps before any further byte is sent or read.
//! * `handle_close` reports that a connection closed; before the stage is complete that is an
//!   error (a truncated stream).
//! * `wanted` tells how many bytes the current receive still needs, for drivers that must read
//!   exact lengths; `is_done` / `into_result` give the outcome.
//!
//! Every machine follows the reference's blocking order: it only offers bytes for transmission
//! when the reference would send them, and it only consumes input for the receive it is
//! currently doing. That is what rules out the deadlocks the reference avoids by ordering
//! (acceptor receives first, connector sends first; all-reduce rank 0 sends first). The one
//! liberty taken: rank 0 of a bootstrap exchange takes the peers' blocks in whatever order they
//! arrive rather than in rank order, which builds the same array; and since a conforming peer
//! sends nothing beyond its block until it has the array, rank 0 rejects one that does
//! ([`CommError::UnexpectedData`]) instead of leaving the bytes with the caller.
//!
//! Once a machine returned an error it is failed: every later call returns the same error and
//! nothing more is transmitted. The driver then drops the connection(s) and answers
//! `COMM_INIT` with `ok = 0` (or closes the client connection, for `COMM_ALLREDUCE`).
//!
//! Contents:
//! * [`handshake`]: caps exchange (and, in the newest upstream change, the rank message) on one
//!   comm connection, either side.
//! * [`rank0`]: rank 0 accepting `world − 1` peers one after the other.
//! * [`bootstrap`]: the rank-ordered all-gather over the star topology, and path negotiation.
//! * [`allreduce`]: the pairwise (world = 2) all-reduce exchange, its wire format choice, and
//!   the encode / in-place sum helpers.
//! * [`bf16`]: the f32 ↔ bf16 conversions the BF16 wire uses.
//! * [`error`]: the error type, [`CommError`].
//! * [`transmit`]: [`Transmit`], the one output type of every machine.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod allreduce;
pub mod bf16;
pub mod bootstrap;
pub mod error;
pub mod handshake;
pub mod rank0;
mod recv;
pub mod transmit;

#[cfg(test)]
mod e2e_tests;
#[cfg(test)]
mod sim;

pub use allreduce::{
    accumulate, encode_partial, PairwiseAllReduce, WireFormat, BF16_WIRE_MIN_ELEMENTS,
};
pub use bootstrap::{negotiate, path_offer, BootstrapExchange, Gathered, Path};
pub use error::CommError;
pub use handshake::{
    ConnCaps, Handshake, HandshakeEvent, HandshakeOutcome, HandshakeRole, LinkVariant, CAPS_SIZE,
    RANK_MSG_SIZE,
};
pub use rank0::{JoinedPeer, Rank0Event, Rank0Setup};
pub use transmit::Transmit;
