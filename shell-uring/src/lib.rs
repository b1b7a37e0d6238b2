//! The io_uring shell of the ggml RPC protocol: a TCP server on Linux's io_uring around the
//! sans-IO core, whose [`Connection`](proto_core::driver::Connection) says what each
//! connection needs next. This crate adds the event loop: many clients per ring (one ring per
//! thread), operations submitted in batches, tensor data moved straight between sockets and
//! backend memory, and heavy work on blocking threads so no client stalls another.
//! A connection whose HELLO switches it to RDMA (`--transport`) leaves the ring once the
//! answer is written and runs `shell_rdma::serve` on a blocking thread until it ends.
//!
//! * [`Server`]: start on a bound listener, [`Server::stop`], [`Server::join`].
//! * [`probe`]: whether this kernel lets the process use io_uring ([`Server::start`] fails with
//!   "io_uring is not available: ..." where it does not).
//!
//! All `unsafe` code is in the private module `ring`. On other operating systems the crate is
//! empty.
#![cfg(target_os = "linux")]
#![warn(missing_docs)]
#![deny(unsafe_code)]

mod core;
mod pool;
#[allow(unsafe_code)]
mod ring;
mod server;

pub use server::{probe, Server, ServerConfig, Stopper, DEFAULT_STREAM_CHUNK};
