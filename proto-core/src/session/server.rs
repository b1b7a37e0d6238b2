//! The server side of one connection: bytes in, typed requests out; responses in, bytes out.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::input_queue::InputQueue;
use crate::error::{Error, Result};
use crate::wire::{
    check_request_size, Command, Dialect, Request, Response, SetTensorHeader, Tensor2dHeader,
    REQUEST_HEADER_SIZE,
};

/// Largest chunk of SET_TENSOR data handed out at once (16 MiB, as the reference receives).
pub const MAX_DATA_CHUNK: usize = 16 * 1024 * 1024;

/// Limits of a server session.
#[derive(Debug, Clone)]
pub struct ServerSessionConfig {
    /// The command table and layouts to speak.
    pub dialect: Dialect,
    /// Largest buffered request (GRAPH_COMPUTE); checked before anything is allocated.
    pub max_message_size: u64,
    /// Largest data chunk delivered at once (at most [`MAX_DATA_CHUNK`]).
    pub max_chunk: usize,
}

impl ServerSessionConfig {
    /// Defaults for a dialect: 256 MiB messages, 16 MiB chunks.
    pub fn new(dialect: Dialect) -> ServerSessionConfig {
        ServerSessionConfig {
            dialect,
            max_message_size: 256 << 20,
            max_chunk: MAX_DATA_CHUNK,
        }
    }
}

/// The fixed part of a streamed write (SET_TENSOR or SET_TENSOR_2D).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorWrite {
    /// SET_TENSOR.
    Set(Box<SetTensorHeader>),
    /// SET_TENSOR_2D.
    Set2d(Box<Tensor2dHeader>),
}

/// What the server session hands to the dispatcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// A complete request (never SET_TENSOR / SET_TENSOR_2D: those stream).
    Request(Request),
    /// A streamed write begins; `data_len` bytes of [`ServerEvent::TensorData`] follow.
    TensorWriteBegin {
        /// The fixed part.
        write: TensorWrite,
        /// Bytes of data that follow.
        data_len: u64,
    },
    /// The next piece of the streamed data, in order, at most `max_chunk` bytes.
    TensorData(Bytes),
    /// All data of the streamed write was delivered.
    TensorWriteEnd,
}

#[derive(Debug)]
enum State {
    AwaitHello,
    Ready,
    Streaming { remaining: u64 },
    Failed(Error),
}

#[derive(Debug, Clone, Copy)]
struct PendingResponse {
    command: Command,
    expected_len: Option<u64>,
    /// Data bytes still owed by a streamed reply ([`ServerSession::begin_response_stream`]).
    streaming: Option<u64>,
}

/// The server session state machine (sans-IO).
///
/// Feed received bytes with [`handle_input`](Self::handle_input), take events with
/// [`poll_event`](Self::poll_event), answer requests that have a response with
/// [`send_response`](Self::send_response) and write out [`poll_transmit`](Self::poll_transmit).
/// Requests are processed strictly in order: while a response is owed, no further event is
/// produced. Any error is final: the connection must be closed.
#[derive(Debug)]
pub struct ServerSession {
    config: ServerSessionConfig,
    state: State,
    input: InputQueue,
    transmit: VecDeque<Bytes>,
    pending: Option<PendingResponse>,
    /// Extension bits granted by EXTENSIONS on this connection (0: none; the commands of an
    /// ungranted extension close the connection).
    extensions: u64,
}

impl ServerSession {
    /// A new session awaiting HELLO.
    pub fn new(mut config: ServerSessionConfig) -> ServerSession {
        config.max_chunk = config.max_chunk.clamp(1, MAX_DATA_CHUNK);
        ServerSession {
            config,
            state: State::AwaitHello,
            input: InputQueue::default(),
            transmit: VecDeque::new(),
            pending: None,
            extensions: 0,
        }
    }

    /// Extension bits granted on this connection so far (see [`crate::wire::extension`]).
    pub fn extensions(&self) -> u64 {
        self.extensions
    }

    /// The dialect spoken.
    pub fn dialect(&self) -> Dialect {
        self.config.dialect
    }

