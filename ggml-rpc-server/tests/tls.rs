//! TLS 1.3 with client certificates (`ServerConfig::tls`, `--tls-*`): a client with a
//! certificate of the configured CA is served; one with a certificate of another CA, without
//! a certificate, or without TLS is refused in the handshake, before any command is read;
//! shells without TLS refuse to start with it.

#[allow(unused_macros)]
mod common;

use std::path::Path;
use std::sync::Arc;

use common::{capture_logs, within, Logs, TestServer};
use ggml_rpc_server::ServerConfig;
use proto_core::backend::MemoryBackend;
use proto_core::wire::{Dialect, ProtocolVersion, Request};
use rustls::crypto::ring::default_provider;
use shell_common::tls::test_certs::Ca;
use shell_common::tls::{client_config, ServerTls, TlsFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The server's files and a client's, both of `ca`.
fn identities(dir: &Path, ca: &Ca) -> (TlsFiles, TlsFiles) {
    let server = ca.leaf(dir, "server", &["localhost", "127.0.0.1"]);
    let client = ca.leaf(dir, "client", &["client"]);
    (server, client)
}

fn tls_config(server: &TlsFiles) -> ServerConfig {
    let mut config = ServerConfig::new(ProtocolVersion::V8_0_0);
    config.tls = Some(ServerTls::load(server).unwrap());
    config
}

/// Connects with `client` (a rustls client configuration), sends HELLO and returns what came
/// back before the connection ended (at most the 36-byte answer).
async fn hello(server: &TestServer, client: Arc<rustls::ClientConfig>) -> Vec<u8> {
    let tcp = within(TcpStream::connect(server.addr)).await.unwrap();
    let name = shell_common::tls::server_name("localhost").unwrap();
    // With TLS 1.3 the client may finish its side before the server has checked its
    // certificate: a refusal then shows on the first read.
    let Ok(mut tls) = within(TlsConnector::from(client).connect(name, tcp)).await else {
        return Vec::new();
    };
    let frame = Request::Hello { caps: [0; 24] }
        .to_frame(Dialect::V8)
        .unwrap();
    if tls.write_all(&frame).await.is_err() || tls.flush().await.is_err() {
        return Vec::new();
    }
    let mut answer = vec![0u8; 36];
    let mut got = 0;
    while got < answer.len() {
        match within(tls.read(&mut answer[got..])).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    answer.truncate(got);
    answer
}

/// The refusal's log line with its reason, and that the client never reached the connection
/// driver (whose end is always logged as "Client connection closed ...").
async fn refused(logs: &Logs, reason: &str) {
    logs.wait_for("Client connection refused: TLS handshake failed")
        .await;
    let text = logs.text();
    assert!(text.contains(reason), "{text}");
    assert!(!text.contains("Client connection closed"), "{text}");
}

async fn a_client_of_the_ca_is_served(shell: &'static str) {
    let dir = tempfile::tempdir().unwrap();
    let (server_files, client_files) = identities(dir.path(), &Ca::new("our CA"));
    let server = TestServer::start(shell, tls_config(&server_files));
    let answer = hello(&server, client_config(&client_files).unwrap()).await;
    assert_eq!(answer.len(), 36, "{answer:?}");
    assert_eq!(&answer[..8], &28u64.to_le_bytes());
    assert_eq!(answer[8], 8);
    server.shutdown().await;
}

async fn a_certificate_of_another_ca_is_refused(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let (server_files, _) = identities(dir.path(), &Ca::new("our CA"));
    let server = TestServer::start(shell, tls_config(&server_files));
    // Trusts the server's CA, but its own certificate is signed by another.
    let mut stranger = Ca::new("their CA").leaf(dir.path(), "stranger", &["stranger"]);
    stranger.ca = server_files.ca.clone();
    let answer = hello(&server, client_config(&stranger).unwrap()).await;
    assert!(answer.is_empty(), "{answer:?}");
    refused(&logs, "UnknownIssuer").await;
    assert_eq!(server.backend.live_buffers(), 0);
    server.shutdown().await;
}

async fn a_client_without_a_certificate_is_refused(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let (server_files, _) = identities(dir.path(), &Ca::new("our CA"));
    let server = TestServer::start(shell, tls_config(&server_files));
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(&server_files.ca).unwrap();
    use rustls::pki_types::pem::PemObject as _;
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(&ca).unwrap())
        .unwrap();
    let anonymous = rustls::ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let answer = hello(&server, Arc::new(anonymous)).await;
    assert!(answer.is_empty(), "{answer:?}");
    refused(&logs, "peer sent no certificates").await;
    server.shutdown().await;
}

async fn a_plain_client_is_refused(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let (server_files, _) = identities(dir.path(), &Ca::new("our CA"));
    let server = TestServer::start(shell, tls_config(&server_files));
    let mut raw = common::Raw::connect(server.addr, Dialect::V8).await;
    raw.send(&Request::Hello { caps: [0; 24] }).await;
    raw.expect_closed().await;
    refused(&logs, "TLS handshake failed").await;
    server.shutdown().await;
}

async fn a_silent_client_is_dropped_after_the_handshake_timeout(shell: &'static str) {
    let (logs, _guard) = capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let (server_files, client_files) = identities(dir.path(), &Ca::new("our CA"));
    let mut config = tls_config(&server_files);
    config.max_clients = 1;
    if let Some(tls) = config.tls.as_mut() {
        tls.handshake_timeout = std::time::Duration::from_millis(300);
    }
    let server = TestServer::start(shell, config);
    // Connects and sends nothing: closed at the timeout, which frees the only client slot.
    let mut silent = common::Raw::connect(server.addr, Dialect::V8).await;
    silent.expect_closed().await;
    refused(&logs, "no TLS handshake within 300ms").await;
    let answer = hello(&server, client_config(&client_files).unwrap()).await;
    assert_eq!(answer.len(), 36, "the slot was not freed: {answer:?}");
    server.shutdown().await;
}

#[cfg(feature = "tokio")]
mod tokio_shell {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
        super::a_silent_client_is_dropped_after_the_handshake_timeout("tokio").await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_of_the_ca_is_served() {
        super::a_client_of_the_ca_is_served("tokio").await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_certificate_of_another_ca_is_refused() {
        super::a_certificate_of_another_ca_is_refused("tokio").await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_without_a_certificate_is_refused() {
        super::a_client_without_a_certificate_is_refused("tokio").await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plain_client_is_refused() {
        super::a_plain_client_is_refused("tokio").await
    }
}

/// The shells without TLS refuse a configuration with it instead of serving in clear.
#[test]
fn shells_without_tls_refuse_to_start_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let (server_files, _) = identities(dir.path(), &Ca::new("our CA"));
    for shell in ggml_rpc_server::shells::names() {
        if shell == "tokio" {
            continue;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let backend = Arc::new(MemoryBackend::new(1, 1 << 20));
        let error = ggml_rpc_server::start(shell, listener, backend, tls_config(&server_files))
            .err()
            .unwrap_or_else(|| panic!("the {shell} shell started with TLS"));
        let text = format!("{error:#}");
        assert!(text.contains("cannot serve TLS"), "{shell}: {text}");
    }
}
