//! In-memory drivers of our sessions: a server (the connection driver every shell runs, over
//! [`MemoryBackend`]) and a client, fed with raw bytes. Used by the vector checks and by cross-crate tests.

use std::sync::Arc;

use bytes::Bytes;
use proto_core::backend::MemoryBackend;
use proto_core::dispatch::DispatcherConfig;
use proto_core::driver::{Action, CommWork, Connection, Place};
use proto_core::session::{
    ClientEvent, ClientSession, ServerEvent, ServerSession, ServerSessionConfig, TensorWrite,
};
use proto_core::tensor_cache::MemoryTensorCache;
use proto_core::wire::{
    Command, ConnCaps, Dialect, ProtocolVersion, Request, Response, CONN_CAPS_SIZE,
};
use proto_core::Error;

/// Parameters of a [`ServerHarness`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Number of devices of the memory backend.
    pub devices: u32,
    /// Bytes per device (also each device's `max_size`).
    pub device_memory: u64,
    /// Per-connection limit on buffer bytes.
    pub memory_quota: Option<u64>,
    /// Largest buffered request.
    pub max_message_size: u64,
    /// Whether the server has an (initially empty) in-memory tensor cache.
    pub tensor_cache: bool,
    /// Transport caps announced in HELLO.
    pub caps: ConnCaps,
}

/// The alignment [`MemoryBackend`] reports for every device.
pub const MEMORY_BACKEND_ALIGNMENT: u64 = 32;

impl ServerConfig {
    /// One device of 1 GiB, no quota, the session's default message limit, no cache, TCP caps.
    pub fn new(dialect: Dialect) -> ServerConfig {
        ServerConfig {
            devices: 1,
            device_memory: 1 << 30,
            memory_quota: None,
            max_message_size: ServerSessionConfig::new(dialect).max_message_size,
            tensor_cache: false,
            caps: [0; CONN_CAPS_SIZE],
        }
    }
}

/// A server connection over [`MemoryBackend`], fed with bytes.
pub struct ServerHarness {
    /// The connection.
    pub conn: Connection<MemoryBackend>,
    /// The backend.
    pub backend: Arc<MemoryBackend>,
}

impl ServerHarness {
    /// A fresh connection speaking `version`.
    pub fn new(version: ProtocolVersion, config: &ServerConfig) -> Result<ServerHarness, Error> {
        let dialect = version.dialect().ok_or(Error::VersionMismatch {
            major: version.major,
            minor: version.minor,
            patch: version.patch,
        })?;
        let backend = Arc::new(MemoryBackend::new(config.devices, config.device_memory));
        let mut dispatch = DispatcherConfig::new(version);
        dispatch.caps = config.caps;
        dispatch.memory_quota = config.memory_quota;
        if config.tensor_cache {
            dispatch.tensor_cache = Some(Arc::new(MemoryTensorCache::default()));
        }
        let mut session_config = ServerSessionConfig::new(dialect);
        session_config.max_message_size = config.max_message_size;
        Ok(ServerHarness {
            conn: Connection::new(backend.clone(), &session_config, &dispatch, false)?,
            backend,
        })
    }

    /// Feeds bytes, runs every event they complete, and returns everything the server wrote.
    /// COMM_INIT requests that pass validation are answered as a failed link set-up (`ok = 0`):
    /// the harness has no sockets.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<u8>, Error> {
        self.conn.handle_input(Bytes::copy_from_slice(bytes));
        let mut out = Vec::new();
        loop {
            match self.conn.poll(Place::Blocking)? {
                Action::Transmit => {
                    while let Some(chunk) = self.conn.poll_transmit() {
                        out.extend_from_slice(&chunk);
                    }
                }
                Action::Comm(CommWork::Init(request)) => {
                    self.conn.comm_init_done(request.device, false)?
                }
                Action::Comm(CommWork::Free { .. }) | Action::Offload => {}
                Action::Upgrade(_) => self.conn.answer_hello([0; 24])?,
                // No second server: the peer cannot be reached.
                Action::Comm(CommWork::RemoteCopy(_)) => self
                    .conn
                    .remote_copy_done(proto_core::wire::RemoteCopyStatus::PeerUnreachable)?,
                Action::Comm(CommWork::Allreduce { .. }) | Action::SendInPlace => {
                    return Err(Error::InvalidState("the harness has no sockets"));
                }
                Action::Receive(_) => return Ok(out),
            }
        }
    }

    /// The client closed its side.
    pub fn eof(&mut self) -> Result<(), Error> {
        self.conn.handle_eof()
    }
}