    /// Whether HELLO has not arrived yet.
    pub fn awaiting_hello(&self) -> bool {
        matches!(self.state, State::AwaitHello)
    }

    /// Received bytes not yet taken by an event (part of a message that has begun).
    pub fn buffered(&self) -> usize {
        self.input.len()
    }

    /// Appends received bytes. Parsing happens in [`poll_event`](Self::poll_event), so a shell
    /// should poll after every read and read again only when it returns `None`.
    pub fn handle_input(&mut self, data: Bytes) {
        self.input.push(data);
    }

    /// Bytes still expected for the streamed write in progress and not yet received: a shell
    /// may size its next read with this (at most one chunk) so data is never copied twice.
    pub fn stream_remaining(&self) -> u64 {
        match self.state {
            State::Streaming { remaining } => remaining.saturating_sub(self.input.len() as u64),
            _ => 0,
        }
    }

    /// How many bytes of the streamed write in progress a shell may place straight into their
    /// destination now, bypassing [`handle_input`](Self::handle_input) (see
    /// `driver::Connection::receive_in_place`): up to one chunk while nothing of the write is buffered
    /// here, else 0. The shell must have handed every event polled so far to the dispatcher.
    pub fn in_place_capacity(&self) -> u64 {
        match self.state {
            State::Streaming { remaining } if self.input.is_empty() && self.pending.is_none() => {
                remaining.min(self.config.max_chunk as u64)
            }
            _ => 0,
        }
    }

    /// Records that `n` bytes of the streamed write were placed in their destination directly
    /// (at most [`in_place_capacity`](Self::in_place_capacity)); once none remain,
    /// [`poll_event`](Self::poll_event) ends the write with [`ServerEvent::TensorWriteEnd`].
    pub fn data_received_in_place(&mut self, n: u64) -> Result<()> {
        if n > self.in_place_capacity() {
            return Err(Error::InvalidState(
                "in-place data beyond the streamed write's capacity",
            ));
        }
        if let State::Streaming { remaining } = &mut self.state {
            *remaining -= n;
        }
        Ok(())
    }

    /// Whether a response is owed before more events are produced.
    pub fn awaiting_response(&self) -> Option<Command> {
        self.pending.map(|p| p.command)
    }

    /// The next event, `Ok(None)` if more input (or a response) is needed first.
    pub fn poll_event(&mut self) -> Result<Option<ServerEvent>> {
        if let State::Failed(error) = &self.state {
            return Err(error.clone());
        }
        if self.pending.is_some() {
            return Ok(None);
        }
        match self.next_event() {
            Ok(event) => Ok(event),
            Err(error) => {
                self.state = State::Failed(error.clone());
                Err(error)
            }
        }
    }

    fn next_event(&mut self) -> Result<Option<ServerEvent>> {
        if let State::Streaming { remaining } = self.state {
            if remaining == 0 {
                self.state = State::Ready;
                return Ok(Some(ServerEvent::TensorWriteEnd));
            }
            let want = remaining.min(self.config.max_chunk as u64) as usize;
            let chunk = self.input.take_front(want);
            if chunk.is_empty() {
                return Ok(None);
            }
            self.state = State::Streaming {
                remaining: remaining - chunk.len() as u64,
            };
            return Ok(Some(ServerEvent::TensorData(chunk)));
        }
        let Some(header) = self.input.peek_array::<REQUEST_HEADER_SIZE>() else {
            return Ok(None);
        };
        let id = header[0];
        let size = u64::from_le_bytes([
            header[1], header[2], header[3], header[4], header[5], header[6], header[7], header[8],
        ]);
        let dialect = self.config.dialect;
        let awaiting_hello = matches!(self.state, State::AwaitHello);
        if awaiting_hello && id != Command::Hello.id() {
            return Err(Error::HelloExpected { got: id });
        }
        if !awaiting_hello && id == Command::Hello.id() {
            return Err(Error::DuplicateHello);
        }
        let command = match Command::from_id(id, dialect) {
            Some(command) => command,
            None => self.extension_command(id)?,
        };
        check_request_size(command, dialect, size)?;
        if command.streams_payload() {
            return self.begin_stream(command, size);
        }
        if size > self.config.max_message_size {
            return Err(Error::MessageTooLarge {
                command,
                limit: self.config.max_message_size,
                got: size,
            });
        }
        // size <= max_message_size, so it fits in usize on any supported target
        let size = size as usize;
        if self.input.len() < REQUEST_HEADER_SIZE + size {
            return Ok(None);
        }
        self.input.skip(REQUEST_HEADER_SIZE);
        let payload = self.input.take(size);
        let request = Request::decode(command, dialect, payload)?;
        self.pending = match &request {
            Request::GetTensor { size, .. } => Some(PendingResponse {
                command,
                expected_len: Some(*size),
                streaming: None,
            }),
            Request::GetTensor2d(header) => Some(PendingResponse {
                command,
                expected_len: Some(header.data_len(command)?),
                streaming: None,
            }),
            _ if command.has_response() => Some(PendingResponse {
                command,
                expected_len: command.fixed_response_size(),
                streaming: None,
            }),
            _ => None,
        };
        if command == Command::Hello {
            self.state = State::Ready;
        }
        Ok(Some(ServerEvent::Request(request)))
    }

