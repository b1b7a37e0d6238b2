//! `conn_caps` (PROTOCOL.md §10.2): the 24 bytes each side announces in HELLO, and the
//! upgrade rule.

use std::net::IpAddr;

/// Size of the `conn_caps` block.
pub const CAPS_LEN: usize = 24;

pub use shell_common::transport::{TransportMode, NO_RDMA_ENV};

/// Linux RoCE/IB caps: queue-pair number, initial PSN and GID (all little-endian, as the
/// reference copies its struct).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaCaps {
    /// Local queue-pair number.
    pub qpn: u32,
    /// Initial packet sequence number (`qpn & 0xFFFFFF`).
    pub psn: u32,
    /// Local GID (RoCE: the IPv4-mapped address of the interface).
    pub gid: [u8; 16],
}

impl RdmaCaps {
    /// Caps for a queue pair: the PSN follows from the QPN as in the reference.
    pub fn for_qp(qpn: u32, gid: [u8; 16]) -> RdmaCaps {
        RdmaCaps {
            qpn,
            psn: qpn & 0x00FF_FFFF,
            gid,
        }
    }

    /// The 24 wire bytes.
    pub fn encode(&self) -> [u8; CAPS_LEN] {
        let mut out = [0u8; CAPS_LEN];
        out[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        out[4..8].copy_from_slice(&self.psn.to_le_bytes());
        out[8..24].copy_from_slice(&self.gid);
        out
    }

    /// The peer's caps; `None` for all zero ("no RDMA").
    pub fn decode(bytes: &[u8; CAPS_LEN]) -> Option<RdmaCaps> {
        if bytes.iter().all(|&b| b == 0) {
            return None;
        }
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[8..24]);
        Some(RdmaCaps {
            qpn: word(0),
            psn: word(4),
            gid,
        })
    }
}

/// What the upgrade rule decides for one side (§10.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrade {
    /// Switch to RDMA with the peer's caps.
    Switch(RdmaCaps),
    /// Stay on TCP (probed resources, if any, are released).
    Stay(StayReason),
}

/// Why a side stays on TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StayReason {
    /// This side did not probe or its probe failed.
    #[error("no local RDMA device for this connection")]
    NoLocalDevice,
    /// The peer announced all-zero caps.
    #[error("peer does not support RDMA")]
    PeerWithoutRdma,
}

/// The upgrade rule: switch iff this side's probe succeeded and the peer's caps are not all
/// zero (activation, the third condition, is the caller's).
pub fn decide(local_probed: bool, peer: &[u8; CAPS_LEN]) -> Upgrade {
    if !local_probed {
        return Upgrade::Stay(StayReason::NoLocalDevice);
    }
    match RdmaCaps::decode(peer) {
        Some(caps) => Upgrade::Switch(caps),
        None => Upgrade::Stay(StayReason::PeerWithoutRdma),
    }
}

/// The GID a RoCE device must hold for the connection's local address: IPv4 `a.b.c.d` as
/// `::ffff:a.b.c.d`, IPv6 as is.
pub fn target_gid(local: IpAddr) -> [u8; 16] {
    match local {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// One GID table entry as the probe sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in port 1's table.
    pub index: u32,
    /// The GID.
    pub gid: [u8; 16],
    /// Its type.
    pub kind: GidKind,
}

/// `ibv_gid_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (raw Ethernet).
    RoceV1,
    /// RoCE v2 (UDP/IP).
    RoceV2,
}

/// The GID index to use on one device's port 1 (§10.3): the first RoCE v2 entry equal to
/// `target`, else the first RoCE v1 one; `forced` (`GGML_RDMA_GID`) skips the match.
pub fn choose_gid(entries: &[GidEntry], target: &[u8; 16], forced: Option<u32>) -> Option<u32> {
    if let Some(index) = forced {
        return Some(index);
    }
    let matching = |kind| {
        entries
            .iter()
            .find(|e| e.kind == kind && &e.gid == target)
            .map(|e| e.index)
    };
    matching(GidKind::RoceV2).or_else(|| matching(GidKind::RoceV1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_round_trip_and_zero_means_none() {
        let caps = RdmaCaps::for_qp(0x0123_4567, target_gid("10.0.0.2".parse().unwrap()));
        assert_eq!(caps.psn, 0x0023_4567);
        let bytes = caps.encode();
        assert_eq!(&bytes[0..4], &[0x67, 0x45, 0x23, 0x01]);
        assert_eq!(
            &bytes[8..24],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2]
        );
        assert_eq!(RdmaCaps::decode(&bytes), Some(caps));
        assert_eq!(RdmaCaps::decode(&[0; CAPS_LEN]), None);
    }

    #[test]
    fn upgrade_rule() {
        let peer = RdmaCaps::for_qp(17, [1; 16]).encode();
        assert_eq!(
            decide(false, &peer),
            Upgrade::Stay(StayReason::NoLocalDevice)
        );
        assert_eq!(
            decide(true, &[0; CAPS_LEN]),
            Upgrade::Stay(StayReason::PeerWithoutRdma)
        );
        assert_eq!(
            decide(true, &peer),
            Upgrade::Switch(RdmaCaps::decode(&peer).unwrap())
        );
    }

    #[test]
    fn gid_choice_prefers_roce_v2_and_honours_the_forced_index() {
        let target = target_gid("192.168.1.5".parse().unwrap());
        let other = target_gid("192.168.1.6".parse().unwrap());
        let entries = [
            GidEntry {
                index: 0,
                gid: target,
                kind: GidKind::Ib,
            },
            GidEntry {
                index: 1,
                gid: target,
                kind: GidKind::RoceV1,
            },
            GidEntry {
                index: 2,
                gid: other,
                kind: GidKind::RoceV2,
            },
            GidEntry {
                index: 3,
                gid: target,
                kind: GidKind::RoceV2,
            },
        ];
        assert_eq!(choose_gid(&entries, &target, None), Some(3));
        assert_eq!(choose_gid(&entries[..3], &target, None), Some(1));
        assert_eq!(choose_gid(&entries[..1], &target, None), None);
        assert_eq!(choose_gid(&[], &target, Some(7)), Some(7));
    }

    #[test]
    fn transport_mode_parses() {
        assert_eq!("rdma".parse(), Ok(TransportMode::Rdma));
        assert!("udp".parse::<TransportMode>().is_err());
        assert!(!TransportMode::Tcp.probes());
        assert!(TransportMode::Rdma.probes());
    }
}
