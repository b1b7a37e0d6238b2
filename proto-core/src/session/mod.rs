//! Connection state machines: [`ServerSession`] and [`ClientSession`].
//!
//! Both follow the sans-IO shape of quinn-proto and str0m: the caller feeds received bytes,
//! polls events, and writes out whatever `poll_transmit` returns. Neither ever blocks, reads a
//! clock or touches a socket.

pub mod client;
mod input_queue;
pub mod server;

pub use client::{ClientEvent, ClientSession, GraphSubmission, ServerHello, GRAPH_CACHE_MAX};
pub use server::{ServerEvent, ServerSession, ServerSessionConfig, TensorWrite, MAX_DATA_CHUNK};
