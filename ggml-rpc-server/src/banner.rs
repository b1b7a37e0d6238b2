//! The start-up banner and the exposure warning, as the reference prints them (§11.2), plus one
//! line naming the clients the chosen protocol serves.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use proto_core::comm::LinkVariant;
use proto_core::ggml::GgmlTable;
use proto_core::wire::ProtocolVersion;

use crate::devices::DeviceInfo;
use shell_common::transport::{TransportMode, NO_RDMA_ENV};

/// The banner printed to stdout once the server listens.
pub fn banner(
    version: ProtocolVersion,
    link: LinkVariant,
    endpoint: SocketAddr,
    cache: Option<&Path>,
    devices: &[DeviceInfo],
    transport: &str,
) -> String {
    let mut out = String::new();
    let cache = cache.map_or_else(|| "n/a".to_owned(), |dir| dir.display().to_string());
    let _ = writeln!(out, "Starting RPC server v{version}");
    let _ = writeln!(out, "  endpoint       : {endpoint}");
    let _ = writeln!(out, "  clients        : {}", served_clients(version));
    if let Some(link) = comm_link(version, link) {
        let _ = writeln!(out, "  comm link      : {link}");
    }
    let _ = writeln!(out, "  local cache    : {cache}");
    let _ = writeln!(out, "Devices:");
    for device in devices {
        let _ = writeln!(
            out,
            "  {}: {} ({} MiB, {} MiB free)",
            device.name,
            device.description,
            device.memory.total / (1024 * 1024),
            device.memory.free / (1024 * 1024)
        );
    }
    let _ = writeln!(out, "  transport      : {transport}");
    out
}

/// The banner's transport line: the reference's texts ("TCP", "TCP (RDMA auto-negotiate
/// enabled)", §10.5), told truthfully for this server's mode, shell and RDMA devices.
pub fn transport_line(
    mode: TransportMode,
    shell_switches: bool,
    rdma_devices: &[String],
) -> String {
    let devices = if rdma_devices.is_empty() {
        "no RDMA device found".to_owned()
    } else {
        format!("devices: {}", rdma_devices.join(", "))
    };
    match (mode, shell_switches) {
        (TransportMode::Tcp, _) => "TCP".to_owned(),
        (_, false) => "TCP (this shell does not switch to RDMA)".to_owned(),
        (TransportMode::Auto, true) if std::env::var_os(NO_RDMA_ENV).is_some() => {
            format!("TCP ({NO_RDMA_ENV} is set)")
        }
        (TransportMode::Auto, true) => format!("TCP (RDMA auto-negotiate enabled; {devices})"),
        (TransportMode::Rdma, true) => {
            format!("RDMA only (clients without RDMA are refused; {devices})")
        }
    }
}

/// Which llama.cpp clients a protocol serves, and what the others need: 8.0.0 and 8.0.1
/// clients accept either server but number ggml's ops differently (PROTOCOL.md §1.6).
pub fn served_clients(version: ProtocolVersion) -> &'static str {
    match (version.major, version.ggml_table()) {
        (7, _) => "llama.cpp of protocol 7.x (b11434); 8.x clients refuse this server",
        (_, GgmlTable::V8_0_0) => {
            "llama.cpp of protocol 8.0.0 (b11739); 8.0.1 clients (b12032 and later) need \
             --protocol 8.0.1"
        }
        _ => {
            "llama.cpp of protocol 8.0.1 (b12032 and later); 8.0.0 clients (b11739) need \
             --protocol 8.0.0"
        }
    }
}

/// The server-to-server link of `-sm tensor` groups (protocol 8 only).
pub fn comm_link(version: ProtocolVersion, link: LinkVariant) -> Option<&'static str> {
    match (version.major, version.ggml_table(), link) {
        (7, _, _) => None,
        (_, GgmlTable::V8_0_0, _) => Some("8.0.0 pairwise (two servers)"),
        (_, _, LinkVariant::Ranked) => Some(
            "ranked (llama.cpp with PR #28967, any number of servers; --comm-link pairwise \
             for b12032+1 without it)",
        ),
        (_, _, LinkVariant::V8_0) => Some(
            "pairwise (two servers, b12032+1 without PR #28967; --comm-link ranked for \
             llama.cpp with it)",
        ),
    }
}

