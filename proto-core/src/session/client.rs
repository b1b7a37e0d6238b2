//! The client side of one connection: requests in, bytes out; bytes in, matched responses out.

use std::collections::{HashMap, HashSet, VecDeque};

use bytes::{Bytes, BytesMut};

use super::input_queue::InputQueue;
use crate::error::{Error, Result};
use crate::ggml::{GgmlTable, Op};
use crate::wire::{
    Command, ConnCaps, Dialect, ProtocolVersion, Request, Response, HELLO_FLAG_TENSOR_CACHE,
    RESPONSE_HEADER_SIZE,
};

/// What the server announced in its HELLO response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerHello {
    /// The server's version.
    pub version: ProtocolVersion,
    /// Byte 3 of the response (flags in the newest upstream, 0 before).
    pub flags: u8,
    /// The server's transport caps.
    pub caps: ConnCaps,
}

impl ServerHello {
    /// Whether the server serves SET_TENSOR_HASH from a local cache (flag bit 0).
    pub fn has_tensor_cache(&self) -> bool {
        self.flags & HELLO_FLAG_TENSOR_CACHE != 0
    }
}

/// What the client session hands to its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    /// The HELLO handshake succeeded.
    Connected(ServerHello),
    /// The response to the oldest outstanding request.
    Response(Response),
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    command: Command,
    len: u64,
}

/// The client session state machine (sans-IO). HELLO is queued on creation; requests may be
/// pipelined behind it. Responses come back strictly in request order.
#[derive(Debug)]
pub struct ClientSession {
    version: ProtocolVersion,
    dialect: Dialect,
    input: InputQueue,
    transmit: VecDeque<Bytes>,
    pending: VecDeque<Pending>,
    server: Option<ServerHello>,
    failed: Option<Error>,
    graphs: GraphCacheMirror,
}

impl ClientSession {
    /// A session speaking `version` (its major decides the dialect), HELLO already queued.
    pub fn new(version: ProtocolVersion, caps: ConnCaps) -> Result<ClientSession> {
        let dialect = version.dialect().ok_or(Error::VersionMismatch {
            major: version.major,
            minor: version.minor,
            patch: version.patch,
        })?;
        let mut session = ClientSession {
            version,
            dialect,
            input: InputQueue::default(),
            transmit: VecDeque::new(),
            pending: VecDeque::new(),
            server: None,
            failed: None,
            graphs: GraphCacheMirror::new(dialect),
        };
        session.queue(&Request::Hello { caps })?;
        Ok(session)
    }

    /// The dialect spoken.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The server's HELLO, once received.
    pub fn server(&self) -> Option<&ServerHello> {
        self.server.as_ref()
    }

    /// Number of requests whose responses have not arrived yet.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// The numbering of ggml's ops and types the server uses: that of the version it announced
    /// (ours until its HELLO response arrives).
    pub fn server_table(&self) -> GgmlTable {
        self.server
            .map_or(self.version, |hello| hello.version)
            .ggml_table()
    }

