//! `ggml-rpc conformance`: the test vectors and hostile cases against any server.
//!
//! Every case runs on a fresh connection with a timeout on every wait, followed by a liveness
//! check (a fresh connection completes HELLO and DEVICE_COUNT). A case ends as one of
//! [`Outcome`]; README.md, "Conformance kit", says what counts as passing.

mod compare;
pub mod plan;
pub mod report;
pub mod socket;
mod spawn;
#[cfg(test)]
mod tests;

use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::time::{Duration, Instant};

use ggml_rpc_tests::check::replay_session_with;
use proto_core::wire::{Dialect, ProtocolVersion, Request};

use plan::{Case, CaseKind};
use socket::{ServerFacts, SocketTarget, WaitError};
pub use spawn::Spawned;

/// How one case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every answer as the vector says; invalid bytes closed the connection; still serving.
    Passed,
    /// The server rejected a valid exchange, or answered what it should have refused.
    Refused,
    /// The server was gone after the case (no fresh connection completed HELLO).
    Died,
    /// No verdict within the timeout (waiting for bytes it should have refused, or no answer).
    Hung,
    /// Not run: the case needs a server configured otherwise (the detail says how).
    Skipped,
}

impl Outcome {
    /// The name in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Refused => "refused",
            Outcome::Died => "died",
            Outcome::Hung => "hung",
            Outcome::Skipped => "n/a",
        }
    }
}

/// The result of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
    /// A failure the case's rule documents as a gap of the reference (PROTOCOL.md §13):
    /// the gap names (`G4`), empty otherwise.
    pub known_gap: Vec<String>,
    /// What happened, in words (and what was not compared exactly).
    pub detail: String,
    /// How long the case took, liveness check included.
    pub time: Duration,
}

impl CaseResult {
    /// Whether this case lets the run pass: passed, not applicable, or (unless `strict`) a
    /// documented gap of the reference.
    pub fn acceptable(&self, strict: bool) -> bool {
        match self.outcome {
            Outcome::Passed | Outcome::Skipped => true,
            _ => !strict && !self.known_gap.is_empty(),
        }
    }
}

/// How to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server.
    pub addr: SocketAddr,
    /// The version to check, `None`: the server's (from its HELLO answer).
    pub version: Option<ProtocolVersion>,
    /// Bound of every wait.
    pub timeout: Duration,
    /// Only cases whose name contains this.
    pub only: Option<String>,
}

/// Why no case could run.
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    /// The server did not complete HELLO.
    #[error("the server at {addr} does not answer HELLO: {source}")]
    Probe {
        /// The server.
        addr: SocketAddr,
        /// What happened.
        source: WaitError,
    },
    /// The server's HELLO names a version the vectors do not cover.
    #[error("the server answers version {0}.{1}.{2}; the vectors cover 7.0.0, 8.0.0 and 8.0.1")]
    UnknownVersion(u8, u8, u8),
    /// HOST:PORT did not resolve.
    #[error("cannot resolve {0}")]
    Resolve(String),
}

/// `HOST:PORT` → an address.
pub fn resolve(endpoint: &str) -> Result<SocketAddr, ConformanceError> {
    endpoint
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| ConformanceError::Resolve(endpoint.to_owned()))
}

/// The version the vectors check for a server that answered `facts`.
pub fn served_version(facts: &ServerFacts) -> Result<ProtocolVersion, ConformanceError> {
    match facts.version {
        (7, 0, 0) => Ok(ProtocolVersion::V7_0_0),
        (8, 0, 0) => Ok(ProtocolVersion::V8_0_0),
        // The newest 8.0.x numbering the vectors know.
        (8, 0, _) => Ok(ProtocolVersion::V8_0_1),
        (major, minor, patch) => Err(ConformanceError::UnknownVersion(major, minor, patch)),
    }
}

/// A whole run: the version checked, the server's facts and every case's result (`on_start`
/// sees the first two once the server was probed, `on_case` each result as it ends, for
/// output as it happens). `spawned` restarts a server that died.
pub fn run(
    options: &Options,
    mut spawned: Option<&mut Spawned>,
    on_start: &mut dyn FnMut(ProtocolVersion, &ServerFacts),
    on_case: &mut dyn FnMut(&CaseResult),
) -> Result<(ProtocolVersion, ServerFacts, Vec<CaseResult>), ConformanceError> {
    let facts =
        socket::probe(options.addr, options.timeout).map_err(|source| ConformanceError::Probe {
            addr: options.addr,
            source,
        })?;
    let version = match options.version {
        Some(version) => version,
        None => served_version(&facts)?,
    };
    on_start(version, &facts);
    let mut results = Vec::new();
    for case in plan::cases(version, &facts, options.only.as_deref()) {
        let mut result = run_case(&case, version, options);
        if result.outcome == Outcome::Died {
            if let Some(server) = spawned.as_deref_mut() {
                match server.restart(options.addr) {
                    Ok(()) => result.detail.push_str("; restarted it (--spawn)"),
                    Err(error) => result
                        .detail
                        .push_str(&format!("; restart failed: {error}")),
                }
            }
        }
        on_case(&result);
        results.push(result);
    }
    Ok((version, facts, results))
}

