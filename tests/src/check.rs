//! Checks one vector against proto-core (the semantics are described in `vectors/README.md`).

use bytes::Bytes;
use proto_core::wire::{Command, Dialect, Request, Response, RESPONSE_HEADER_SIZE};
use proto_core::{Error, ErrorKind};
use serde_json::Value;

use crate::fields::{self, command_by_name, command_name};
use crate::harness::{self, Received, ServerConfig, ServerHarness};
use crate::template::{self, Bindings};
use crate::vector::{Direction, Level, ServerParams, Step, Vector};
use crate::{hex, rules};

/// Checks a vector; the error says what differs.
pub fn check(vector: &Vector) -> Result<(), String> {
    check_shape(vector)?;
    match (vector.level, vector.direction) {
        (Level::Frame, Direction::ClientToServer) => check_request_frame(vector),
        (Level::Frame, Direction::ServerToClient) => check_response_frame(vector),
        (Level::Session, Direction::ClientToServer) => check_session(vector),
        (Level::Session, Direction::ServerToClient) => Err("sessions are client_to_server".into()),
    }
}

fn require<'a, T>(value: &'a Option<T>, what: &str) -> Result<&'a T, String> {
    value.as_ref().ok_or_else(|| format!("missing `{what}`"))
}

/// The fields present must be those of the vector's kind, the rule must agree with the error.
fn check_shape(v: &Vector) -> Result<(), String> {
    v.version()?;
    let frame = v.level == Level::Frame;
    let response = v.direction == Direction::ServerToClient;
    let expect = |present: bool, wanted: bool, what: &str| {
        if present == wanted {
            Ok(())
        } else if wanted {
            Err(format!("missing `{what}`"))
        } else {
            Err(format!("unexpected `{what}`"))
        }
    };
    expect(v.hex.is_some(), frame, "hex")?;
    expect(v.fields.is_some(), frame && v.valid, "fields")?;
    expect(v.request.is_some(), response, "request")?;
    expect(v.server.is_some(), !frame, "server")?;
    expect(v.steps.is_some(), !frame, "steps")?;
    expect(v.final_step.is_some(), !frame && !v.valid, "final")?;
    expect(v.rule.is_some(), !v.valid, "rule")?;
    expect(v.error.is_some(), !v.valid, "error")?;
    if v.canonical_hex.is_some() && !(frame && v.valid) {
        return Err("`canonical_hex` only belongs to valid frame vectors".into());
    }
    if let Some(command) = &v.command {
        command_by_name(command).ok_or_else(|| format!("unknown command name {command:?}"))?;
    }
    if let (Some(slug), Some(error)) = (&v.rule, &v.error) {
        let rule = rules::rule_by_slug(slug).ok_or_else(|| format!("unknown rule {slug:?}"))?;
        ErrorKind::from_name(error).ok_or_else(|| format!("unknown error kind {error:?}"))?;
        if rule.kind.as_str() != error {
            return Err(format!("rule {slug} produces {}, not {error}", rule.kind));
        }
        if rule.level != v.level {
            return Err(format!("rule {slug} is a {:?} rule", rule.level));
        }
    }
    Ok(())
}

fn expect_kind(
    result: Result<impl std::fmt::Debug, Error>,
    want: &str,
    path: &str,
) -> Result<(), String> {
    match result {
        Err(error) if error.kind().as_str() == want => Ok(()),
        Err(error) => Err(format!(
            "{path}: expected {want}, got {} ({error})",
            error.kind()
        )),
        Ok(value) => Err(format!("{path}: expected {want}, got success: {value:?}")),
    }
}

fn compare_fields(want: &Value, got: &Value) -> Result<(), String> {
    if want == got {
        return Ok(());
    }
    Err(format!(
        "decoded fields differ: {}",
        describe_difference(want, got, "fields")
    ))
}

