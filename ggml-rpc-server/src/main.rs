//! `ggml-rpc-server`: serves ggml devices to llama.cpp's RPC backend (protocol 7 or 8).
//!
//! Flags, banner and behaviour follow llama.cpp's `rpc-server` (PROTOCOL.md §11), except that
//! many clients are served at once, each with its own buffers, within configurable limits, on
//! the I/O shell chosen with `--shell` (tokio, io_uring or smol). See the library for the parts.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser as _;
use ggml_rpc_server::Args;

fn main() -> ExitCode {
    let args = Args::parse();
    ggml_rpc_server::init_tracing(args.verbose);
    match ggml_rpc_server::run(args) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