/// Decodes one request frame the way a server does: through a fresh [`ServerSession`] (after a
/// HELLO, unless the frame is one), reassembling streamed writes. `Ok(None)`: the session waits
/// for more bytes.
pub fn server_decode(dialect: Dialect, frame: &[u8]) -> Result<Option<Request>, Error> {
    let mut session = ServerSession::new(ServerSessionConfig::new(dialect));
    if frame.first() != Some(&Command::Hello.id()) {
        let hello = Request::Hello {
            caps: [0; CONN_CAPS_SIZE],
        }
        .to_frame(dialect)?;
        session.handle_input(hello);
        match session.poll_event()? {
            Some(ServerEvent::Request(Request::Hello { .. })) => {}
            other => return Err(Error::Backend(format!("HELLO not accepted: {other:?}"))),
        }
        session.send_response(&Response::Hello {
            version: dialect.version(),
            flags: 0,
            caps: [0; CONN_CAPS_SIZE],
        })?;
    }
    // Our extension's ids (0xF1-0xF3) are accepted once EXTENSIONS granted them.
    if frame
        .first()
        .and_then(|&id| Command::extension(id))
        .is_some_and(|c| c != Command::Extensions)
    {
        let wanted = proto_core::wire::EXTENSION_REMOTE_COPY;
        session.handle_input(Request::Extensions { wanted }.to_frame(dialect)?);
        match session.poll_event()? {
            Some(ServerEvent::Request(Request::Extensions { .. })) => {}
            other => {
                return Err(Error::Backend(format!(
                    "EXTENSIONS not accepted: {other:?}"
                )))
            }
        }
        session.send_response(&Response::Extensions(wanted))?;
    }
    session.handle_input(Bytes::copy_from_slice(frame));
    let mut write: Option<(TensorWrite, Vec<u8>)> = None;
    while let Some(event) = session.poll_event()? {
        match event {
            ServerEvent::Request(request) => return Ok(Some(request)),
            ServerEvent::TensorWriteBegin { write: header, .. } => {
                write = Some((header, Vec::new()))
            }
            ServerEvent::TensorData(chunk) => {
                let (_, data) = write.as_mut().ok_or(Error::InvalidState("data first"))?;
                data.extend_from_slice(&chunk);
            }
            ServerEvent::TensorWriteEnd => {
                let (header, data) = write.take().ok_or(Error::InvalidState("end first"))?;
                let data = Bytes::from(data);
                return Ok(Some(match header {
                    TensorWrite::Set(header) => Request::SetTensor { header, data },
                    TensorWrite::Set2d(header) => Request::SetTensor2d { header, data },
                }));
            }
        }
    }
    Ok(None)
}

/// What a client made of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// The response (HELLO included).
    Response(Response),
    /// The client still waits for more bytes.
    Incomplete,
}

/// Feeds `bytes` to a fresh [`ClientSession`] of `version` that has sent `request` (after a
/// completed handshake, unless `request` is HELLO) and returns what it received.
pub fn client_receive(
    version: ProtocolVersion,
    request: &Request,
    bytes: &[u8],
) -> Result<Received, Error> {
    let caps = match request {
        Request::Hello { caps } => *caps,
        _ => [0; CONN_CAPS_SIZE],
    };
    let mut client = ClientSession::new(version, caps)?;
    while client.poll_transmit().is_some() {}
    if request.command() != Command::Hello {
        let hello = Response::Hello {
            version,
            flags: 0,
            caps: [0; CONN_CAPS_SIZE],
        };
        client.handle_input(hello.to_frame());
        match client.poll_event()? {
            Some(ClientEvent::Connected(_)) => {}
            other => return Err(Error::Backend(format!("handshake failed: {other:?}"))),
        }
        client.send(request)?;
    }
    client.handle_input(Bytes::copy_from_slice(bytes));
    let received = match client.poll_event()? {
        None => return Ok(Received::Incomplete),
        Some(ClientEvent::Connected(hello)) => Response::Hello {
            version: hello.version,
            flags: hello.flags,
            caps: hello.caps,
        },
        Some(ClientEvent::Response(response)) => response,
    };
    // Whatever follows the response is unsolicited.
    if let Some(event) = client.poll_event()? {
        return Err(Error::Backend(format!("second event {event:?}")));
    }
    Ok(Received::Response(received))
}

/// The payload length a client expects in answer to `request`, `None` if it has no response.
pub fn expected_response_len(request: &Request) -> Option<u64> {
    let command = request.command();
    match request {
        Request::GetTensor { size, .. } => Some(*size),
        Request::GetTensor2d(header) => header.data_len(command).ok(),
        _ if command.has_response() => command.fixed_response_size(),
        _ => None,
    }
}
