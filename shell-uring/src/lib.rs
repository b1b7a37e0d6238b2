//! The io_uring shell of the ggml RPC protocol: a TCP server on Linux's io_uring around the
//! sans-IO core.
//!
//! Like every shell, this crate moves bytes and nothing else: framing, validation and command
//! semantics are [`proto_core`]'s, whose [`Connection`](proto_core::driver::Connection) says
//! what each connection needs next. What it adds is the event loop: many
//! clients on one ring (or one ring per thread), receives and sends submitted in batches with one
//! system call per loop turn, SET_TENSOR data received straight into the buffers the backend
//! reads from, GET_TENSOR responses sent straight from the backend's `Bytes` (or from its
//! memory), concurrent large transfers spread over blocking threads, and heavy commands run on
//! blocking threads so one client's graph never stalls another's small commands.
//!
//! * [`Server`]: start on a bound listener, [`Server::stop`], [`Server::join`].
//! * [`probe`]: whether this kernel lets the process use io_uring.
//!
//! All `unsafe` code (the buffers an operation in flight points into) is in one private module,
//! `ring`. Where io_uring is refused (an old kernel, seccomp, `kernel.io_uring_disabled`),
//! [`Server::start`] fails with an error reading "io_uring is not available: ...". On other
//! operating systems the crate is empty.
#![warn(missing_docs)]
#![deny(unsafe_code)]

#[cfg(target_os = "linux")]
mod core;
#[cfg(target_os = "linux")]
mod pool;
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod ring;
#[cfg(target_os = "linux")]
mod server;

#[cfg(target_os = "linux")]
pub use server::{
    probe, Server, ServerConfig, Stopper, DEFAULT_COMM_TIMEOUT, DEFAULT_MAX_CLIENTS,
    DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_SHUTDOWN_GRACE, DEFAULT_STREAM_CHUNK,
};
