//! Connecting to any RPC server: protocol auto-detection and a bounded wait for HELLO.

use std::time::Duration;

use anyhow::Context as _;
use ggml_rpc_client::{Client, TransportMode};
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
    /// Protocol 8.0.0 exactly (llama.cpp b11739's op numbering).
    #[value(name = "8.0.0")]
    V8_0_0,
    /// Protocol 8.0.1 exactly (llama.cpp b12032's op numbering).
    #[value(name = "8.0.1")]
    V8_0_1,
}

impl Protocol {
    /// The exact version asked for, `None` for the server's own (auto, 8).
    pub fn exact(self) -> Option<ProtocolVersion> {
        match self {
            Protocol::V7 => Some(ProtocolVersion::V7_0_0),
            Protocol::V8_0_0 => Some(ProtocolVersion::V8_0_0),
            Protocol::V8_0_1 => Some(ProtocolVersion::V8_0_1),
            Protocol::Auto | Protocol::V8 => None,
        }
    }
}

/// Connects to `endpoint` (`host:port`) and performs HELLO within `timeout`.
pub async fn connect(
    endpoint: &str,
    protocol: Protocol,
    transport: TransportMode,
    timeout: Duration,
) -> anyhow::Result<Client> {
    let attempt = async {
        match protocol {
            Protocol::Auto => Client::connect_auto_with(endpoint, transport).await,
            Protocol::V7 => {
                Client::connect_with(endpoint, ProtocolVersion::V7_0_0, transport).await
            }
            Protocol::V8 | Protocol::V8_0_1 => {
                Client::connect_with(endpoint, ProtocolVersion::V8_0_1, transport).await
            }
            Protocol::V8_0_0 => {
                Client::connect_with(endpoint, ProtocolVersion::V8_0_0, transport).await
            }
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
