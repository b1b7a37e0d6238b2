//! Runs every test vector in `tests/vectors/` against proto-core, and checks their coverage.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use ggml_rpc_tests::fields::command_name;
use ggml_rpc_tests::rules::RULES;
use ggml_rpc_tests::vector::{Direction, Level};
use ggml_rpc_tests::{check, generate, hex, load_all, vectors_dir, Vector};
use proto_core::ggml::types::id as ty;
use proto_core::ggml::{GgmlTable, Op};
use proto_core::wire::{Command, Dialect, Request, RequestSize, RpcTensor};
use proto_core::ErrorKind;

fn vectors() -> Vec<Vector> {
    let vectors = load_all(&vectors_dir()).unwrap_or_else(|e| panic!("loading vectors: {e}"));
    assert!(vectors.len() > 100, "only {} vectors found", vectors.len());
    vectors
}

#[test]
fn every_vector_passes() {
    let vectors = vectors();
    let failures: Vec<String> = vectors
        .iter()
        .filter_map(|v| check(v).err().map(|e| format!("{}: {e}", v.name)))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} vectors fail:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

fn dialects() -> [(Dialect, &'static str); 2] {
    [(Dialect::V7, "7.0.0"), (Dialect::V8, "8.0.0")]
}

#[test]
fn vectors_cover_every_message_and_rule() {
    let vectors = vectors();
    let valid_frames = |protocol: &str, direction: Direction| -> BTreeSet<String> {
        vectors
            .iter()
            .filter(|v| v.valid && v.level == Level::Frame && v.direction == direction)
            .filter(|v| v.protocol == protocol)
            .filter_map(|v| v.command.clone())
            .collect()
    };
    let mut missing = Vec::new();
    for (dialect, protocol) in dialects() {
        let requests = valid_frames(protocol, Direction::ClientToServer);
        let responses = valid_frames(protocol, Direction::ServerToClient);
        for command in Command::ALL.into_iter().filter(|c| c.exists_in(dialect)) {
            let name = command_name(command);
            if !requests.contains(name) {
                missing.push(format!("{protocol}: no valid {name} request"));
            }
            if command.has_response() && !responses.contains(name) {
                missing.push(format!("{protocol}: no valid {name} response"));
            }
            if let RequestSize::Exact(_) = command.request_size(dialect) {
                let sized = vectors.iter().any(|v| {
                    v.protocol == protocol
                        && v.rule.as_deref() == Some("fixed_request_size")
                        && v.command.as_deref() == Some(name)
                });
                if !sized {
                    missing.push(format!("{protocol}: no size mismatch vector for {name}"));
                }
            }
        }
        let hello_flags: BTreeSet<u64> = vectors
            .iter()
            .filter(|v| {
                v.valid && v.protocol == protocol && v.direction == Direction::ServerToClient
            })
            .filter(|v| v.command.as_deref() == Some("HELLO"))
            .filter_map(|v| v.fields.as_ref()?.get("flags")?.as_u64())
            .collect();
        if !hello_flags.contains(&0) || !hello_flags.contains(&1) {
            missing.push(format!(
                "{protocol}: HELLO responses with flags 0 and 1, got {hello_flags:?}"
            ));
        }
        let unknown_id = if dialect == Dialect::V7 { "18" } else { "23" };
        let unknown = vectors.iter().any(|v| {
            v.protocol == protocol
                && v.rule.as_deref() == Some("unknown_command_id")
                && v.hex.as_deref().is_some_and(|h| {
                    h.starts_with(&format!("{:02x}", unknown_id.parse::<u8>().unwrap_or(0)))
                })
        });
        if !unknown {
            missing.push(format!("{protocol}: no vector for command id {unknown_id}"));
        }
    }
    let mut by_rule: BTreeMap<&str, usize> = RULES.iter().map(|r| (r.slug, 0)).collect();
    for v in vectors.iter().filter(|v| !v.valid) {
        let rule = v.rule.as_deref().unwrap_or("(none)");
        match by_rule.get_mut(rule) {
            Some(count) => *count += 1,
            None => missing.push(format!("{}: unknown rule {rule}", v.name)),
        }
    }
    for (rule, count) in &by_rule {
        if *count == 0 {
            missing.push(format!("no invalid vector for rule {rule}"));
        }
    }
    let used: BTreeSet<&str> = vectors.iter().filter_map(|v| v.error.as_deref()).collect();
    let listed: BTreeSet<&str> = RULES.iter().map(|r| r.kind.as_str()).collect();
    if used != listed {
        missing.push(format!(
            "error kinds used {used:?} differ from the rules' kinds {listed:?}"
        ));
    }
    let sessions = |protocol: &str, valid: bool| {
        vectors
            .iter()
            .filter(|v| v.level == Level::Session && v.protocol == protocol && v.valid == valid)
            .count()
    };
    for protocol in ["7.0.0", "8.0.0", "8.0.1"] {
        if sessions(protocol, true) == 0 || sessions(protocol, false) == 0 {
            missing.push(format!(
                "{protocol}: needs valid and invalid session vectors"
            ));
        }
    }
    assert!(missing.is_empty(), "coverage gaps:\n{}", missing.join("\n"));
}

/// A session template's frame with every placeholder replaced by 8 zero bytes, decoded as an 8.x
/// request (`None` for a partial or undecodable frame).
fn template_request(template: &str) -> Option<Request> {
    let mut text = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        text.push_str(&rest[..open]);
        text.push_str(&"00".repeat(8));
        rest = &rest[open + rest[open..].find('}')? + 1..];
    }
    text.push_str(rest);
    Request::from_frame(Dialect::V8, Bytes::from(hex::decode(&text).ok()?)).ok()
}

