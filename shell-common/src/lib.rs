//! What every I/O shell of the ggml RPC protocol shares and that needs no runtime: the server
//! settings, the per-connection configuration derived from them, which events are heavy
//! enough to run off the event loop, the on-disk tensor cache, and the bookkeeping of vectored
//! writes.
//!
//! * [`admission`]: [`ClientSlots`](admission::ClientSlots): the client places, the HELLO and
//!   progress deadlines, which connection gives way to a new one.
//! * [`config`]: [`ServerConfig`], its defaults, and [`ConnectionConfig`] (the session and
//!   dispatcher settings of one connection).
//! * [`comm_link`]: [`CommLinks`], the server-to-server link every shell runs (blocking
//!   `std::net`, off the event loop).
//! * [`remote_copy`]: the source side of our remote-copy extension ([`PeerAllowList`],
//!   `push`: server A writing a region to server B as its client, off the event loop).
//! * [`cache_dir`]: [`FsTensorCache`], the SET_TENSOR_HASH cache as a directory of files.
//! * [`direct`]: one non-blocking socket call on lent backend memory and what it came to
//!   (the zero-copy tensor data path).
//! * [`low_water`]: [`LowWater`], the receive low-water mark while a bulk payload streams in
//!   (its one system call and [`freed_memory`]'s `malloc_trim` are the crate's only `unsafe`).
//! * [`freed_memory`]: hands the heap memory a finished connection freed back to the system.
//! * [`shell`]: what every shell's connection loop shares: [`shell::Closed`],
//!   [`shell::ConnectionError`], read sizes, the connection log lines.
//! * [`same_host`]: [`tune_for_peer`], no pacing congestion control for a peer on this host.
//! * [`tls`]: TLS 1.3 with client certificates: [`tls::ServerTls`] (`--tls-*`) and the
//!   tunnel's client configuration.
//! * [`vectored`]: [`SendQueue`], the runtime-free part of a vectored write (which slices one
//!   call offers, at most one [`SEND_PIECE`](direct::SEND_PIECE); what is left after it).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod cache_dir;
pub mod comm_link;
pub mod config;
pub mod direct;
pub mod freed_memory;
pub mod low_water;
pub mod remote_copy;
pub mod same_host;
pub mod shell;
pub mod tls;
pub mod transport;
pub mod vectored;

pub use cache_dir::FsTensorCache;
pub use comm_link::{CommLinks, CommPeers, CommSettings};
pub use config::{
    ConnectionConfig, ServerConfig, DEFAULT_COMM_TIMEOUT, DEFAULT_HELLO_TIMEOUT,
    DEFAULT_MAX_CLIENTS, DEFAULT_MAX_CLIENTS_PER_ADDRESS, DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MIN_PROGRESS_RATE, DEFAULT_PROGRESS_WINDOW, DEFAULT_SHUTDOWN_GRACE,
};
pub use direct::Direct;
pub use low_water::LowWater;
pub use remote_copy::PeerAllowList;
pub use same_host::{set_tuning, tune_for_peer, tune_or_log};
pub use transport::TransportMode;
pub use vectored::SendQueue;
