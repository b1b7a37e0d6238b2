//! The vector generator: every vector is built from typed values (requests, responses, tensors),
//! encoded with proto-core and described with [`crate::fields`]; expected errors come from the
//! rule catalogue ([`crate::rules`]), never from running the server.

mod frames;
mod invalid;
mod samples;
mod sessions;

use std::collections::BTreeSet;
use std::path::Path;

use proto_core::wire::{Command, Dialect, ProtocolVersion, Request, Response};

use crate::fields::{self, command_name};
use crate::harness::expected_response_len;
use crate::hex;
use crate::rules::rule_by_slug;
use crate::vector::{self, Direction, Level, RequestContext, Vector};

pub(crate) const V7: ProtocolVersion = ProtocolVersion::V7_0_0;
pub(crate) const V8: ProtocolVersion = ProtocolVersion::V8_0_0;
pub(crate) const V801: ProtocolVersion = ProtocolVersion::V8_0_1;
pub(crate) const VERSIONS: [ProtocolVersion; 2] = [V7, V8];

/// Every vector, sorted by name. Panics on a generator bug (duplicate names, unknown rules).
pub fn all() -> Vec<Vector> {
    let mut out = Vec::new();
    frames::generate(&mut out);
    invalid::generate(&mut out);
    sessions::generate(&mut out);
    out.sort_by(|a, b| a.name.cmp(&b.name));
    let mut names = BTreeSet::new();
    for vector in &out {
        assert!(
            names.insert(vector.name.clone()),
            "duplicate vector {}",
            vector.name
        );
    }
    out
}

/// Writes every vector below `dir` (one file per vector, folders from the names) and removes
/// `*.json` files that are no longer generated. Returns the number of vectors.
pub fn write_all(dir: &Path) -> Result<usize, String> {
    let vectors = all();
    let wanted: BTreeSet<String> = vectors.iter().map(|v| v.name.clone()).collect();
    if dir.exists() {
        for (name, path) in vector::vector_files(dir).map_err(|e| e.to_string())? {
            if !wanted.contains(&name) {
                std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
    }
    for vector in &vectors {
        let path = dir.join(format!("{}.json", vector.name));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&path, vector::to_json(vector))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(vectors.len())
}

pub(crate) fn dialect(version: ProtocolVersion) -> Dialect {
    version.dialect().expect("supported version")
}

/// `v7` / `v8` / `v8.0.1`: 7.0.0 and 8.0.0 are named after their dialect, 8.0.1 (the same
/// dialect as 8.0.0 with ggml's newer op and type numbering) by its full version.
pub(crate) fn folder(version: ProtocolVersion) -> &'static str {
    if version == V801 {
        return "v8.0.1";
    }
    match dialect(version) {
        Dialect::V7 => "v7",
        Dialect::V8 => "v8",
    }
}

pub(crate) fn spec(section: &str) -> String {
    format!("PROTOCOL.md {section}")
}

/// The frame of a request (panics if the request cannot be encoded for `version`).
pub(crate) fn request_frame(version: ProtocolVersion, request: &Request) -> Vec<u8> {
    request
        .to_frame(dialect(version))
        .expect("encodable request")
        .to_vec()
}

/// A frame with an arbitrary command byte, size field and payload.
pub(crate) fn raw_frame(id: u8, declared: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![id];
    out.extend_from_slice(&declared.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A response frame with an arbitrary payload.
pub(crate) fn raw_response(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

fn base(name: String, version: ProtocolVersion, spec: String, description: &str) -> Vector {
    Vector {
        name,
        description: description.to_owned(),
        protocol: version.to_string(),
        level: Level::Frame,
        valid: true,
        direction: Direction::ClientToServer,
        command: None,
        spec,
        hex: None,
        canonical_hex: None,
        fields: None,
        request: None,
        server: None,
        steps: None,
        final_step: None,
        rule: None,
        error: None,
    }
}

/// A valid request frame vector.
pub(crate) fn valid_request(
    name: String,
    version: ProtocolVersion,
    spec: String,
    description: &str,
    request: &Request,
) -> Vector {
    let mut v = base(name, version, spec, description);
    v.command = Some(command_name(request.command()).to_owned());
    v.hex = Some(hex::encode(&request_frame(version, request)));
    v.fields = Some(fields::request(request, dialect(version)));
    v
}

pub(crate) fn request_context(version: ProtocolVersion, request: &Request) -> RequestContext {
    RequestContext {
        command: command_name(request.command()).to_owned(),
        hex: hex::encode(&request_frame(version, request)),
        expected_len: expected_response_len(request).map(|n| n.to_string()),
    }
}

/// A valid response frame vector.
pub(crate) fn valid_response(
    name: String,
    version: ProtocolVersion,
    spec: String,
    description: &str,
    request: &Request,
    response: &Response,
) -> Vector {
    assert_eq!(request.command(), response.command(), "{name}");
    let mut v = base(name, version, spec, description);
    v.direction = Direction::ServerToClient;
    v.command = Some(command_name(request.command()).to_owned());
    v.hex = Some(hex::encode(&response.to_frame()));
    v.fields = Some(fields::response(response));
    v.request = Some(request_context(version, request));
    v
}

fn mark_invalid(v: &mut Vector, rule: &str) {
    let kind = rule_by_slug(rule)
        .unwrap_or_else(|| panic!("unknown rule {rule}"))
        .kind;
    v.valid = false;
    v.rule = Some(rule.to_owned());
    v.error = Some(kind.as_str().to_owned());
}

/// An invalid request frame vector (the command is read from the first byte).
pub(crate) fn invalid_request(
    name: String,
    version: ProtocolVersion,
    spec: String,
    description: &str,
    rule: &str,
    frame: Vec<u8>,
) -> Vector {
    let mut v = base(name, version, spec, description);
    v.command = frame
        .first()
        .and_then(|&id| Command::from_id(id, dialect(version)).or_else(|| Command::extension(id)))
        .map(|c| command_name(c).to_owned());
    v.hex = Some(hex::encode(&frame));
    mark_invalid(&mut v, rule);
    v
}

/// An invalid response frame vector.
pub(crate) fn invalid_response(
    name: String,
    version: ProtocolVersion,
    spec: String,
    description: &str,
    rule: &str,
    request: &Request,
    frame: Vec<u8>,
) -> Vector {
    let mut v = base(name, version, spec, description);
    v.direction = Direction::ServerToClient;
    v.command = Some(command_name(request.command()).to_owned());
    v.hex = Some(hex::encode(&frame));
    v.request = Some(request_context(version, request));
    mark_invalid(&mut v, rule);
    v
}