/// The tensor records of a request (GRAPH_COMPUTE: all of them).
fn records(request: &Request) -> Vec<RpcTensor> {
    match request {
        Request::GraphCompute(graph) => graph.tensors.clone(),
        Request::SetTensor { header, .. } => vec![header.tensor.clone()],
        Request::GetTensor { tensor, .. } => vec![(**tensor).clone()],
        _ => Vec::new(),
    }
}

/// Protocol 8.0.1 (ggml's newer op and type numbering, PROTOCOL.md §1.4, §12): every op id that
/// moved has a valid GRAPH_COMPUTE, f8_e4m3 travels in frames and sessions, the ids past and
/// beside the 8.0.1 table are refused, and an 8.0.1 client's ids are refused by an 8.0.0 server.
#[test]
fn vectors_cover_protocol_8_0_1() {
    let vectors = vectors();
    let mut missing = Vec::new();
    let graph_frames: Vec<Request> = vectors
        .iter()
        .filter(|v| v.protocol == "8.0.1" && v.valid && v.level == Level::Frame)
        .filter(|v| v.direction == Direction::ClientToServer)
        .filter(|v| v.command.as_deref() == Some("GRAPH_COMPUTE"))
        .filter_map(|v| template_request(v.hex.as_deref()?))
        .collect();
    let frame_records: Vec<RpcTensor> = graph_frames.iter().flat_map(records).collect();
    for op in [
        Op::TOP_K_MASK,
        Op::UNARY,
        Op::CROSS_ENTROPY_LOSS,
        Op::CROSS_ENTROPY_LOSS_BACK,
        Op::OPT_STEP_ADAMW,
        Op::OPT_STEP_SGD,
        Op::GLU,
    ] {
        let id = GgmlTable::V8_0_1.op_to_wire(op).expect("8.0.1 op");
        if GgmlTable::V8_0_0.op_to_wire(op) == Some(id) {
            missing.push(format!("{op:?} did not move"));
        }
        if !frame_records.iter().any(|t| t.op == id) {
            missing.push(format!("8.0.1: no valid GRAPH_COMPUTE frame with op {id}"));
        }
    }
    if !frame_records.iter().any(|t| t.type_id == ty::F8_E4M3) {
        missing.push("8.0.1: no valid GRAPH_COMPUTE frame with an f8_e4m3 tensor".into());
    }
    // The commands of valid 8.0.1 sessions that carry an f8_e4m3 tensor.
    let f8_commands: BTreeSet<&'static str> = vectors
        .iter()
        .filter(|v| v.protocol == "8.0.1" && v.valid && v.level == Level::Session)
        .flat_map(|v| v.steps.iter().flatten())
        .filter_map(|step| template_request(&step.send))
        .filter(|r| records(r).iter().any(|t| t.type_id == ty::F8_E4M3))
        .map(|r| command_name(r.command()))
        .collect();
    for command in ["SET_TENSOR", "GET_TENSOR", "GRAPH_COMPUTE"] {
        if !f8_commands.contains(command) {
            missing.push(format!(
                "8.0.1: no valid session sends {command} of an f8_e4m3 tensor"
            ));
        }
    }
    // Ops in the final GRAPH_COMPUTE of invalid sessions, per protocol and rule.
    let refused = |protocol: &str, rule: &str| -> Vec<RpcTensor> {
        vectors
            .iter()
            .filter(|v| v.protocol == protocol && v.rule.as_deref() == Some(rule))
            .filter_map(|v| template_request(&v.final_step.as_ref()?.send))
            .flat_map(|r| records(&r))
            .collect()
    };
    let refused_801 = refused("8.0.1", "graph_op");
    for id in [93, 94, 95, 96, 102, u32::MAX] {
        if !refused_801.iter().any(|t| t.op == id) {
            missing.push(format!("8.0.1: no invalid session refusing op {id}"));
        }
    }
    let refused_800 = refused("8.0.0", "graph_op");
    for op in [Op::UNARY, Op::GLU] {
        let id = GgmlTable::V8_0_1.op_to_wire(op).expect("8.0.1 op");
        if !refused_800.iter().any(|t| t.op == id) {
            missing.push(format!(
                "8.0.0: no invalid session refusing an 8.0.1 client's {op:?} (op {id})"
            ));
        }
    }
    if !refused("8.0.0", "type_id")
        .iter()
        .any(|t| t.type_id == ty::F8_E4M3)
    {
        missing.push("8.0.0: no invalid session refusing an f8_e4m3 tensor".into());
    }
    if !refused("8.0.1", "type_id").iter().any(|t| t.type_id == 44) {
        missing.push("8.0.1: no invalid session refusing type 44".into());
    }
    assert!(
        missing.is_empty(),
        "8.0.1 coverage gaps:\n{}",
        missing.join("\n")
    );
}

