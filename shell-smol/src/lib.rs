//! The smol shell of the ggml RPC protocol: a portable TCP server on async-io and
//! async-executor around the sans-IO core.
//!
//! A second runtime adapter with the tokio shell's behaviour, to show that a shell is thin: it
//! runs [`proto_core::driver::Connection`]'s actions on async-io sockets and heavy work on the
//! `blocking` pool. Every protocol decision is the core's.
//!
//! * [`server`]: [`serve`] (on an executor the caller runs) and [`run`] (a whole server in one
//!   blocking call), with the limits of [`ServerConfig`] and graceful shutdown.
//! * [`connection`]: the per-client loop around the driver.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod connection;
pub mod server;

pub use server::{run, serve, ServerConfig};
