//! Connecting to any RPC server: protocol auto-detection and a bounded wait for HELLO.

use std::time::Duration;

use anyhow::Context as _;
use ggml_rpc_client::Client;
use proto_core::wire::ProtocolVersion;

/// Which protocol to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// Try 8.0.1 (which accepts any 8.0.x server), then the server's major.
    Auto,
    /// Protocol 7 (llama.cpp b11434).
    #[value(name = "7")]
    V7,
    /// Protocol 8 (any 8.0.x server; its op table is taken from its exact version).
    #[value(name = "8")]
    V8,
}

/// Connects to `endpoint` (`host:port`) and performs HELLO within `timeout`.
pub async fn connect(
    endpoint: &str,
    protocol: Protocol,
    timeout: Duration,
) -> anyhow::Result<Client> {
    let attempt = async {
        match protocol {
            Protocol::Auto => Client::connect_auto(endpoint).await,
            Protocol::V7 => Client::connect(endpoint, ProtocolVersion::V7_0_0).await,
            Protocol::V8 => Client::connect(endpoint, ProtocolVersion::V8_0_1).await,
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .with_context(|| {
            format!(
                "no HELLO answer from {endpoint} within {timeout:?} (llama.cpp's rpc-server \
                 serves one client at a time: is another client connected?)"
            )
        })?
        .with_context(|| format!("cannot connect to {endpoint}"))
}
