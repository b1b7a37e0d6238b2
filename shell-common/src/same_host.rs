//! TCP tuning for a peer on the same host: no pacing congestion control on loopback.
//!
//! Loopback has no congestion and no loss, yet a socket still runs the system's congestion
//! control, and where that is BBR (this machine's default, and common on servers) its pacing
//! throttles a sender that loopback could carry at memory speed: a 256 MiB GET_TENSOR from our
//! server went at 3.7-4.1 GB/s under BBR and 5.4-6.7 GB/s under CUBIC or Reno (the
//! reference's, bound by its own copies, 1.1-1.2 against 1.2-1.3). So a connection whose peer is
//! on this host gets CUBIC, else Reno (the one besides BBR that unprivileged processes may pick
//! by default); a connection to another host keeps whatever the administrator chose.
//!
//! The pacing still has its use with many concurrent transfers: sixteen clients each moving
//! 64 MiB at once made 10-15 % less aggregate throughput without it. [`set_tuning`] turns the
//! tuning off for the whole process (`ggml-rpc-server --system-congestion-control`).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether [`tune_for_peer`] tunes (process-wide, like the system setting it overrides).
static TUNING: AtomicBool = AtomicBool::new(true);

/// Turns the same-host tuning on (the default) or off for every socket tuned from now on.
pub fn set_tuning(enabled: bool) {
    TUNING.store(enabled, Ordering::Relaxed);
}

/// Whether the same-host tuning is on.
pub fn tuning() -> bool {
    TUNING.load(Ordering::Relaxed)
}

/// The congestion control algorithms tried for a same-host peer, in order.
pub const SAME_HOST_CONGESTION: [&str; 2] = ["cubic", "reno"];

/// Whether a connection between `local` and `peer` stays on this host (loopback, or our own
/// address on both ends), so that its segments never meet a real link.
pub fn is_same_host(local: SocketAddr, peer: SocketAddr) -> bool {
    let canonical = |ip: IpAddr| ip.to_canonical();
    let (local, peer) = (canonical(local.ip()), canonical(peer.ip()));
    peer.is_loopback() || peer == local
}

/// Tunes a connected TCP socket for its peer: for a same-host peer, the first of
/// [`SAME_HOST_CONGESTION`] the kernel lets this process set. Returns the algorithm set
/// (`None`: tuning off, another host, or none could be set, which only costs speed).
pub fn tune_for_peer<S: AsFd>(socket: &S) -> io::Result<Option<&'static str>> {
    if !tuning() {
        return Ok(None);
    }
    let socket = socket2::SockRef::from(socket);
    let (Some(local), Some(peer)) = (
        socket.local_addr()?.as_socket(),
        socket.peer_addr()?.as_socket(),
    ) else {
        return Ok(None);
    };
    if !is_same_host(local, peer) {
        return Ok(None);
    }
    let mut last_error = None;
    for name in SAME_HOST_CONGESTION {
        match socket.set_tcp_congestion(name.as_bytes()) {
            Ok(()) => return Ok(Some(name)),
            Err(error) => last_error = Some(error),
        }
    }
    if let Some(error) = last_error {
        tracing::debug!(%error, "cannot choose the congestion control of a same-host connection");
    }
    Ok(None)
}

/// [`tune_for_peer`], with a failure logged instead of returned (tuning never fails a
/// connection).
pub fn tune_or_log<S: AsFd>(socket: &S) {
    if let Err(error) = tune_for_peer(socket) {
        tracing::debug!(%error, "cannot tune the socket for its peer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn same_host_means_loopback_or_our_own_address() {
        assert!(is_same_host(
            addr("127.0.0.1:50052"),
            addr("127.0.0.1:41000")
        ));
        assert!(is_same_host(
            addr("127.0.0.1:50052"),
            addr("127.0.0.2:41000")
        ));
        assert!(is_same_host(addr("[::1]:50052"), addr("[::1]:41000")));
        assert!(is_same_host(addr("10.0.0.5:50052"), addr("10.0.0.5:41000")));
        assert!(is_same_host(
            addr("[::ffff:10.0.0.5]:50052"),
            addr("10.0.0.5:41000")
        ));
        assert!(!is_same_host(
            addr("10.0.0.5:50052"),
            addr("10.0.0.6:41000")
        ));
        assert!(!is_same_host(
            addr("[2001:db8::1]:1"),
            addr("[2001:db8::2]:2")
        ));
    }

    #[test]
    fn a_loopback_connection_leaves_pacing_congestion_control_behind() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let congestion = |socket: &TcpStream| {
            let name = socket2::SockRef::from(socket).tcp_congestion().unwrap();
            String::from_utf8_lossy(&name)
                .trim_end_matches('\0')
                .to_owned()
        };
        let system = congestion(&client);
        for socket in [&client, &server] {
            let chosen = tune_for_peer(socket).unwrap();
            let chosen = chosen.expect("reno is allowed to every process by default");
            assert!(SAME_HOST_CONGESTION.contains(&chosen));
            assert_eq!(congestion(socket), chosen);
        }
        // Switched off, a new connection keeps the system's choice.
        set_tuning(false);
        let other = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert_eq!(tune_for_peer(&other).unwrap(), None);
        assert_eq!(congestion(&other), system);
        set_tuning(true);
    }
}