/// Runs one case and classifies it.
pub fn run_case(case: &Case, version: ProtocolVersion, options: &Options) -> CaseResult {
    let started = Instant::now();
    // A gap is about the case's last frame: a failure before it is no gap.
    let (mut outcome, mut detail, reached_final) = match (&case.skip, &case.kind) {
        (Some(why), _) => (Outcome::Skipped, why.clone(), false),
        (None, CaseKind::Session(vector)) => session(vector, options),
        (None, CaseKind::Abandon(abandon)) => {
            let (outcome, detail) = abandoned(abandon, version, options);
            (outcome, detail, true)
        }
    };
    if outcome != Outcome::Skipped {
        match socket::alive(options.addr, options.timeout) {
            Ok(()) => {}
            Err(WaitError::TimedOut(_)) => {
                outcome = Outcome::Hung;
                detail = format!(
                    "{detail}; then a fresh connection got no HELLO answer within {:?}",
                    options.timeout
                );
            }
            Err(error) => {
                outcome = Outcome::Died;
                detail = format!("{detail}; then the server was gone ({error})");
            }
        }
    }
    let known_gap = if matches!(outcome, Outcome::Passed | Outcome::Skipped) || !reached_final {
        Vec::new()
    } else {
        case.gaps.clone()
    };
    CaseResult {
        name: case.name.clone(),
        outcome,
        known_gap,
        detail,
        time: started.elapsed(),
    }
}

/// Replays a session vector: its outcome, detail, and whether it got to the final bytes.
fn session(vector: &ggml_rpc_tests::Vector, options: &Options) -> (Outcome, String, bool) {
    let mut target = match SocketTarget::connect(options.addr, options.timeout) {
        Ok(target) => target,
        Err(error) => return (Outcome::Died, error.to_string(), false),
    };
    let mut notes = Vec::new();
    let replay = replay_session_with(vector, &mut target, &mut |step, out, bindings| {
        compare::step(step, out, bindings, &mut notes)
    });
    let result = match replay {
        Err(why) if matches!(target.failure, Some(WaitError::TimedOut(_))) => (Outcome::Hung, why),
        Err(why) => (Outcome::Refused, why),
        Ok(()) if vector.valid => still_open(target.stream(), options),
        Ok(()) if vector.final_step.as_ref().is_some_and(|last| last.eof) => (
            Outcome::Passed,
            "the stream ended inside a frame; the server closed".into(),
        ),
        Ok(()) => (
            Outcome::Passed,
            format!(
                "closed the connection ({} expected)",
                vector.error.as_deref().unwrap_or("?")
            ),
        ),
    };
    let (outcome, mut detail) = result;
    if !notes.is_empty() {
        detail = format!("{detail}; {}", notes.join("; "));
    }
    (outcome, detail, target.reached_final)
}

/// After a valid session the connection must still serve (DEVICE_COUNT).
fn still_open(stream: &mut TcpStream, options: &Options) -> (Outcome, String) {
    match socket::call(stream, Dialect::V8, &Request::DeviceCount, options.timeout) {
        Ok(_) => (Outcome::Passed, "every answer as the vector says".into()),
        Err(WaitError::TimedOut(t)) => (
            Outcome::Hung,
            format!(
                "every answer as the vector says, then DEVICE_COUNT got no answer within {t:?}"
            ),
        ),
        Err(error) => (
            Outcome::Refused,
            format!("every answer as the vector says, then DEVICE_COUNT: {error}"),
        ),
    }
}

/// HELLO, a buffer of `announced` bytes, then a SET_TENSOR into it that stops after `sent`
/// bytes of data when the client leaves. Passed when the server still serves afterwards.
fn abandoned(
    case: &ggml_rpc_tests::hostile::AbandonedSetTensor,
    version: ProtocolVersion,
    options: &Options,
) -> (Outcome, String) {
    let dialect = version.dialect().unwrap_or(Dialect::V8);
    let timeout = options.timeout;
    let steps = || -> Result<(), WaitError> {
        let mut stream = socket::connect(options.addr, timeout)?;
        socket::call(
            &mut stream,
            dialect,
            &Request::Hello { caps: [0; 24] },
            timeout,
        )?;
        let answer = socket::call(&mut stream, dialect, &case.alloc(), timeout)?;
        let handle = u64::from_le_bytes(answer[8..16].try_into().unwrap_or_default());
        if handle == 0 {
            return Err(WaitError::Closed(format!(
                "ALLOC_BUFFER of {} bytes failed (answered 0)",
                case.announced
            )));
        }
        let answer = socket::call(
            &mut stream,
            dialect,
            &Request::BufferGetBase { buffer: handle },
            timeout,
        )?;
        let base = u64::from_le_bytes(answer[8..16].try_into().unwrap_or_default());
        let head = case
            .head(dialect, handle, base)
            .map_err(WaitError::Closed)?;
        socket::write_all(&mut stream, &head, timeout)?;
        let piece = vec![0x5a; 4 << 20];
        for _ in 0..case.sent / piece.len() as u64 {
            socket::write_all(&mut stream, &piece, timeout)?;
        }
        Ok(())
    };
    match steps() {
        Ok(()) => (
            Outcome::Passed,
            format!(
                "left after {} MiB of a {} MiB SET_TENSOR",
                case.sent >> 20,
                case.announced >> 20
            ),
        ),
        Err(error @ WaitError::TimedOut(_)) => (Outcome::Hung, error.to_string()),
        Err(error) => (Outcome::Refused, error.to_string()),
    }
}
