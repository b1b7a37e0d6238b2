//! The vector file format (documented in `vectors/README.md`) and the loader.

use std::path::{Path, PathBuf};

use proto_core::wire::{Dialect, ProtocolVersion};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which side sends the bytes of the vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// A request frame (or, for sessions, a stream of request frames).
    ClientToServer,
    /// A response frame.
    ServerToClient,
}

/// What one vector exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// One frame, decoded on its own.
    Frame,
    /// A sequence of frames fed to a fresh server.
    Session,
}

/// The request a response vector answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestContext {
    /// Its command name.
    pub command: String,
    /// The complete request frame.
    pub hex: String,
    /// The payload length the client expects back (decimal string), `null` when the command has
    /// no response.
    pub expected_len: Option<String>,
}

/// The server a session vector runs against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerParams {
    /// Number of devices.
    pub devices: u32,
    /// Memory of each device in bytes (decimal string); also the largest buffer (`max_size`).
    pub device_memory: String,
    /// Alignment every device reports (decimal string).
    pub alignment: String,
    /// Most bytes of buffers the connection may hold (decimal string), `null` = unlimited.
    pub memory_quota: Option<String>,
    /// Largest buffered (non-streamed) request the server accepts (decimal string).
    pub max_message_size: String,
    /// Whether the server has a tensor cache (initially empty); HELLO flag bit 0.
    pub tensor_cache: bool,
    /// The server's transport caps (hex), sent in the HELLO response.
    pub conn_caps: String,
}

/// One step of a session: frames to send and the bytes the server must answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Command name of the frame sent.
    pub command: String,
    /// The frame as a hex template.
    pub send: String,
    /// Everything the server writes in reply, as a hex template (`""`: nothing).
    pub expect: String,
}

/// The last step of an invalid session: the server must fail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinalStep {
    /// Command name of the frame sent (`null` for an unknown command id).
    pub command: Option<String>,
    /// The bytes sent, as a hex template: a frame, or only the beginning of one.
    pub send: String,
    /// Whether the client then closes its side (end of stream).
    pub eof: bool,
}

/// One test vector file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vector {
    /// Unique name: the file path below `vectors/` without `.json`.
    pub name: String,
    /// What the vector shows, in words.
    pub description: String,
    /// `"7.0.0"`, `"8.0.0"` or `"8.0.1"`: the version both sides speak (for a HELLO response, the client's).
    pub protocol: String,
    /// `frame` or `session`.
    pub level: Level,
    /// Whether the bytes are valid.
    pub valid: bool,
    /// Who sends the bytes.
    pub direction: Direction,
    /// Command name of the frame (`null` for an unknown command id); for sessions, the command
    /// of the last frame.
    pub command: Option<String>,
    /// Where PROTOCOL.md defines the rule or layout.
    pub spec: String,
    /// Frame vectors: the whole frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
    /// Frame vectors whose encoding is not canonical: the bytes the decoded message re-encodes
    /// to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canonical_hex: Option<String>,
    /// Valid frame vectors: the decoded fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Value>,
    /// Response vectors: the request answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestContext>,
    /// Session vectors: the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerParams>,
    /// Session vectors: the steps that must succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<Step>>,
    /// Invalid session vectors: the step that must fail.
    #[serde(rename = "final", default, skip_serializing_if = "Option::is_none")]
    pub final_step: Option<FinalStep>,
    /// Invalid vectors: the validation rule violated (see the README's rule table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Invalid vectors: the expected error kind (`ErrorKind::as_str`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Vector {
    /// The protocol version of the vector.
    pub fn version(&self) -> Result<ProtocolVersion, String> {
        match self.protocol.as_str() {
            "7.0.0" => Ok(ProtocolVersion::V7_0_0),
            "8.0.0" => Ok(ProtocolVersion::V8_0_0),
            "8.0.1" => Ok(ProtocolVersion::V8_0_1),
            other => Err(format!("unknown protocol {other:?}")),
        }
    }

    /// The dialect of the vector.
    pub fn dialect(&self) -> Result<Dialect, String> {
        self.version()?.dialect().ok_or_else(|| "no dialect".into())
    }
}

/// `tests/vectors/` of this crate.
pub fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors")
}

/// Every `*.json` file below `dir`, sorted, as (path relative to `dir` with `/` separators and
/// without `.json`, path).
pub fn vector_files(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                let relative = path.strip_prefix(dir).unwrap_or(&path).with_extension("");
                let name = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                out.push((name, path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Loads one vector file.
pub fn load(path: &Path) -> Result<Vector, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Loads every vector below `dir`; each must be named after its path.
pub fn load_all(dir: &Path) -> Result<Vec<Vector>, String> {
    let files = vector_files(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::with_capacity(files.len());
    for (name, path) in files {
        let vector = load(&path)?;
        if vector.name != name {
            return Err(format!(
                "{}: name {:?} differs from its path",
                path.display(),
                vector.name
            ));
        }
        out.push(vector);
    }
    Ok(out)
}

/// The JSON text a vector is stored as (pretty, trailing newline).
pub fn to_json(vector: &Vector) -> String {
    let mut text = serde_json::to_string_pretty(vector).unwrap_or_default();
    text.push('\n');
    text
}
