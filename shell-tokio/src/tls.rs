//! The TLS handshake in front of a connection (`ServerConfig::tls`): the client's certificate
//! is checked before the connection's driver exists, so a refused client never has a byte read
//! as a command. The handshake is bounded (`ServerTls::handshake_timeout`): a peer that
//! connects and says nothing holds its client slot no longer.

use std::sync::Arc;
use std::time::Duration;

use proto_core::backend::Backend;
use shell_common::shell::{self, ClientSlot, FINAL_FLUSH_TIMEOUT};
use shell_common::tls::{self, HandshakeTimedOut, SOCKET_READ_BUFFER};
use shell_common::{ConnectionConfig, ServerConfig};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::connection::{self, Blocking};

/// The acceptor of a server configured with TLS, and the bound on its handshakes.
#[derive(Clone)]
pub(crate) struct Acceptor {
    acceptor: TlsAcceptor,
    timeout: Duration,
}

/// The acceptor of a server configured with TLS.
pub(crate) fn acceptor(config: &ServerConfig) -> Option<Acceptor> {
    config.tls.as_ref().map(|tls| Acceptor {
        acceptor: TlsAcceptor::from(tls.config.clone()),
        timeout: tls.handshake_timeout,
    })
}

/// Runs an accepted TCP client behind a TLS handshake to its end and logs how it ended.
pub(crate) async fn run(
    stream: TcpStream,
    acceptor: Acceptor,
    backend: Arc<dyn Backend>,
    config: Arc<ConnectionConfig>,
    mut stop: watch::Receiver<bool>,
    blocking: Blocking,
    slot: ClientSlot,
) {
    shell::accepted(&stream);
    let buffered = BufReader::with_capacity(SOCKET_READ_BUFFER, stream);
    let handshake = tokio::time::timeout(acceptor.timeout, acceptor.acceptor.accept(buffered));
    let mut stream = tokio::select! {
        done = handshake => match done {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return tls::handshake_refused(&error),
            Err(_) => return tls::handshake_refused(&HandshakeTimedOut(acceptor.timeout)),
        },
        // Shutting down: a handshake in progress is no command to finish.
        _ = stop.changed() => return,
    };
    tls::handshake_done(stream.get_ref().1.protocol_version());
    let monitor = Some(slot.monitor());
    let result =
        connection::serve(&mut stream, backend, &config, &mut stop, blocking, monitor).await;
    // close_notify, so the peer can tell our end from a cut connection.
    let _ = tokio::time::timeout(FINAL_FLUSH_TIMEOUT, stream.shutdown()).await;
    drop(stream);
    shell::log_end(&slot.ending(result));
}