#[test]
fn vectors_are_up_to_date() {
    let on_disk: BTreeMap<String, Vector> =
        vectors().into_iter().map(|v| (v.name.clone(), v)).collect();
    let generated: BTreeMap<String, Vector> = generate::all()
        .into_iter()
        .map(|v| (v.name.clone(), v))
        .collect();
    let stale: Vec<&String> = on_disk
        .keys()
        .chain(generated.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|name| on_disk.get(*name) != generated.get(*name))
        .collect();
    assert!(
        stale.is_empty(),
        "vectors differ from the generator (run `cargo run -p ggml-rpc-tests --bin gen-vectors`): {stale:?}"
    );
}

/// PROTOCOL.md's notation (`0E 18 00 + ...`, `24 × 00`) as hex, written out here independently of
/// the generator.
fn spec_bytes(text: &str) -> String {
    let mut out = String::new();
    for part in text.split('+') {
        let part = part.trim();
        if let Some((count, byte)) = part.split_once('×') {
            let count: usize = count.trim().parse().expect("count");
            out.push_str(&byte.trim().to_lowercase().repeat(count));
        } else {
            out.extend(part.split_whitespace().map(str::to_lowercase));
        }
    }
    out
}

fn vector_hex(vectors: &[Vector], name: &str) -> String {
    vectors
        .iter()
        .find(|v| v.name == name)
        .and_then(|v| v.hex.clone())
        .unwrap_or_else(|| panic!("vector {name} missing"))
}