    /// Our private ids: EXTENSIONS always (a server that does not offer extensions grants
    /// none), the others only once EXTENSIONS granted theirs.
    fn extension_command(&self, id: u8) -> Result<Command> {
        let command = Command::extension(id).ok_or(Error::UnknownCommand { id })?;
        let granted = match command {
            Command::Extensions => true,
            _ => self.extensions & crate::wire::EXTENSION_REMOTE_COPY != 0,
        };
        if !granted {
            return Err(Error::ExtensionNotNegotiated { id });
        }
        Ok(command)
    }

    fn begin_stream(&mut self, command: Command, size: u64) -> Result<Option<ServerEvent>> {
        let fixed = match command {
            Command::SetTensor => SetTensorHeader::SIZE,
            _ => Tensor2dHeader::SIZE,
        };
        if self.input.len() < REQUEST_HEADER_SIZE + fixed {
            return Ok(None);
        }
        self.input.skip(REQUEST_HEADER_SIZE);
        let head = self.input.take(fixed);
        let data_len = size - fixed as u64;
        let truncated = |_| Error::MalformedPayload {
            command,
            reason: "truncated header",
        };
        let write = if command == Command::SetTensor {
            let (_, header) = SetTensorHeader::parse(&head).map_err(truncated)?;
            TensorWrite::Set(Box::new(header))
        } else {
            let (_, header) = Tensor2dHeader::parse(&head).map_err(truncated)?;
            if header.data_len(command)? != data_len {
                return Err(Error::MalformedPayload {
                    command,
                    reason: "size * n_copies differs from the data length",
                });
            }
            TensorWrite::Set2d(Box::new(header))
        };
        self.state = State::Streaming {
            remaining: data_len,
        };
        Ok(Some(ServerEvent::TensorWriteBegin { write, data_len }))
    }

    /// Starts a reply whose `len` data bytes follow in pieces through
    /// [`send_response_data`](Self::send_response_data), so a large GET_TENSOR never needs the
    /// whole tensor in memory. Only for GET_TENSOR and GET_TENSOR_2D.
    pub fn begin_response_stream(&mut self, command: Command, len: u64) -> Result<()> {
        let pending = self
            .pending
            .as_mut()
            .ok_or(Error::InvalidState("no response is owed"))?;
        if pending.command != command
            || pending.streaming.is_some()
            || !matches!(command, Command::GetTensor | Command::GetTensor2d)
        {
            return Err(Error::InvalidState(
                "stream does not answer the pending request",
            ));
        }
        if pending.expected_len != Some(len) {
            return Err(Error::InvalidState(
                "response length differs from the request",
            ));
        }
        pending.streaming = Some(len);
        self.transmit
            .push_back(Bytes::copy_from_slice(&len.to_le_bytes()));
        if len == 0 {
            self.pending = None;
        }
        Ok(())
    }

