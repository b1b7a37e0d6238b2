//! `--comm-peers`: the addresses and networks a comm link may connect to and accept from.
//!
//! COMM_INIT names the host a server connects to, and rank 0 accepts on every interface, so
//! by default (as in the reference) a client can point a server at any address. A deployer who
//! exposes the server narrows that to the group's hosts.

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// Where comm links may reach: anywhere, or only the listed addresses and networks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommPeers {
    allowed: Option<Vec<IpNet>>,
}

impl CommPeers {
    /// Any address (the reference's behaviour).
    pub fn any() -> CommPeers {
        CommPeers { allowed: None }
    }

    /// Only these addresses and networks.
    pub fn only(networks: Vec<IpNet>) -> CommPeers {
        CommPeers {
            allowed: Some(networks),
        }
    }

    /// Whether the list restricts anything.
    pub fn is_restricted(&self) -> bool {
        self.allowed.is_some()
    }

    /// Whether a comm link may connect to or accept from `ip`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.allowed
            .as_ref()
            .is_none_or(|networks| networks.iter().any(|net| net.contains(&ip)))
    }

    /// Parses one `--comm-peers` entry: an address (`10.0.0.7`) or a network (`10.0.0.0/24`).
    pub fn parse_entry(text: &str) -> Result<IpNet, String> {
        IpNet::from_str(text)
            .or_else(|_| IpAddr::from_str(text).map(IpNet::from))
            .map_err(|_| format!("{text:?} is neither an IP address nor a network (a.b.c.d/len)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_networks() {
        let peers = CommPeers::only(vec![
            CommPeers::parse_entry("10.0.0.0/24").unwrap(),
            CommPeers::parse_entry("192.168.1.7").unwrap(),
        ]);
        assert!(peers.is_restricted());
        assert!(peers.allows("10.0.0.200".parse().unwrap()));
        assert!(!peers.allows("10.0.1.1".parse().unwrap()));
        assert!(peers.allows("192.168.1.7".parse().unwrap()));
        assert!(!peers.allows("192.168.1.8".parse().unwrap()));
        assert!(peers.allows("::ffff:10.0.0.3".parse().unwrap()));
        assert!(CommPeers::any().allows("203.0.113.9".parse().unwrap()));
        assert!(CommPeers::only(Vec::new()).is_restricted());
        assert!(!CommPeers::only(Vec::new()).allows("127.0.0.1".parse().unwrap()));
        assert!(CommPeers::parse_entry("example.com").is_err());
        assert!(CommPeers::parse_entry("10.0.0.0/33").is_err());
    }
}
