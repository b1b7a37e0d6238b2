//! The tokio shell of the ggml RPC protocol: sockets, tasks and files around the sans-IO core.
//!
//! This crate moves bytes and nothing else. Every protocol decision (framing, validation,
//! command semantics, the graph cache, version rules) is made by [`proto_core`]; the shell only
//! reads from sockets into [`proto_core::session`] state machines, hands their events to a
//! [`proto_core::dispatch::Dispatcher`], and writes out what they produce.
//!
//! * [`server`]: [`serve`] accepts TCP clients and runs one [`connection`] task per client,
//!   with the server-wide limits of [`ServerConfig`] and graceful shutdown.
//! * [`connection`]: the per-client driver (read → session → dispatcher → write).
//! * [`comm_link`]: the protocol-8.0.0 server-to-server link behind COMM_INIT and
//!   COMM_ALLREDUCE (two ranks, pairwise all-reduce).
//! * [`cache_dir`]: [`FsTensorCache`], the SET_TENSOR_HASH cache as a directory of files
//!   (re-exported from [`shell_common`], as is [`ServerConfig`]).
//!
//! The async client is the crate `ggml-rpc-client`; this crate is a server shell only.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod comm_link;
pub mod connection;
pub mod server;

pub use server::{serve, serve_on, ServerConfig};
pub use shell_common::cache_dir;
pub use shell_common::FsTensorCache;
