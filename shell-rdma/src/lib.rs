//! llama.cpp's Linux RDMA transport (PROTOCOL.md §10.2–§10.3), wire compatible with its
//! `GGML_RPC_RDMA` builds, for every shell and the client.
//!
//! * [`caps`]: the 24-byte `conn_caps`, the upgrade rule, `--transport`, the GID choice;
//! * [`verbs`]: the [`Verbs`] trait, all the data path needs from a connected queue pair
//!   (the real one over libibverbs, an in-memory [`mock`] for tests);
//! * [`stream`]: [`RdmaStream`], the byte stream (stop-and-wait SENDs of ≤ 256 KiB, the
//!   24-slot receive ring consumed partially as in the newest upstream, spin-then-sleep waits,
//!   every wait a peer controls bounded);
//! * [`framing`]: the segmentation every reference version accepts;
//! * [`comm`]: the comm link (server to server) over RDMA after its caps exchange;
//! * [`client`]: the client side (`ggml-rpc-client`): caps to offer, the switch;
//! * [`serve`]: the server side every shell hands a connection to: HELLO's caps, then one
//!   blocking loop over the RDMA stream.

pub mod caps;
pub mod client;
pub mod comm;
pub mod framing;
#[cfg(any(test, feature = "mock"))]
pub mod mock;
pub mod serve;
pub mod stream;
pub mod sys;
pub mod verbs;

pub use caps::{RdmaCaps, TransportMode, CAPS_LEN};
pub use framing::{Framer, Framing};
pub use stream::{RdmaStream, StreamError, Timing};
pub use verbs::{Verbs, VerbsError, RDMA_CHUNK, RDMA_RX_DEPTH};

#[cfg(test)]
mod serve_tests;
#[cfg(test)]
mod tests;