/// The warning block printed to stderr when the server binds to anything but 127.0.0.1; with
/// `comm_open` (protocol 8 without `--comm-peers`) one more line says that clients can make the
/// server connect anywhere.
pub fn exposure_warning(host: &str, comm_open: bool, tls: bool) -> Option<String> {
    if host == "127.0.0.1" {
        return None;
    }
    if tls {
        // Clients need a certificate of the CA; the comm link (COMM_INIT) is still plain TCP.
        return comm_open.then(|| {
            "\nWARNING: TLS protects the client port only: the comm link (COMM_INIT) is \
             plain TCP; limit it with --comm-peers.\n\n"
                .to_owned()
        });
    }
    let bar = "!".repeat(73);
    let comm = if comm_open {
        "         COMM_INIT lets any client make this server connect to, and accept\n\
         \x20        from, any address: limit that with --comm-peers.\n"
    } else {
        ""
    };
    Some(format!(
        "\n{bar}\n\
         WARNING: Host ('{host}') is != '127.0.0.1'\n\
         \x20        Never expose the RPC server to an open network!\n\
         \x20        This is an experimental feature and is not secure!\n\
         {comm}{bar}\n\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto_core::backend::DeviceMemory;

    #[test]
    fn banner_lists_endpoint_cache_and_devices() {
        let devices = [DeviceInfo {
            name: "CPU".into(),
            description: "Some CPU".into(),
            memory: DeviceMemory {
                free: 3 << 20,
                total: 8 << 20,
            },
        }];
        let text = banner(
            ProtocolVersion::V8_0_0,
            LinkVariant::V8_0,
            "127.0.0.1:50052".parse().unwrap(),
            None,
            &devices,
            "TCP",
        );
        assert_eq!(
            text,
            "Starting RPC server v8.0.0\n  endpoint       : 127.0.0.1:50052\n  clients        : \
             llama.cpp of protocol 8.0.0 (b11739); 8.0.1 clients (b12032 and later) need \
             --protocol 8.0.1\n  comm link      : 8.0.0 pairwise (two servers)\n  \
             local cache    : n/a\n\
             Devices:\n  CPU: Some CPU (8 MiB, 3 MiB free)\n  transport      : TCP\n"
        );
    }

    #[test]
    fn transport_line_tells_mode_shell_and_devices() {
        let none: [String; 0] = [];
        assert_eq!(transport_line(TransportMode::Tcp, true, &none), "TCP");
        assert_eq!(
            transport_line(TransportMode::Auto, false, &none),
            "TCP (this shell does not switch to RDMA)"
        );
        assert_eq!(
            transport_line(TransportMode::Rdma, true, &["rxe0".into()]),
            "RDMA only (clients without RDMA are refused; devices: rxe0)"
        );
    }

    #[test]
    fn comm_link_line_follows_protocol_and_choice() {
        assert_eq!(
            comm_link(ProtocolVersion::V7_0_0, LinkVariant::Ranked),
            None
        );
        assert!(comm_link(ProtocolVersion::V8_0_0, LinkVariant::Ranked)
            .unwrap()
            .starts_with("8.0.0 pairwise"));
        assert!(comm_link(ProtocolVersion::V8_0_1, LinkVariant::Ranked)
            .unwrap()
            .starts_with("ranked"));
        assert!(comm_link(ProtocolVersion::V8_0_1, LinkVariant::V8_0)
            .unwrap()
            .starts_with("pairwise"));
    }

    #[test]
    fn warning_only_off_loopback() {
        assert_eq!(exposure_warning("127.0.0.1", true, false), None);
        let warning = exposure_warning("0.0.0.0", false, false).unwrap();
        assert!(warning.contains("WARNING: Host ('0.0.0.0') is != '127.0.0.1'"));
        assert!(warning.contains("         Never expose the RPC server to an open network!"));
        assert!(!warning.contains("--comm-peers"));
        let warning = exposure_warning("0.0.0.0", true, false).unwrap();
        assert!(warning.contains("         COMM_INIT lets any client"));
        assert!(warning.contains("limit that with --comm-peers."));
        // With TLS only the comm link is left to warn about.
        assert_eq!(exposure_warning("0.0.0.0", false, true), None);
        let warning = exposure_warning("0.0.0.0", true, true).unwrap();
        assert!(
            warning.contains("comm link (COMM_INIT) is plain TCP"),
            "{warning}"
        );
    }
}
