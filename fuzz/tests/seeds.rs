//! The committed seeds reach what their names promise (run `cargo test` in `fuzz/`).

use std::path::Path;

use proto_core::ErrorKind;
use proto_core_fuzz::graph::GraphOutcome;
use proto_core::comm::CommError;
use proto_core_fuzz::ranked::{self, End, RankedInput};
use proto_core_fuzz::{boot, client, compute, graph, mirror, server};

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
        if name.starts_with("ranked_") {
            ranked_seed_reaches_its_outcome(&name, &data);
            continue;
        }
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

/// The ranked-mode seed `name` ends as its name says (the harness checks the invariants).
fn ranked_seed_reaches_its_outcome(name: &str, data: &[u8]) {
    use CommError::*;
    let input = RankedInput::parse(data);
    let outcome = ranked::run(data);
    let ends = &outcome.ends;
    let world = input.world;
    let failed = |e: CommError| End::Failed(e);
    let reset = failed(Socket { kind: std::io::ErrorKind::ConnectionReset });
    let all_honest = || ends.iter().all(|e| *e == outcome.honest);
    match name {
        n if n.starts_with("ranked_honest_") || n.ends_with("_ignored") || n == "ranked_crash_never" => {
            assert!(all_honest(), "{name}: {ends:?}");
            let comm = n.ends_with("_comm") || n.contains("reverse") || n.contains("byte_pieces") || !n.starts_with("ranked_honest");
            let want_ok = !n.contains("fails") && !n.contains("refused");
            assert_eq!(outcome.honest.is_ok(), want_ok, "{name}");
            assert_eq!(matches!(outcome.honest, End::Communicator { .. }), comm, "{name}");
            assert_eq!(matches!(outcome.honest, End::Pairwise { .. }), n.ends_with("_pairwise"), "{name}");
            if !want_ok {
                assert_eq!(outcome.honest, failed(PairwiseNeedsTwoRanks { world: u64::from(world) }));
            }
        }
        "ranked_stranger_short_closed" | "ranked_crash_peer_before_rank" => {
            assert_eq!(ends[0], failed(ConnectionClosed { peer: None }), "{name}")
        }
        "ranked_stranger_rank_out_of_range" => assert_eq!(ends[0], failed(PeerRankOutOfRange { rank: 9, world })),
        "ranked_stranger_duplicate_rank" => assert_eq!(ends[0], failed(DuplicatePeerRank { rank: 1 })),
        "ranked_stranger_stops_after_rank" => assert_eq!(ends[0], failed(ConnectionClosed { peer: Some(2) })),
        "ranked_stranger_impersonates" => {
            // Rank 0 and rank 1 take the stranger for rank 2; rank 2 was never accepted.
            assert!(ends[0].is_ok() && ends[0] != outcome.honest && ends[1] == ends[0], "{ends:?}");
            assert_eq!(ends[2], reset);
        }
        "ranked_bad_rank_zero" => assert_eq!(ends[0], failed(PeerRankOutOfRange { rank: 0, world })),
        "ranked_bad_rank_duplicate" => assert_eq!(ends[0], failed(DuplicatePeerRank { rank: 2 })),
        "ranked_bad_rank_out_of_range" => assert_eq!(ends[0], failed(PeerRankOutOfRange { rank: u32::MAX, world })),
        "ranked_world_mismatch_out_of_range" => assert_eq!(ends[0], failed(PeerRankOutOfRange { rank: 4, world })),
        "ranked_world_mismatch_duplicate" => assert_eq!(ends[0], failed(DuplicatePeerRank { rank: 2 })),
        "ranked_world_mismatch_larger_times_out" | "ranked_inject_root_vote_times_out" => {
            assert!(outcome.timed_out, "{name}: {ends:?}");
            assert_eq!(ends[0], failed(Timeout { millis: 0 }), "{name}");
        }
        "ranked_world_mismatch_smaller_undetected" | "ranked_inject_root_comm_misleads" => {
            // Every rank "succeeds"; only the misled peer 1 holds different arrays.
            assert!(!outcome.timed_out && ends.iter().all(End::is_ok), "{name}: {ends:?}");
            assert!(ends[1] != outcome.honest, "{name}");
            assert!(ends.iter().enumerate().all(|(r, e)| r == 1 || *e == outcome.honest), "{name}");
        }
        "ranked_inject_peer_vote_agreed" | "ranked_inject_peer_comm_agreed" => {
            assert!(ends.iter().all(|e| e.is_ok() && *e == ends[0]), "{name}: {ends:?}");
            assert!(ends[0] != outcome.honest, "{name}");
        }
        "ranked_inject_root_vote_fails" => {
            assert_eq!(ends[1], failed(PairwiseNeedsTwoRanks { world: 3 }));
            assert_eq!(ends[0], failed(ConnectionClosed { peer: Some(1) }));
        }
        "ranked_crash_root_at_start" => {
            assert_eq!(ends[0], End::Crashed);
            assert!(ends[1..].iter().all(|e| *e == reset), "{ends:?}");
        }
        "ranked_crash_peer_in_exchange" => {
            assert_eq!((&ends[0], &ends[1]), (&failed(ConnectionClosed { peer: Some(1) }), &End::Crashed))
        }
        "ranked_crash_peer_after_last_block" => {
            assert_eq!(ends[1], End::Crashed);
            assert!(ends[0] == outcome.honest && ends[2] == outcome.honest, "{ends:?}");
        }
        _ => panic!("{name}: no expectation for this ranked seed"),
    }
}

/// The minimised corpus of the long runs (`corpus-min/`, README "Long runs") replays through
/// every harness: each of those inputs once reached new coverage, so this is the regression run
/// of everything the long runs explored.
#[test]
fn minimised_corpus_replays() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus-min");
    let targets: [(&str, fn(&[u8])); 6] = [
        ("bootstrap", boot::fuzz),
        ("client_session", |data| {
            let _ = client::run(data);
        }),
        ("graph_compute", |data| {
            let _ = compute::run(data);
        }),
        ("graph_decode", |data| {
            let _ = graph::run(data);
        }),
        ("round_trip", mirror::run),
        ("server_session", |data| {
            let _ = server::run(data);
        }),
    ];
    for (target, run) in targets {
        let dir = root.join(target);
        let inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .collect();
        assert!(!inputs.is_empty(), "{target}: no minimised corpus");
        for input in inputs {
            let data = std::fs::read(input.path()).unwrap();
            run(&data);
        }
    }
}
