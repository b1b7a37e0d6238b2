//! Runs every test vector in `tests/vectors/` against proto-core, and checks their coverage.

use std::collections::{BTreeMap, BTreeSet};

use ggml_rpc_tests::fields::command_name;
use ggml_rpc_tests::rules::RULES;
use ggml_rpc_tests::vector::{Direction, Level};
use ggml_rpc_tests::{check, generate, hex, load_all, vectors_dir, Vector};
use proto_core::wire::{Command, Dialect, RequestSize};
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
    for (_, protocol) in dialects() {
        if sessions(protocol, true) == 0 || sessions(protocol, false) == 0 {
            missing.push(format!(
                "{protocol}: needs valid and invalid session vectors"
            ));
        }
    }
    assert!(missing.is_empty(), "coverage gaps:\n{}", missing.join("\n"));
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