    /// Queues the next piece of a streamed reply; the reply is complete when all its bytes
    /// were queued.
    pub fn send_response_data(&mut self, data: Bytes) -> Result<()> {
        let pending = self
            .pending
            .as_mut()
            .ok_or(Error::InvalidState("no response is owed"))?;
        let remaining = pending
            .streaming
            .ok_or(Error::InvalidState("no streamed reply"))?;
        let len = data.len() as u64;
        if len > remaining {
            return Err(Error::InvalidState("streamed reply longer than announced"));
        }
        pending.streaming = Some(remaining - len);
        if !data.is_empty() {
            self.transmit.push_back(data);
        }
        if remaining == len {
            self.pending = None;
        }
        Ok(())
    }

    /// Records that `n` bytes of the streamed reply in progress were written to the peer
    /// directly from their source (`driver::Connection::send_in_place`) instead of through
    /// [`send_response_data`](Self::send_response_data). Only while nothing is queued for
    /// transmission: the reply's head and earlier pieces must be on the wire first.
    pub fn response_data_sent_in_place(&mut self, n: u64) -> Result<()> {
        if !self.transmit.is_empty() {
            return Err(Error::InvalidState(
                "in-place reply data while transmits are queued",
            ));
        }
        let pending = self
            .pending
            .as_mut()
            .ok_or(Error::InvalidState("no response is owed"))?;
        let remaining = pending
            .streaming
            .ok_or(Error::InvalidState("no streamed reply"))?;
        if n > remaining {
            return Err(Error::InvalidState("streamed reply longer than announced"));
        }
        pending.streaming = Some(remaining - n);
        if remaining == n {
            self.pending = None;
        }
        Ok(())
    }

    /// Queues the response to the request that owes one.
    pub fn send_response(&mut self, response: &Response) -> Result<()> {
        let pending = self
            .pending
            .ok_or(Error::InvalidState("no response is owed"))?;
        if pending.streaming.is_some() {
            return Err(Error::InvalidState("a streamed reply is in progress"));
        }
        if response.command() != pending.command {
            return Err(Error::InvalidState(
                "response does not answer the pending request",
            ));
        }
        if pending
            .expected_len
            .is_some_and(|len| len != response.payload_len())
        {
            return Err(Error::InvalidState(
                "response length differs from the request",
            ));
        }
        if let Response::Extensions(granted) = response {
            self.extensions |= granted & crate::wire::KNOWN_EXTENSIONS;
        }
        let mut head = BytesMut::new();
        let data = response.encode_head(&mut head);
        self.transmit.push_back(head.freeze());
        if let Some(data) = data.filter(|d| !d.is_empty()) {
            self.transmit.push_back(data);
        }
        self.pending = None;
        Ok(())
    }

    /// Whether bytes wait in [`poll_transmit`](Self::poll_transmit).
    pub fn has_transmit(&self) -> bool {
        !self.transmit.is_empty()
    }

    /// The next bytes to write to the peer, in order.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.transmit.pop_front()
    }

    /// The peer closed its side. An error if it stopped in the middle of a frame.
    pub fn handle_eof(&mut self) -> Result<()> {
        let buffered = self.input.len() as u64;
        let missing = match self.state {
            State::Streaming { remaining } => remaining.saturating_sub(buffered),
            _ if buffered == 0 => 0,
            _ => match self.input.peek_array::<REQUEST_HEADER_SIZE>() {
                Some(header) => {
                    let mut size = [0u8; 8];
                    size.copy_from_slice(&header[1..]);
                    (REQUEST_HEADER_SIZE as u64)
                        .saturating_add(u64::from_le_bytes(size))
                        .saturating_sub(buffered)
                        .max(1)
                }
                None => REQUEST_HEADER_SIZE as u64 - buffered,
            },
        };
        if missing > 0 {
            let error = Error::UnexpectedEof(missing);
            self.state = State::Failed(error.clone());
            return Err(error);
        }
        Ok(())
    }
}