/// The first place where two JSON values differ.
fn describe_difference(want: &Value, got: &Value, path: &str) -> String {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys()) {
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) if x == y => {}
                    (Some(x), Some(y)) => {
                        return describe_difference(x, y, &format!("{path}.{key}"))
                    }
                    (x, y) => return format!("{path}.{key}: vector has {x:?}, decoded {y:?}"),
                }
            }
            format!("{path}: objects differ")
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find(|(_, (x, y))| x != y)
            .map(|(i, (x, y))| describe_difference(x, y, &format!("{path}[{i}]")))
            .unwrap_or_else(|| format!("{path}: arrays differ")),
        _ => format!("{path}: vector has {want}, decoded {got}"),
    }
}

fn check_command(v: &Vector, frame_command: Option<Command>) -> Result<(), String> {
    let named = frame_command.map(command_name);
    if v.command.as_deref() != named {
        return Err(format!(
            "`command` is {:?}, the frame carries {named:?}",
            v.command
        ));
    }
    Ok(())
}

fn check_request_frame(v: &Vector) -> Result<(), String> {
    let dialect = v.dialect()?;
    let bytes = hex::decode(require(&v.hex, "hex")?)?;
    check_command(
        v,
        bytes
            .first()
            .and_then(|&id| Command::from_id(id, dialect).or_else(|| Command::extension(id))),
    )?;
    let decoded = Request::from_frame(dialect, Bytes::from(bytes.clone()));
    let via_session = harness::server_decode(dialect, &bytes);
    if !v.valid {
        let want = require(&v.error, "error")?;
        expect_kind(decoded, want, "Request::from_frame")?;
        return expect_kind(via_session, want, "ServerSession");
    }
    let request = decoded.map_err(|e| format!("Request::from_frame failed: {e}"))?;
    compare_fields(
        require(&v.fields, "fields")?,
        &fields::request(&request, dialect),
    )?;
    let encoded = request
        .to_frame(dialect)
        .map_err(|e| format!("encoding failed: {e}"))?;
    let canonical = match &v.canonical_hex {
        Some(text) => hex::decode(text)?,
        None => bytes.clone(),
    };
    if encoded[..] != canonical[..] {
        return Err(format!("re-encoding differs: {}", hex::encode(&encoded)));
    }
    match via_session {
        Ok(Some(same)) if same == request => Ok(()),
        other => Err(format!(
            "ServerSession disagrees with Request::from_frame: {other:?}"
        )),
    }
}

fn check_response_frame(v: &Vector) -> Result<(), String> {
    let version = v.version()?;
    let dialect = v.dialect()?;
    let context = require(&v.request, "request")?;
    let request = Request::from_frame(dialect, Bytes::from(hex::decode(&context.hex)?))
        .map_err(|e| format!("request context does not decode: {e}"))?;
    if command_name(request.command()) != context.command {
        return Err(format!(
            "request.command {:?} differs from its hex",
            context.command
        ));
    }
    let expected_len = harness::expected_response_len(&request);
    if context.expected_len != expected_len.map(|n| n.to_string()) {
        return Err(format!(
            "request.expected_len {:?}, the request implies {expected_len:?}",
            context.expected_len
        ));
    }
    check_command(v, Some(request.command()))?;
    let bytes = hex::decode(require(&v.hex, "hex")?)?;
    let received = harness::client_receive(version, &request, &bytes);
    if !v.valid {
        return expect_kind(received, require(&v.error, "error")?, "ClientSession");
    }
    let received = match received {
        Ok(Received::Response(response)) => response,
        other => {
            return Err(format!(
                "ClientSession did not accept the response: {other:?}"
            ))
        }
    };
    let expected_len = expected_len.ok_or("the request has no response")?;
    let header = bytes
        .get(..RESPONSE_HEADER_SIZE)
        .ok_or("shorter than a response header")?;
    let size = u64::from_le_bytes(header.try_into().map_err(|_| "header")?);
    if size != bytes.len() as u64 - RESPONSE_HEADER_SIZE as u64 {
        return Err(format!("size field {size} does not match the payload"));
    }
    let payload = Bytes::from(bytes[RESPONSE_HEADER_SIZE..].to_vec());
    let response = Response::decode(request.command(), expected_len, payload)
        .map_err(|e| format!("Response::decode failed: {e}"))?;
    if response != received {
        return Err(format!(
            "ClientSession got {received:?}, Response::decode {response:?}"
        ));
    }
    compare_fields(require(&v.fields, "fields")?, &fields::response(&response))?;
    let encoded = response.to_frame();
    if encoded[..] != bytes[..] {
        return Err(format!("re-encoding differs: {}", hex::encode(&encoded)));
    }
    Ok(())
}