    /// Queues a request. Bulk data (SET_TENSOR) is queued as its own transmit, not copied.
    /// GRAPH_COMPUTE tensors hold ops in the newest numbering ([`Op`]); they are sent in the
    /// server's ([`ClientSession::server_table`]), and an op the server's table lacks fails
    /// with [`Error::OpNotInServerTable`] before anything is queued.
    pub fn send(&mut self, request: &Request) -> Result<()> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        if request.command() == Command::Hello {
            return Err(Error::InvalidState(
                "HELLO is sent once, by the session itself",
            ));
        }
        if let Request::GraphCompute(graph) = request {
            let table = self.server_table();
            let wire_ops = graph
                .tensors
                .iter()
                .map(|tensor| {
                    table
                        .op_to_wire(Op(tensor.op))
                        .ok_or(Error::OpNotInServerTable {
                            op: tensor.op,
                            table,
                        })
                })
                .collect::<Result<Vec<u32>>>()?;
            // Only a server of an older numbering needs a renumbered copy of the records.
            if wire_ops
                .iter()
                .zip(&graph.tensors)
                .any(|(&op, t)| op != t.op)
            {
                let mut wire = graph.clone();
                for (tensor, op) in wire.tensors.iter_mut().zip(wire_ops) {
                    tensor.op = op;
                }
                return self.queue(&Request::GraphCompute(wire));
            }
        }
        self.queue(request)
    }

    fn queue(&mut self, request: &Request) -> Result<()> {
        let command = request.command();
        let response_len = match request {
            Request::GetTensor { size, .. } => Some(*size),
            Request::GetTensor2d(header) => Some(header.data_len(command)?),
            _ => command
                .fixed_response_size()
                .filter(|_| command.has_response()),
        };
        let mut head = BytesMut::new();
        request.encode_head(self.dialect, &mut head)?;
        self.transmit.push_back(head.freeze());
        if let Some(data) = request.bulk_data().filter(|d| !d.is_empty()) {
            self.transmit.push_back(data.clone());
        }
        if let Some(len) = response_len {
            self.pending.push_back(Pending { command, len });
        }
        Ok(())
    }

    /// Decides between GRAPH_COMPUTE and GRAPH_RECOMPUTE for a graph as the reference client
    /// does, mirroring the server's graph cache. Call once per graph submission.
    pub fn graph_submission(&mut self, device: u32, uid: u64) -> GraphSubmission {
        self.graphs.submit(device, uid)
    }

    /// Appends received bytes.
    pub fn handle_input(&mut self, data: Bytes) {
        self.input.push(data);
    }

    /// The next event, `Ok(None)` if more input is needed. Errors are final.
    pub fn poll_event(&mut self) -> Result<Option<ClientEvent>> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        match self.next_event() {
            Ok(event) => Ok(event),
            Err(error) => {
                self.failed = Some(error.clone());
                Err(error)
            }
        }
    }

    fn next_event(&mut self) -> Result<Option<ClientEvent>> {
        let Some(pending) = self.pending.front().copied() else {
            if !self.input.is_empty() {
                return Err(Error::UnexpectedResponse);
            }
            return Ok(None);
        };
        let Some(size) = self.input.peek_array::<RESPONSE_HEADER_SIZE>() else {
            return Ok(None);
        };
        let size = u64::from_le_bytes(size);
        if size != pending.len {
            return Err(Error::ResponseSizeMismatch {
                command: pending.command,
                expected: pending.len,
                got: size,
            });
        }
        let total = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_add(RESPONSE_HEADER_SIZE))
            .ok_or(Error::SizeOverflow("response size"))?;
        if self.input.len() < total {
            return Ok(None);
        }
        self.input.skip(RESPONSE_HEADER_SIZE);
        let payload = self.input.take(total - RESPONSE_HEADER_SIZE);
        self.pending.pop_front();
        let response = Response::decode(pending.command, pending.len, payload)?;
        if let Response::Hello {
            version,
            flags,
            caps,
        } = response
        {
            if !self.version.client_accepts(version) {
                return Err(Error::VersionMismatch {
                    major: version.major,
                    minor: version.minor,
                    patch: version.patch,
                });
            }
            let hello = ServerHello {
                version,
                flags,
                caps,
            };
            self.server = Some(hello);
            return Ok(Some(ClientEvent::Connected(hello)));
        }
        Ok(Some(ClientEvent::Response(response)))
    }

    /// The next bytes to write to the server, in order.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.transmit.pop_front()
    }
}

/// Which graph command to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphSubmission {
    /// Send GRAPH_COMPUTE with the whole graph.
    Compute,
    /// Send GRAPH_RECOMPUTE: the server still holds this graph.
    Recompute,
}

/// Maximum graphs per device in the protocol-8 cache ("client and server must use the same
/// value").
pub const GRAPH_CACHE_MAX: usize = 1024;

/// The client's mirror of the server's graph cache.
#[derive(Debug)]
struct GraphCacheMirror {
    dialect: Dialect,
    last_uid: HashMap<u32, u64>,
    sent: HashMap<u32, HashSet<u64>>,
}

impl GraphCacheMirror {
    fn new(dialect: Dialect) -> GraphCacheMirror {
        GraphCacheMirror {
            dialect,
            last_uid: HashMap::new(),
            sent: HashMap::new(),
        }
    }

    fn submit(&mut self, device: u32, uid: u64) -> GraphSubmission {
        match self.dialect {
            // 7.x: one graph per device; recompute iff the uid repeats the last one sent.
            Dialect::V7 => {
                let last = self.last_uid.insert(device, uid);
                if uid != 0 && last == Some(uid) {
                    GraphSubmission::Recompute
                } else {
                    GraphSubmission::Compute
                }
            }
            // 8.x: a set of uids per device, cleared entirely when it reaches the limit.
            Dialect::V8 => {
                if uid == 0 {
                    return GraphSubmission::Compute;
                }
                let sent = self.sent.entry(device).or_default();
                if sent.contains(&uid) {
                    return GraphSubmission::Recompute;
                }
                if sent.len() >= GRAPH_CACHE_MAX {
                    sent.clear();
                }
                sent.insert(uid);
                GraphSubmission::Compute
            }
        }
    }
}
