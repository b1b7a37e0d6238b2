//! Shared helpers for cross-crate tests of the ggml RPC implementation, and the language-neutral
//! test vectors in `tests/vectors/` (format: `vectors/README.md`).
//!
//! * [`vector`]: the vector file format and its loader ([`load_all`], [`vectors_dir`]).
//! * [`check`]: checks one vector against proto-core; [`check::replay_session`] replays a
//!   session vector against any [`check::SessionTarget`] (e.g. a real server behind a socket).
//! * [`fields`]: typed requests/responses → the JSON `fields` of a vector.
//! * [`template`]: the `{placeholder}` hex templates of session vectors.
//! * [`harness`]: our server (session + dispatcher over the in-memory backend) and client,
//!   driven with raw bytes.
//! * [`hostile`]: attacks that are no vector (a client leaving inside a large SET_TENSOR),
//!   shared by the shell conformance suite and `ggml-rpc conformance`.
//! * [`process`]: what a running process holds (memory, descriptors, threads), for leak checks.
//! * [`rules`]: the validation rules and their error kinds.
//! * [`generate`]: the program that writes the vectors (`cargo run -p ggml-rpc-tests --bin
//!   gen-vectors`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
pub mod fields;
pub mod generate;
pub mod harness;
pub mod hex;
pub mod hostile;
pub mod process;
pub mod rules;
pub mod template;
pub mod vector;

pub use check::check;
pub use vector::{load_all, vectors_dir, Vector};

/// Every vector of `tests/vectors/`.
pub fn all_vectors() -> Result<Vec<Vector>, String> {
    load_all(&vectors_dir())
}
