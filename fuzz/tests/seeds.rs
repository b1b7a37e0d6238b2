//! The committed seeds reach what their names promise (run `cargo test` in `fuzz/`).

use std::path::Path;

use proto_core::ErrorKind;
use proto_core_fuzz::graph::GraphOutcome;
use proto_core_fuzz::{boot, client, graph, mirror, server};

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("seeds exist: cargo run --example make_seeds")
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    out.sort();
    assert!(!out.is_empty());
    out
}

#[test]
fn server_seeds_converse() {
    for (name, data) in seeds("server_session") {
        let stats = server::run(&data);
        let fails = ["hello_expected", "over_limits", "quota", "eof_mid", "not_negotiated"]
            .iter()
            .any(|s| name.contains(s));
        if name.starts_with("vec_") {
            continue;
        }
        assert_eq!(stats.error.is_some(), fails, "{name}: {stats:?}");
        if !name.contains("hello_expected") && !name.contains("not_negotiated") {
            assert!(stats.responses >= 2, "{name}: {stats:?}");
        }
    }
}

#[test]
fn client_seeds_connect() {
    for (name, data) in seeds("client_session") {
        let stats = client::run(&data);
        let kind = stats.error.as_ref().map(|e| e.kind());
        let expected = match name.as_str() {
            "v8_client_v7_server" | "v8_newer_minor_refused" => Some(ErrorKind::VersionMismatch),
            "v8_unsolicited" => Some(ErrorKind::UnexpectedResponse),
            "v8_huge_get_tensor" => Some(ErrorKind::SizeOverflow),
            _ => None,
        };
        assert_eq!(kind, expected, "{name}: {stats:?}");
        if expected.is_none() {
            assert!(stats.events >= 1, "{name}: {stats:?}");
        }
        if name.starts_with("v8_pipelined") {
            assert_eq!(stats.events, 1 + 12, "{name}");
        }
    }
}

#[test]
fn graph_seeds_decode() {
    for (name, data) in seeds("graph_decode") {
        let outcome = graph::run(&data);
        match name.as_str() {
            n if n.ends_with("_valid") || n.ends_with("trailing_bytes") => {
                assert_eq!(outcome, Some(GraphOutcome::Valid(9)), "{name}")
            }
            "raw_v8_0_1_moved_ops" => assert_eq!(outcome, Some(GraphOutcome::Valid(7)), "{name}"),
            "raw_v8_0_1_f8_e4m3" => assert_eq!(outcome, Some(GraphOutcome::Valid(1)), "{name}"),
            n if n.ends_with("_refused") => {
                let kind = match &outcome {
                    Some(GraphOutcome::Invalid(error)) => Some(error.kind()),
                    _ => None,
                };
                let want = if n.contains("f8") { ErrorKind::InvalidType } else { ErrorKind::OpRefused };
                assert_eq!(kind, Some(want), "{name}: {outcome:?}")
            }
            n if n.contains("out_of_order") => {
                assert!(matches!(outcome, Some(GraphOutcome::Invalid(_))), "{name}: {outcome:?}")
            }
            n if n.contains("too_large") => {
                assert!(matches!(outcome, Some(GraphOutcome::Undecodable(_))), "{name}: {outcome:?}")
            }
            _ => assert!(outcome.is_some(), "{name}"),
        }
    }
}

#[test]
fn bootstrap_and_round_trip_seeds_run() {
    for (name, data) in seeds("bootstrap") {
        let outcome = boot::run(&data);
        assert_eq!(outcome.all_done, name.starts_with("honest") || name.starts_with("surplus"), "{name}");
    }
    for (_, data) in seeds("round_trip") {
        mirror::run(&data);
    }
}

#[test]
fn valid_session_vectors_run_clean() {
    for (name, data) in seeds("server_session") {
        if name.starts_with("vec_sessions_") {
            let stats = server::run(&data);
            println!("{name}: {stats:?}");
            assert_eq!(stats.error, None, "{name}");
        }
    }
}

#[test]
fn compute_seeds_run_or_refuse_at_run_time() {
    use proto_core_fuzz::compute::{self, ComputeOutcome};
    for (name, data) in seeds("graph_compute") {
        let outcome = compute::run(&data);
        if name.contains("refused") {
            assert!(matches!(outcome, ComputeOutcome::Refused(_)), "{name}: {outcome:?}");
        } else {
            assert!(matches!(outcome, ComputeOutcome::Computed), "{name}: {outcome:?}");
        }
    }
}
