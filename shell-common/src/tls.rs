//! TLS 1.3 with client certificates (`--tls-cert`, `--tls-key`, `--tls-client-ca`): the
//! server's rustls configuration, and the client configuration `ggml-rpc tunnel` uses.
//!
//! Both sides present a certificate and verify the other's against one CA: a client without a
//! certificate signed by the server's `--tls-client-ca` is refused in the handshake, before a
//! byte of the protocol is read. Only TLS 1.3 and the `ring` provider (aws-lc-rs needs cmake);
//! the provider is passed to each configuration, never installed process-wide.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::ring::{cipher_suite, default_provider};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// How long a TLS handshake may take before the connection is closed: a peer that connects
/// and sends nothing holds no client slot longer than this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{what} {path}: {source}")]
    Pem {
        /// Which file ("certificate", "private key", "CA certificate").
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: rustls::pki_types::pem::Error,
    },
    /// A PEM file held no certificate.
    #[error("{what} {path}: no certificate in the file")]
    NoCertificate {
        /// Which file.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A CA certificate was not accepted as a trust anchor.
    #[error("CA certificate {path}: {source}")]
    BadCa {
        /// The file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// rustls refused the combination (a key that does not match the certificate, ...).
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// `--server-name` is no DNS name or IP address.
    #[error("server name {0:?} is not a DNS name or an IP address")]
    ServerName(String),
}

/// The three files of a TLS identity: our certificate chain, its key, and the CA the other
/// side's certificate must be signed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Our certificate chain (PEM, leaf first).
    pub cert: PathBuf,
    /// The private key of the leaf (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA certificates (PEM) that sign the other side's certificate.
    pub ca: PathBuf,
}

/// A server's TLS: the rustls configuration every accepted connection is handshaken with, and
/// the one it connects to other servers with (remote-copy pushes).
#[derive(Clone)]
pub struct ServerTls {
    /// The acceptor's configuration (TLS 1.3 only, client certificates required).
    pub config: Arc<ServerConfig>,
    /// As a client of another server: the same certificate, the same CA for the peer's.
    pub client: ClientTls,
    /// How long an accepted connection's handshake may take ([`HANDSHAKE_TIMEOUT`]).
    pub handshake_timeout: Duration,
    /// The files it was built from (for the banner and the logs).
    pub files: TlsFiles,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish()
    }
}

impl ServerTls {
    /// Loads the files and builds the server configuration: TLS 1.3, our chain and key, and
    /// a client certificate signed by `files.ca` required of every client.
    pub fn load(files: &TlsFiles) -> Result<ServerTls, TlsError> {
        let provider = provider();
        let roots = Arc::new(roots(&files.ca)?);
        let verifier =
            WebPkiClientVerifier::builder_with_provider(roots, provider.clone()).build()?;
        let config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain(&files.cert)?, key(&files.key)?)?;
        Ok(ServerTls {
            config: Arc::new(config),
            client: ClientTls(client_config(files)?),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            files: files.clone(),
        })
    }
}

/// A client configuration that compares by identity (so settings holding one stay `Eq`).
#[derive(Clone)]
pub struct ClientTls(pub Arc<ClientConfig>);

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientTls")
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &ClientTls) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ClientTls {}

/// The client side (the tunnel, a server pushing to another): TLS 1.3, servers verified against `files.ca`, our chain and
/// key presented as the client certificate.
pub fn client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, TlsError> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(&files.ca)?)
        .with_client_auth_cert(chain(&files.cert)?, key(&files.key)?)?;
    Ok(Arc::new(config))
}

/// ring's TLS 1.3 suites with AES-128-GCM first: a third less work per byte than ring's
/// default AES-256-GCM, and bulk tensor data is what this link carries.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..default_provider()
    })
}

/// rustls reads the socket 4 KiB at a time; a buffer of this size under it turns those into
/// one system call per this many bytes.
pub const SOCKET_READ_BUFFER: usize = 256 * 1024;

