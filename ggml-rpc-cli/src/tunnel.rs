//! `ggml-rpc tunnel`: plain TCP from a local llama.cpp in, TLS 1.3 with a client certificate
//! out, one TLS connection per accepted connection.
//!
//! llama.cpp's RPC backend speaks plain TCP only; run next to it, the tunnel lets it use a
//! server started with `--tls-cert/--tls-key/--tls-client-ca` unmodified
//! (`--rpc 127.0.0.1:PORT`). Each side's buffer is fixed ([`BUFFER`]); the first side to end
//! (EOF or error) ends the pair: the RPC protocol never half-closes, so the other side is shut
//! down at once.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use shell_common::tls::{HANDSHAKE_TIMEOUT, SOCKET_READ_BUFFER};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;
use tracing::Instrument;

/// Bytes buffered per direction of one carried connection.
pub const BUFFER: usize = 256 * 1024;
/// How long connecting to the server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the accept loop pauses after a failed accept (out of descriptors and similar).
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Where the tunnel goes and how it identifies itself.
#[derive(Clone)]
pub struct Tunnel {
    /// The TLS server, HOST:PORT.
    pub connect: String,
    /// The name the server's certificate must carry.
    pub server_name: ServerName<'static>,
    /// TLS 1.3 with our client certificate.
    pub tls: Arc<rustls::ClientConfig>,
}

/// Why one carried connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum CarryError {
    /// The server could not be reached.
    #[error("cannot connect to {to}: {source}")]
    Connect {
        /// The server.
        to: String,
        /// What the connect said.
        source: io::Error,
    },
    /// Connecting took longer than [`CONNECT_TIMEOUT`].
    #[error("connecting to {0} timed out")]
    ConnectTimeout(String),
    /// The TLS handshake failed (certificate refused either way, no TLS server there).
    #[error("TLS handshake with {to} failed: {source}")]
    Handshake {
        /// The server.
        to: String,
        /// What rustls said.
        source: io::Error,
    },
    /// The TLS handshake took longer than [`HANDSHAKE_TIMEOUT`].
    #[error("TLS handshake with {0} timed out")]
    HandshakeTimeout(String),
    /// Reading or writing either side failed after the handshake.
    #[error("{side}: {source}")]
    Io {
        /// "client" or "server".
        side: &'static str,
        /// The error.
        source: io::Error,
    },
}

/// Carries every connection accepted on `listener` until `shutdown` completes; then stops
/// accepting and drops the connections still open.
pub async fn serve(
    listener: TcpListener,
    tunnel: Tunnel,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let tunnel = Arc::new(tunnel);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (local, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "tunnel: accept failed");
                        tokio::time::sleep(ACCEPT_PAUSE).await;
                        continue;
                    }
                };
                let span = tracing::info_span!("tunnel", %peer);
                tasks.spawn(carry_logged(local, peer, tunnel.clone()).instrument(span));
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    tasks.shutdown().await;
    Ok(())
}

async fn carry_logged(local: TcpStream, peer: SocketAddr, tunnel: Arc<Tunnel>) {
    tracing::info!(to = %tunnel.connect, "tunnel: connection from {peer}");
    match carry(local, &tunnel).await {
        Ok(ended_by) => tracing::info!(ended_by, "tunnel: connection closed"),
        Err(error) => tracing::warn!(%error, "tunnel: connection closed on error"),
    }
}

/// Connects to the server over TLS and carries bytes both ways until either side ends.
/// Returns the side that ended it ("client" or "server").
async fn carry(local: TcpStream, tunnel: &Tunnel) -> Result<&'static str, CarryError> {
    let to = || tunnel.connect.clone();
    let remote = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&tunnel.connect))
        .await
        .map_err(|_| CarryError::ConnectTimeout(to()))?
        .map_err(|source| CarryError::Connect { to: to(), source })?;
    // Commands are small request/reply exchanges: no Nagle delay on either hop.
    let _ = local.set_nodelay(true);
    let _ = remote.set_nodelay(true);
    let connector = TlsConnector::from(tunnel.tls.clone());
    let remote = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        connector.connect(
            tunnel.server_name.clone(),
            BufReader::with_capacity(SOCKET_READ_BUFFER, remote),
        ),
    )
    .await
    .map_err(|_| CarryError::HandshakeTimeout(to()))?
    .map_err(|source| CarryError::Handshake { to: to(), source })?;
    let (local_read, local_write) = tokio::io::split(local);
    let (remote_read, remote_write) = tokio::io::split(remote);
    // Whichever direction ends first ends the pair (dropping the other half closes it).
    tokio::select! {
        up = pump(local_read, remote_write, "client", "server") => up.map(|()| "client"),
        down = pump(remote_read, local_write, "server", "client") => down.map(|()| "server"),
    }
}

/// Copies `from` into `to` through one buffer of [`BUFFER`] bytes until `from` ends; then
/// shuts `to` down (for TLS: close_notify).
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    from_side: &'static str,
    to_side: &'static str,
) -> Result<(), CarryError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; BUFFER];
    loop {
        let n = from
            .read(&mut buffer)
            .await
            .map_err(|source| CarryError::Io {
                side: from_side,
                source,
            })?;
        if n == 0 {
            break;
        }
        to.write_all(&buffer[..n])
            .await
            .map_err(|source| CarryError::Io {
                side: to_side,
                source,
            })?;
        // Flush per read: a request or reply must not wait in rustls's buffer.
        to.flush().await.map_err(|source| CarryError::Io {
            side: to_side,
            source,
        })?;
    }
    // Best effort: the pair ends either way.
    let _ = tokio::time::timeout(Duration::from_secs(1), to.shutdown()).await;
    Ok(())
}
