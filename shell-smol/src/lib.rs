//! The smol shell of the ggml RPC protocol: a portable TCP server on async-io and
//! async-executor around the sans-IO core.
//!
//! A second runtime adapter with the tokio shell's behaviour, to show that a shell is thin: it
//! moves bytes between sockets and [`proto_core`]'s
//! [`ServerSession`](proto_core::session::ServerSession) /
//! [`Dispatcher`](proto_core::dispatch::Dispatcher), and runs heavy backend calls on the
//! `blocking` pool. Every protocol decision is the core's.
//!
//! * [`server`]: [`serve`] (on an executor the caller runs) and [`run`] (a whole server in one
//!   blocking call), with the limits of [`ServerConfig`] and graceful shutdown.
//! * [`connection`]: the per-client driver (read → session → dispatcher → write).
//! * [`comm_link`]: the protocol-8.0.0 server-to-server link behind COMM_INIT and
//!   COMM_ALLREDUCE.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod comm_link;
pub mod connection;
pub mod server;

pub use server::{run, serve, ServerConfig};