fn parse_u64(text: &str, what: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("{what}: {text:?} is not a decimal u64"))
}

/// The harness configuration a vector's `server` describes.
pub fn server_config(params: &ServerParams, dialect: Dialect) -> Result<ServerConfig, String> {
    let mut config = ServerConfig::new(dialect);
    config.devices = params.devices;
    config.device_memory = parse_u64(&params.device_memory, "device_memory")?;
    if parse_u64(&params.alignment, "alignment")? != harness::MEMORY_BACKEND_ALIGNMENT {
        return Err("the memory backend's alignment is 32".into());
    }
    config.memory_quota = params
        .memory_quota
        .as_deref()
        .map(|q| parse_u64(q, "memory_quota"))
        .transpose()?;
    config.max_message_size = parse_u64(&params.max_message_size, "max_message_size")?;
    config.tensor_cache = params.tensor_cache;
    config.caps = hex::decode(&params.conn_caps)?
        .try_into()
        .map_err(|_| "conn_caps must be 24 bytes")?;
    Ok(config)
}

fn frame_command(dialect: Dialect, bytes: &[u8]) -> Option<&'static str> {
    bytes
        .first()
        .and_then(|&id| Command::from_id(id, dialect).or_else(|| Command::extension(id)))
        .map(command_name)
}

fn check_session(v: &Vector) -> Result<(), String> {
    let version = v.version()?;
    let config = server_config(require(&v.server, "server")?, v.dialect()?)?;
    for bytewise in [false, true] {
        let server = ServerHarness::new(version, &config).map_err(|e| e.to_string())?;
        let mut target = HarnessTarget { server, bytewise };
        replay_session(v, &mut target).map_err(|e| {
            let how = if bytewise {
                "byte by byte"
            } else {
                "a step at a time"
            };
            format!("{e} (fed {how})")
        })?;
    }
    Ok(())
}

/// How a server reacted to the final bytes of an invalid session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalReaction {
    /// It failed (closed the connection); with the error kind when the target can tell.
    Failed(Option<ErrorKind>),
    /// It answered these bytes and kept going.
    Answered(Vec<u8>),
    /// It kept waiting for more bytes.
    Waiting,
}

/// A server a session vector can be replayed against: our in-memory harness, or (in other
/// crates' tests) a real server behind a socket, whose only visible failure is a closed
/// connection.
pub trait SessionTarget {
    /// Writes `bytes` and returns what the server writes back; a vector expects exactly
    /// `reply_len` bytes (a socket target reads that many, then checks nothing more arrives). An
    /// error means the server failed.
    fn exchange(&mut self, bytes: &[u8], reply_len: usize) -> Result<Vec<u8>, String>;
    /// Writes the final bytes of an invalid session (then ends the stream if `eof`) and reports
    /// the reaction.
    fn finish(&mut self, bytes: &[u8], eof: bool) -> FinalReaction;
}

/// [`SessionTarget`] over our [`ServerHarness`], fed a step or a byte at a time.
pub struct HarnessTarget {
    /// The server.
    pub server: ServerHarness,
    /// Feed one byte at a time (processing after each).
    pub bytewise: bool,
}

