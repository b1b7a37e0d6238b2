//! The command line: the reference `rpc-server`'s flags plus this server's limits.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use clap::Parser;
use proto_core::comm::LinkVariant;
use proto_core::wire::ProtocolVersion;
use shell_common::tls::TlsFiles;
use shell_common::{
    CommPeers, DEFAULT_COMM_TIMEOUT, DEFAULT_HELLO_TIMEOUT, DEFAULT_MAX_CLIENTS,
    DEFAULT_MAX_CLIENTS_PER_ADDRESS, DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_MIN_PROGRESS_RATE,
    DEFAULT_PROGRESS_WINDOW,
};

use crate::shells;

/// A ggml RPC server (wire compatible with llama.cpp's `rpc-server`, protocols 7.0.0, 8.0.0
/// and 8.0.1).
#[derive(Debug, Parser)]
#[command(name = "ggml-rpc-server", version)]
pub struct Args {
    /// IPv4 address to bind (dotted quad). Anything but a loopback address needs TLS
    /// (--tls-cert, --tls-key, --tls-client-ca) or --insecure-plain.
    #[arg(short = 'H', long, default_value = "127.0.0.1", value_parser = parse_host)]
    pub host: Ipv4Addr,

    /// TCP port to listen on (1-65535).
    #[arg(short, long, default_value_t = 50052, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,

    /// Devices to expose, separated by ',' or '/', matched case-insensitively (only "CPU"
    /// exists in this build). The order is the device index on the wire.
    #[arg(short, long, value_name = "LIST")]
    pub device: Option<String>,

    /// Compute threads of the CPU backend [default: half the hardware threads, at least 1].
    #[arg(short, long, value_parser = parse_threads)]
    pub threads: Option<usize>,

    /// Enable the local tensor cache in the reference's directory ($LLAMA_CACHE/rpc, else
    /// $XDG_CACHE_HOME/llama.cpp/rpc, else $HOME/.cache/llama.cpp/rpc).
    #[arg(short, long)]
    pub cache: bool,

    /// Enable the local tensor cache in this directory instead (implies --cache).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Protocol to serve: 7 (llama.cpp b11434 to before b11739), 8.0.0 (b11739 to before
    /// b12032), 8.0.1 (b12032 and later); 8 means the newest 8.x. Choose the one of your
    /// clients' llama.cpp: 8.0.0 and 8.0.1 clients accept each other's servers but number
    /// ggml's ops differently, and nothing on the wire tells which a client is.
    #[arg(long, default_value = "8", value_parser = parse_protocol)]
    pub protocol: ProtocolVersion,

    /// The server-to-server link of protocol 8.0.1 for tensor parallelism (COMM_INIT):
    /// `ranked`, the newest upstream link (llama.cpp with PR #28967; any number of ranks), or
    /// `pairwise`, the link of b12032 up to that change (two ranks). Every server of a group
    /// must use the same: nothing on the wire tells them apart. Protocol 8.0.0 always uses
    /// its own (pairwise) link.
    #[arg(long, default_value = "ranked", value_parser = parse_comm_link)]
    pub comm_link: LinkVariant,

    /// Bound in seconds on every wait for another server of a comm group: the link set-up
    /// (rank 0 waiting for its peers), each exchange, each all-reduce (the reference waits
    /// forever).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_COMM_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub comm_timeout: u64,

