//! `--transport`: which transport a side asks for (the RDMA transport itself is `shell-rdma`).

/// The environment variable that makes a side announce all-zero caps without probing.
pub const NO_RDMA_ENV: &str = "GGML_RPC_NO_RDMA";

/// Which transport a side asks for (`--transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportMode {
    /// Never offer RDMA (all-zero caps).
    #[default]
    Tcp,
    /// Offer RDMA when a device matches the connection and `GGML_RPC_NO_RDMA` is unset; the
    /// reference's behaviour.
    Auto,
    /// As `Auto`, but a connection that cannot switch (no device, peer without RDMA,
    /// activation failed) is closed instead of staying on TCP.
    Rdma,
}

impl std::str::FromStr for TransportMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tcp" => Ok(TransportMode::Tcp),
            "auto" => Ok(TransportMode::Auto),
            "rdma" => Ok(TransportMode::Rdma),
            other => Err(format!("unknown transport {other:?} (tcp, rdma or auto)")),
        }
    }
}

impl TransportMode {
    /// Whether this side probes at all: not for `tcp`, and (as the reference) not when
    /// `GGML_RPC_NO_RDMA` is set to anything, even empty. `rdma` ignores the variable: it was
    /// asked for explicitly.
    pub fn probes(self) -> bool {
        match self {
            TransportMode::Tcp => false,
            TransportMode::Auto => std::env::var_os(NO_RDMA_ENV).is_none(),
            TransportMode::Rdma => true,
        }
    }
}
