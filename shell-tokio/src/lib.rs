//! The tokio shell of the ggml RPC protocol: sockets, tasks and files around the sans-IO core.
//!
//! This crate moves bytes and nothing else. Every protocol decision (framing, validation,
//! command semantics, the graph cache, version rules) is made by [`proto_core`]; the shell only
//! runs [`proto_core::driver::Connection`]'s actions on tokio's sockets and threads.
//!
//! * [`server`]: [`serve`] accepts TCP clients and runs one [`connection`] task per client,
//!   with the server-wide limits of [`ServerConfig`] and graceful shutdown.
//! * [`connection`]: the per-client loop around the driver.
//! * `tls`: with [`ServerConfig::tls`], a TLS 1.3 handshake (client certificate required,
//!   bounded by `ServerTls::handshake_timeout`) before that loop.
//! * [`cache_dir`]: [`FsTensorCache`], the SET_TENSOR_HASH cache as a directory of files
//!   (re-exported from [`shell_common`], as is [`ServerConfig`]).
//!
//! The async client is the crate `ggml-rpc-client`; this crate is a server shell only.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod connection;
pub mod server;
mod tls;

pub use server::{serve, serve_on, ServerConfig};
pub use shell_common::cache_dir;
pub use shell_common::FsTensorCache;