#[test]
fn spec_examples_match_protocol_md() {
    let vectors = vectors();
    let exact = [
        (
            "examples/v7/hello_request",
            "0E 18 00 00 00 00 00 00 00 + 24 × 00",
        ),
        (
            "examples/v7/hello_response",
            "1C 00 00 00 00 00 00 00 07 00 00 00 + 24 × 00",
        ),
        (
            "examples/v7/device_count_request",
            "0F 00 00 00 00 00 00 00 00",
        ),
        (
            "examples/v8/device_count_request",
            "0F 00 00 00 00 00 00 00 00",
        ),
        (
            "examples/v7/device_count_response",
            "04 00 00 00 00 00 00 00 + 01 00 00 00",
        ),
        (
            "examples/v8/device_count_response",
            "04 00 00 00 00 00 00 00 + 01 00 00 00",
        ),
        (
            "examples/v7/alloc_buffer_request",
            "00 + 0C 00 00 00 00 00 00 00 + 00 00 00 00 + 00 00 10 00 00 00 00 00",
        ),
        (
            "examples/v8/alloc_buffer_request",
            "00 + 0C 00 00 00 00 00 00 00 + 00 00 00 00 + 00 00 10 00 00 00 00 00",
        ),
        (
            "examples/v8/graph_recompute_request",
            "10 + 0C 00 00 00 00 00 00 00 + 01 00 00 00 + 2A 00 00 00 00 00 00 00",
        ),
        (
            "examples/v7/graph_recompute_request",
            "10 + 04 00 00 00 00 00 00 00 + 01 00 00 00",
        ),
    ];
    for (name, spec) in exact {
        assert_eq!(vector_hex(&vectors, name), spec_bytes(spec), "{name}");
    }
    for name in [
        "examples/v7/alloc_buffer_response",
        "examples/v8/alloc_buffer_response",
    ] {
        let text = vector_hex(&vectors, name);
        assert!(
            text.starts_with(&spec_bytes("10 00 00 00 00 00 00 00")),
            "{name}"
        );
        assert_eq!(text.len(), 2 * (8 + 8 + 8), "{name}: handle (8) + size (8)");
        assert_eq!(&text[32..], "0000100000000000", "{name}: 1 MiB");
    }
    for name in [
        "examples/v7/set_tensor_request",
        "examples/v8/set_tensor_request",
    ] {
        let bytes = hex::decode(&vector_hex(&vectors, name)).expect("hex");
        assert_eq!(
            hex::encode(&bytes[..9]),
            spec_bytes("06 + 39 01 00 00 00 00 00 00"),
            "{name}"
        );
        assert_eq!(bytes.len(), 9 + 296 + 1 + 8 + 8, "{name}");
        assert_eq!(
            hex::encode(&bytes[305..314]),
            spec_bytes("00 + 10 00 00 00 00 00 00 00"),
            "{name}"
        );
    }
    let graph =
        hex::decode(&vector_hex(&vectors, "examples/v8/graph_compute_request")).expect("hex");
    assert_eq!(graph.len(), 9 + 1516);
    assert_eq!(graph[0], 0x0a);
    assert_eq!(u64::from_le_bytes(graph[1..9].try_into().expect("8")), 1516);
    assert_eq!(
        graph[9 + 12..9 + 16],
        [2, 0, 0, 0],
        "n_nodes after device(4) uid(8)"
    );
    assert_eq!(
        graph[9 + 32..9 + 36],
        [5, 0, 0, 0],
        "n_tensors after two ids"
    );
}

#[test]
fn readme_documents_every_rule_and_error_kind() {
    let readme = std::fs::read_to_string(vectors_dir().join("README.md")).expect("README.md");
    for rule in RULES {
        assert!(
            readme.contains(&format!("`{}`", rule.slug)),
            "README lacks rule {}",
            rule.slug
        );
    }
    for kind in ErrorKind::ALL {
        assert!(
            readme.contains(&format!("`{}`", kind.as_str())),
            "README lacks error kind {kind}"
        );
    }
}

/// Flips bytes of every valid frame vector: each corrupted copy must fail its check.
#[test]
fn corrupted_vectors_fail() {
    let vectors = vectors();
    let mut survivors = Vec::new();
    // Vectors that fail as they are are reported by `every_vector_passes`.
    for v in vectors
        .iter()
        .filter(|v| v.valid && v.level == Level::Frame && check(v).is_ok())
    {
        let bytes = hex::decode(v.hex.as_deref().unwrap_or_default()).expect("hex");
        // Bytes past the canonical encoding are ignored by design (GRAPH_COMPUTE trailing bytes).
        let meaningful = v
            .canonical_hex
            .as_ref()
            .map_or(bytes.len(), |c| c.len() / 2);
        let positions: BTreeSet<usize> = [0, 1, 8, 9, meaningful / 2, meaningful.saturating_sub(1)]
            .into_iter()
            .filter(|&p| p < meaningful)
            .collect();
        for position in positions {
            let mut corrupted = v.clone();
            let mut flipped = bytes.clone();
            flipped[position] ^= 0x01;
            corrupted.hex = Some(hex::encode(&flipped));
            if check(&corrupted).is_ok() {
                survivors.push(format!("{} byte {position}", v.name));
            }
        }
        let mut changed = v.clone();
        changed.description.push('!');
        assert!(check(&changed).is_ok(), "the description is not checked");
    }
    assert!(
        survivors.is_empty(),
        "corruptions not detected: {survivors:?}"
    );
}

/// Rewrites `tests/vectors/` from the generator: `cargo test -p ggml-rpc-tests -- --ignored
/// regenerate_vectors`.
#[test]
#[ignore]
fn regenerate_vectors() {
    let count = generate::write_all(&vectors_dir()).expect("writing vectors");
    println!("wrote {count} vectors");
}