    /// Addresses (10.0.0.7) or networks (10.0.0.0/24), comma-separated or repeated, that the
    /// comm link may connect to and accept from. Default: any, as the reference, where a client's
    /// COMM_INIT can make the server connect to any address.
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = CommPeers::parse_entry)]
    pub comm_peers: Option<Vec<ipnet::IpNet>>,

    /// A server REMOTE_COPY_TENSOR (our extension) may push tensors to, as HOST:PORT,
    /// resolved once at start-up (repeatable). None by default: every remote copy is refused,
    /// so a client cannot make this server connect anywhere.
    #[arg(long = "peer", value_name = "HOST:PORT")]
    pub peers: Vec<String>,

    /// Do not offer our extensions (HELLO flags bit 7): the server then behaves exactly as
    /// llama.cpp's on the wire.
    #[arg(long)]
    pub no_extensions: bool,

    /// Most clients served at once; further connections are closed immediately.
    #[arg(long, default_value_t = DEFAULT_MAX_CLIENTS, value_parser = parse_max_clients)]
    pub max_clients: usize,

    /// Most clients served at once from one IP address. When an address (or the server) is
    /// full, its oldest connection still awaiting HELLO, else its session idle longest that
    /// holds no buffers, is closed to make room; if none can be, the new one is refused.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CLIENTS_PER_ADDRESS, value_parser = parse_max_clients)]
    pub max_clients_per_address: usize,

    /// Seconds a new connection has to complete HELLO (0: no deadline).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_HELLO_TIMEOUT.as_secs())]
    pub hello_timeout: u64,

    /// While a message arrives or a reply drains, at least --min-progress-rate bytes a second
    /// must move, measured over each window of this many seconds, else the connection closes
    /// (0: no check). Idle sessions between commands are never closed for it.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_PROGRESS_WINDOW.as_secs())]
    pub progress_window: u64,

    /// The rate in bytes a second of --progress-window.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MIN_PROGRESS_RATE)]
    pub min_progress_rate: u64,

    /// Most bytes of buffers one client may hold (default: unlimited).
    #[arg(long, value_name = "BYTES")]
    pub memory_quota: Option<u64>,

    /// Most bytes of buffers all clients together may hold (default: the memory available at
    /// start, less a tenth of the total, at least 1 GiB). ALLOC_BUFFER past it is refused as a
    /// failed allocation, and GET_DEVICE_MEMORY reports no more free than is left.
    #[arg(long, value_name = "BYTES")]
    pub memory_capacity: Option<u64>,

    /// Back buffers with the system's base pages only. By default buffers of 2 MiB or more
    /// are advised onto transparent huge pages (fewer TLB misses when weights stream through
    /// compute); turn that off where huge-page faults or compaction stalls cost more.
    #[arg(long)]
    pub no_huge_pages: bool,

    /// Keep the system's TCP congestion control on connections from this host too. By default
    /// those use CUBIC (else Reno): on loopback the pacing of BBR, a common system default,
    /// slows one large transfer by a third; with many concurrent transfers it helps a little.
    #[arg(long)]
    pub system_congestion_control: bool,

    /// Largest buffered request in bytes (GRAPH_COMPUTE and fixed-size commands; tensor data
    /// is streamed and not limited by this).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_MESSAGE_SIZE)]
    pub max_message_size: u64,

    /// Transport: `auto` (the reference's behaviour: switch a connection to RDMA when the
    /// client offers it and a device holds the connection's local address), `tcp` (never),
    /// `rdma` (only RDMA: a client that does not offer it, or a connection without a device,
    /// is closed with a logged reason). Every shell switches.
    #[arg(long, default_value = "auto", value_parser = ["tcp", "rdma", "auto"])]
    pub transport: String,

    /// Serve TLS 1.3 with this certificate chain (PEM); needs --tls-key and --tls-client-ca.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_client_ca"])]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_client_ca"])]
    pub tls_key: Option<PathBuf>,

    /// CA certificates (PEM): a client must present a certificate signed by one of them, or
    /// it is refused in the TLS handshake, before any command is read.
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_key"])]
    pub tls_client_ca: Option<PathBuf>,

    /// Serve plain TCP on a non-loopback --host (no authentication, no encryption: anyone who
    /// reaches the port controls the server). Without it such a server refuses to start.
    #[arg(long)]
    pub insecure_plain: bool,

    /// The I/O shell (runtime) that serves the connections.
    #[arg(long, default_value = shells::DEFAULT_SHELL, value_parser = clap::builder::PossibleValuesParser::new(shells::names()))]
    pub shell: String,

    /// More log output (-v debug, -vv trace). RUST_LOG overrides it.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// The reference accepts only a dotted-quad IPv4 literal (no names), and rejects