impl HarnessTarget {
    fn feed(&mut self, bytes: &[u8]) -> Result<Vec<u8>, Error> {
        if !self.bytewise {
            return self.server.feed(bytes);
        }
        let mut out = Vec::new();
        for byte in bytes {
            out.extend(self.server.feed(std::slice::from_ref(byte))?);
        }
        Ok(out)
    }
}

impl SessionTarget for HarnessTarget {
    fn exchange(&mut self, bytes: &[u8], _reply_len: usize) -> Result<Vec<u8>, String> {
        self.feed(bytes)
            .map_err(|e| format!("server failed: {} ({e})", e.kind()))
    }

    fn finish(&mut self, bytes: &[u8], eof: bool) -> FinalReaction {
        let result = self.feed(bytes).and_then(|out| {
            if eof {
                self.server.eof()?;
            }
            Ok(out)
        });
        match result {
            Ok(out) if out.is_empty() => FinalReaction::Waiting,
            Ok(out) => FinalReaction::Answered(out),
            Err(error) => FinalReaction::Failed(Some(error.kind())),
        }
    }
}

/// Replays a session vector against `target`: every step must produce its expected bytes, and
/// the final bytes of an invalid session must make the server fail (with the vector's error
/// kind, when the target can tell).
pub fn replay_session(v: &Vector, target: &mut dyn SessionTarget) -> Result<(), String> {
    replay_session_with(v, target, &mut |step, out, bindings| {
        template::matches(&step.expect, out, bindings)
    })
}

/// Compares a step's answer with its `expect` (capturing placeholders into the bindings).
pub type CompareStep<'a> = dyn FnMut(&Step, &[u8], &mut Bindings) -> Result<(), String> + 'a;

/// [`replay_session`] with the comparison of each step's answer in the caller's hands (a
/// checker of other servers compares exactly what the protocol fixes where the vector's value
/// depends on the server, e.g. its free memory).
pub fn replay_session_with(
    v: &Vector,
    target: &mut dyn SessionTarget,
    compare: &mut CompareStep<'_>,
) -> Result<(), String> {
    let dialect = v.dialect()?;
    let mut bindings = Bindings::new();
    for (i, step) in require(&v.steps, "steps")?.iter().enumerate() {
        let bytes =
            template::render(&step.send, &bindings).map_err(|e| format!("step {i}: {e}"))?;
        if frame_command(dialect, &bytes) != Some(step.command.as_str()) {
            return Err(format!(
                "step {i}: `command` {:?} differs from the frame",
                step.command
            ));
        }
        let reply_len = template::byte_len(&step.expect).map_err(|e| format!("step {i}: {e}"))?;
        let out = target
            .exchange(&bytes, reply_len)
            .map_err(|e| format!("step {i} ({}): {e}", step.command))?;
        compare(step, &out, &mut bindings)
            .map_err(|e| format!("step {i} ({}): {e}", step.command))?;
    }
    let Some(last) = &v.final_step else {
        return Ok(());
    };
    let bytes = template::render(&last.send, &bindings).map_err(|e| format!("final: {e}"))?;
    if frame_command(dialect, &bytes) != last.command.as_deref() {
        return Err(format!(
            "final: `command` {:?} differs from the frame",
            last.command
        ));
    }
    if v.command != last.command {
        return Err("`command` must be the final step's command".into());
    }
    let want = require(&v.error, "error")?;
    match target.finish(&bytes, last.eof) {
        FinalReaction::Failed(None) => Ok(()),
        FinalReaction::Failed(Some(kind)) if kind.as_str() == want => Ok(()),
        FinalReaction::Failed(Some(kind)) => Err(format!(
            "final step: expected {want}, the server failed with {kind}"
        )),
        FinalReaction::Waiting => Err(format!(
            "final step: expected {want}, the server accepted the bytes and waits for more"
        )),
        FinalReaction::Answered(out) => Err(format!(
            "final step: expected {want}, the server accepted the frame and answered {}",
            hex::encode(&out)
        )),
    }
}
