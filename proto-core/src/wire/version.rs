//! Protocol versions and the command-table dialect they select.

use std::fmt;

use crate::ggml::GgmlTable;

/// A protocol version triple as sent in the HELLO response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtocolVersion {
    /// Major version: decides the command table and layouts.
    pub major: u8,
    /// Minor version: a client accepts servers with a minor at or below its own.
    pub minor: u8,
    /// Patch version: never compared on the wire.
    pub patch: u8,
}

/// The layouts and command tables that exist on the wire. One per major version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// Protocol 7.x (llama.cpp b11434): commands 0-17.
    V7,
    /// Protocol 8.x (llama.cpp b11739 and later): commands 0-22, graph uids.
    V8,
}

impl ProtocolVersion {
    /// Protocol 7.0.0 (llama.cpp b11434).
    pub const V7_0_0: ProtocolVersion = ProtocolVersion {
        major: 7,
        minor: 0,
        patch: 0,
    };
    /// Protocol 8.0.0 (llama.cpp b11739).
    pub const V8_0_0: ProtocolVersion = ProtocolVersion {
        major: 8,
        minor: 0,
        patch: 0,
    };
    /// Protocol 8.0.1 (llama.cpp b12032): 8.0.0's commands, ggml's op table with `TOP_K_MASK`.
    pub const V8_0_1: ProtocolVersion = ProtocolVersion {
        major: 8,
        minor: 0,
        patch: 1,
    };
    /// The newest version this implementation speaks.
    pub const LATEST: ProtocolVersion = ProtocolVersion::V8_0_1;

    /// The numbering of ggml's ops and types that peers of this version use.
    pub fn ggml_table(self) -> GgmlTable {
        GgmlTable::of(self)
    }

    /// The dialect of a supported major version, `None` otherwise.
    pub fn dialect(self) -> Option<Dialect> {
        match self.major {
            7 => Some(Dialect::V7),
            8 => Some(Dialect::V8),
            _ => None,
        }
    }

    /// The reference client's rule: same major, server minor not above ours; patch ignored.
    pub fn client_accepts(self, server: ProtocolVersion) -> bool {
        server.major == self.major && server.minor <= self.minor
    }
}

impl Dialect {
    /// The first version of the dialect (7.0.0, 8.0.0).
    pub fn version(self) -> ProtocolVersion {
        match self {
            Dialect::V7 => ProtocolVersion::V7_0_0,
            Dialect::V8 => ProtocolVersion::V8_0_0,
        }
    }

    /// Whether GRAPH_COMPUTE / GRAPH_RECOMPUTE carry a graph uid.
    pub fn has_graph_uid(self) -> bool {
        matches!(self, Dialect::V8)
    }

    /// Bytes of the fixed GRAPH_COMPUTE header before the node ids (device [+ uid] + n_nodes).
    pub fn graph_header_size(self) -> usize {
        if self.has_graph_uid() {
            16
        } else {
            8
        }
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_rule_ignores_patch_and_allows_lower_minor() {
        let ours = ProtocolVersion {
            major: 8,
            minor: 2,
            patch: 0,
        };
        assert!(ours.client_accepts(ProtocolVersion {
            major: 8,
            minor: 0,
            patch: 9
        }));
        assert!(ours.client_accepts(ProtocolVersion {
            major: 8,
            minor: 2,
            patch: 0
        }));
        assert!(!ours.client_accepts(ProtocolVersion {
            major: 8,
            minor: 3,
            patch: 0
        }));
        assert!(!ours.client_accepts(ProtocolVersion::V7_0_0));
        assert_eq!(
            ProtocolVersion {
                major: 9,
                minor: 0,
                patch: 0
            }
            .dialect(),
            None
        );
    }
}