/// 255.255.255.255, which its parser cannot tell from an error.
fn parse_comm_link(text: &str) -> Result<LinkVariant, String> {
    match text {
        "ranked" => Ok(LinkVariant::Ranked),
        "pairwise" => Ok(LinkVariant::V8_0),
        _ => Err(format!("unknown comm link {text:?} (ranked or pairwise)")),
    }
}

fn parse_protocol(text: &str) -> Result<ProtocolVersion, String> {
    match text {
        "7" | "7.0.0" => Ok(ProtocolVersion::V7_0_0),
        "8.0.0" => Ok(ProtocolVersion::V8_0_0),
        "8" | "8.0.1" => Ok(ProtocolVersion::V8_0_1),
        _ => Err("expected 7, 8.0.0, 8.0.1 or 8 (the newest 8.x)".to_owned()),
    }
}

fn parse_host(text: &str) -> Result<Ipv4Addr, String> {
    match text.parse::<Ipv4Addr>() {
        Ok(addr) if addr != Ipv4Addr::BROADCAST => Ok(addr),
        _ => Err(format!("Invalid host address: {text}")),
    }
}

fn parse_threads(text: &str) -> Result<usize, String> {
    match text.parse::<i64>() {
        Ok(n) if n > 0 => usize::try_from(n).map_err(|e| e.to_string()),
        Ok(_) => Err("the thread count must be at least 1".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_max_clients(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("at least one client must be allowed".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

impl Args {
    /// The TLS files, when --tls-cert, --tls-key and --tls-client-ca are given (clap insists
    /// on all three together).
    pub fn tls_files(&self) -> Option<TlsFiles> {
        match (&self.tls_cert, &self.tls_key, &self.tls_client_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }),
            _ => None,
        }
    }

    /// Why this server must not start: plain TCP on a non-loopback address without
    /// --insecure-plain.
    pub fn refused_exposure(&self) -> Option<String> {
        (!self.host.is_loopback() && self.tls_files().is_none() && !self.insecure_plain).then(|| {
            format!(
                "refusing to serve plain TCP on {}: anyone who reaches it controls the server. \
                 Use --tls-cert/--tls-key/--tls-client-ca, or --insecure-plain on a trusted network",
                self.host
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_flags() {
        let args = Args::try_parse_from(["ggml-rpc-server"]).unwrap();
        assert_eq!(
            (
                args.max_clients_per_address,
                args.hello_timeout,
                args.progress_window,
                args.min_progress_rate
            ),
            (
                DEFAULT_MAX_CLIENTS_PER_ADDRESS,
                DEFAULT_HELLO_TIMEOUT.as_secs(),
                DEFAULT_PROGRESS_WINDOW.as_secs(),
                DEFAULT_MIN_PROGRESS_RATE
            )
        );
        let args = Args::try_parse_from([
            "ggml-rpc-server",
            "--max-clients-per-address",
            "3",
            "--hello-timeout",
            "0",
            "--progress-window",
            "5",
            "--min-progress-rate",
            "100",
        ])
        .unwrap();
        assert_eq!(
            (
                args.max_clients_per_address,
                args.hello_timeout,
                args.progress_window,
                args.min_progress_rate
            ),
            (3, 0, 5, 100)
        );
        assert!(
            Args::try_parse_from(["ggml-rpc-server", "--max-clients-per-address", "0"]).is_err()
        );
    }

    #[test]
    fn defaults_are_the_reference_ones() {
        let args = Args::try_parse_from(["ggml-rpc-server"]).unwrap();
        assert_eq!(args.host, Ipv4Addr::LOCALHOST);
        assert_eq!(args.port, 50052);
        assert_eq!(args.protocol, ProtocolVersion::V8_0_1);
        assert_eq!(args.shell, "tokio");
        assert!(!args.cache && args.cache_dir.is_none() && args.threads.is_none());
        assert!(!args.no_huge_pages && !args.system_congestion_control);
        assert!(args.tls_files().is_none() && args.refused_exposure().is_none());
    }

    #[test]
    fn plain_tcp_beyond_loopback_needs_tls_or_insecure_plain() {
        let args = Args::try_parse_from(["s", "-H", "0.0.0.0"]).unwrap();
        assert!(args
            .refused_exposure()
            .unwrap()
            .contains("--insecure-plain"));
        let args = Args::try_parse_from(["s", "-H", "0.0.0.0", "--insecure-plain"]).unwrap();
        assert!(args.refused_exposure().is_none());
        let args = Args::try_parse_from(["s", "-H", "127.0.0.2"]).unwrap();
        assert!(args.refused_exposure().is_none());
        let tls = [
            "s",
            "-H",
            "10.0.0.1",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--tls-client-ca",
            "ca",
        ];
        let args = Args::try_parse_from(tls).unwrap();
        assert!(args.refused_exposure().is_none());
        assert_eq!(args.tls_files().unwrap().ca, PathBuf::from("ca"));
        // All three or none.
        assert!(Args::try_parse_from(["s", "--tls-cert", "c", "--tls-key", "k"]).is_err());
        assert!(Args::try_parse_from(["s", "--tls-client-ca", "ca"]).is_err());
    }

    #[test]
    fn comm_flags() {
        let args = Args::try_parse_from(["ggml-rpc-server"]).unwrap();
        assert_eq!(args.comm_link, LinkVariant::Ranked);
        assert_eq!(args.comm_timeout, DEFAULT_COMM_TIMEOUT.as_secs());
        assert_eq!(args.comm_peers, None);
        let args = Args::try_parse_from([
            "ggml-rpc-server",
            "--comm-link",
            "pairwise",
            "--comm-timeout",
            "5",
            "--comm-peers",
            "10.0.0.0/24,10.1.0.7",
            "--comm-peers",
            "192.168.0.0/16",
        ])
        .unwrap();
        assert_eq!(args.comm_link, LinkVariant::V8_0);
        assert_eq!(args.comm_timeout, 5);
        let peers = args.comm_peers.unwrap();
        assert_eq!(peers.len(), 3);
        assert_eq!(peers[1].to_string(), "10.1.0.7/32");
        for bad in [
            &["--comm-link", "ring"][..],
            &["--comm-timeout", "0"],
            &["--comm-peers", "example.com"],
            &["--comm-peers", "10.0.0.0/40"],
        ] {
            let argv = std::iter::once("ggml-rpc-server").chain(bad.iter().copied());
            assert!(Args::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn flags_parse_and_bad_values_are_refused() {
        let args = Args::try_parse_from([
            "ggml-rpc-server",
            "-H",
            "0.0.0.0",
            "-p",
            "1234",
            "-d",
            "cpu",
            "-t",
            "3",
            "-c",
            "--protocol",
            "7",
            "--max-clients",
            "2",
            "--memory-quota",
            "1048576",
            "--no-huge-pages",
            "--system-congestion-control",
            "-vv",
        ])
        .unwrap();
        assert_eq!(args.host, Ipv4Addr::UNSPECIFIED);
        assert_eq!(
            (args.port, args.threads, args.protocol),
            (1234, Some(3), ProtocolVersion::V7_0_0)
        );
        for (text, version) in [
            ("8.0.0", ProtocolVersion::V8_0_0),
            ("8.0.1", ProtocolVersion::V8_0_1),
            ("8", ProtocolVersion::V8_0_1),
            ("7.0.0", ProtocolVersion::V7_0_0),
        ] {
            let args = Args::try_parse_from(["ggml-rpc-server", "--protocol", text]).unwrap();
            assert_eq!(args.protocol, version, "{text}");
        }
        assert_eq!(args.device.as_deref(), Some("cpu"));
        assert!(args.cache && args.no_huge_pages && args.system_congestion_control);
        assert_eq!(
            (args.max_clients, args.memory_quota, args.verbose),
            (2, Some(1 << 20), 2)
        );
        for bad in [
            &["-H", "localhost"][..],
            &["-H", "255.255.255.255"],
            &["-p", "0"],
            &["-p", "65536"],
            &["-t", "0"],
            &["-t", "-2"],
            &["--protocol", "9"],
            &["--protocol", "8.0.2"],
            &["--protocol", "8.1"],
            &["--shell", "nope"],
            &["--max-clients", "0"],
        ] {
            let argv = std::iter::once("ggml-rpc-server").chain(bad.iter().copied());
            assert!(Args::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }
}