/// The name the server's certificate must carry: a DNS name or an IP address.
pub fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName(name.to_owned()))
}

/// Logs a refused or failed handshake (wrong or missing client certificate, a peer that
/// speaks no TLS, the timeout): the connection closes before any command is read.
pub fn handshake_refused(reason: &dyn fmt::Display) {
    tracing::warn!(%reason, "Client connection refused: TLS handshake failed");
}

/// Logs a completed handshake.
pub fn handshake_done(version: Option<rustls::ProtocolVersion>) {
    tracing::debug!(?version, "TLS handshake completed");
}

/// Why a handshake did not complete in time.
#[derive(Debug, thiserror::Error)]
#[error("no TLS handshake within {0:?}")]
pub struct HandshakeTimedOut(pub Duration);

fn chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    certificates(path, "certificate")
}

fn certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        what,
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        what: "private key",
        path: path.to_owned(),
        source,
    })
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path, "CA certificate")? {
        roots.add(cert).map_err(|source| TlsError::BadCa {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(roots)
}

/// Test certificates: a CA and leaves it signs, written as PEM files (for the tests of the
/// shells, the server and the tunnel).
#[cfg(any(test, feature = "test-certs"))]
pub mod test_certs {
    use std::path::Path;

    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};

    use super::TlsFiles;

    /// A CA that signs leaf certificates.
    pub struct Ca {
        cert: rcgen::Certificate,
        key: KeyPair,
    }

    impl Ca {
        /// A fresh self-signed CA.
        pub fn new(name: &str) -> Ca {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let key = KeyPair::generate().expect("key");
            let cert = params.self_signed(&key).expect("self-signed");
            Ca { cert, key }
        }

        /// Writes a leaf for `names` (DNS names or IP addresses) signed by this CA and this
        /// CA's certificate into `dir` as `{stem}.crt`, `{stem}.key`, `{stem}-ca.crt`.
        pub fn leaf(&self, dir: &Path, stem: &str, names: &[&str]) -> TlsFiles {
            let params = CertificateParams::new(
                names
                    .iter()
                    .map(|name| name.to_string())
                    .collect::<Vec<_>>(),
            )
            .expect("params");
            let key = KeyPair::generate().expect("key");
            let cert = params
                .signed_by(&key, &self.cert, &self.key)
                .expect("signed");
            let files = TlsFiles {
                cert: dir.join(format!("{stem}.crt")),
                key: dir.join(format!("{stem}.key")),
                ca: dir.join(format!("{stem}-ca.crt")),
            };
            std::fs::write(&files.cert, cert.pem()).expect("write cert");
            std::fs::write(&files.key, key.serialize_pem()).expect("write key");
            std::fs::write(&files.ca, self.cert.pem()).expect("write ca");
            files
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_certs::Ca;
    use super::*;

    #[test]
    fn loads_server_and_client_configurations() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("test CA");
        let server = ca.leaf(dir.path(), "server", &["localhost", "127.0.0.1"]);
        let client = ca.leaf(dir.path(), "client", &["client"]);
        ServerTls::load(&server).unwrap();
        client_config(&client).unwrap();
        assert!(server_name("127.0.0.1").is_ok());
        assert!(server_name("not a name").is_err());
    }

    #[test]
    fn names_the_file_that_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("test CA");
        let mut files = ca.leaf(dir.path(), "server", &["localhost"]);
        files.key = dir.path().join("missing.key");
        let error = ServerTls::load(&files).unwrap_err().to_string();
        assert!(
            error.contains("private key") && error.contains("missing.key"),
            "{error}"
        );
        files.key = files.cert.clone();
        assert!(ServerTls::load(&files).is_err());
        files = ca.leaf(dir.path(), "other", &["localhost"]);
        files.ca = files.key.clone();
        let error = ServerTls::load(&files).unwrap_err().to_string();
        assert!(error.contains("no certificate"), "{error}");
    }
}
