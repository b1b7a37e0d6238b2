//! Sans-IO core of the ggml RPC protocol (llama.cpp's RPC backend).
//!
//! Bytes in, events out; responses in, bytes out. Nothing here touches a socket, a file, a
//! thread, a clock or an async runtime: shells (`shell-tokio`, `shell-uring`, ...) move the
//! bytes, backends execute the requests behind [`backend::Backend`].
//!
//! * [`wire`]: the codec of every message of protocols 7.0.0 and 8.0.0.
//! * [`session`]: the server and client connection state machines.
//! * [`graph`]: GRAPH_COMPUTE payloads decoded into an owned, validated graph.
//! * [`backend`] and [`dispatch`]: the device trait and the one command implementation that
//!   turns requests into backend calls.
//! * [`driver`]: [`driver::Connection`], the one connection driver every shell runs: input
//!   in, the next [`driver::Action`] out.
//! * [`comm`]: the server-to-server link (handshake, bootstrap exchange, pairwise all-reduce).
//! * `testing` (feature `testing`): `Pair`, our client and a server connection joined in
//!   memory, for tests and fuzz targets.
//! * [`tensor_cache`]: the FNV-1a keys of the SET_TENSOR_HASH cache.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
// Hostile peers must not be able to crash a server: outside tests, no code of the core may
// index, unwrap or panic on anything (tests and the `testing` feature's harness may, to stay
// short).
#![cfg_attr(
    not(test),
    warn(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]

pub mod backend;
pub mod comm;
pub mod dispatch;
pub mod driver;
pub mod error;
pub mod ggml;
pub mod graph;
pub mod session;
pub mod tensor_cache;
#[cfg(feature = "testing")]
pub mod testing;
pub mod wire;

pub use error::{Error, ErrorKind, Result};
