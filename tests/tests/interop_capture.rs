//! Interop (c): our encodings against the bytes the REAL peers put on the wire.
//!
//! A recording TCP proxy (`harness::Recorder`) sits between a client and llama.cpp's server
//! and keeps both byte streams. Every captured conversation is then parsed with `proto_core`
//! (`harness::check_conversation`): each client frame must decode with `Request::from_frame`
//! and re-encode byte for byte with `Request::to_frame`, each server frame must have the size
//! its request implies, decode with `Response::decode` and re-encode byte for byte; nothing is
//! skipped and both streams must be consumed exactly. Every captured command must also have a
//! valid frame vector of the same command in `tests/vectors/` (when that folder exists).
//!
//! Conversations captured:
//! * llama.cpp's client ↔ llama.cpp's server, protocol 7: `rpc_client_check.c` (twice, so the
//!   second run hits the tensor cache) and `test-rpc-multi-server` (two servers);
//! * llama.cpp's client ↔ llama.cpp's server, protocol 8: `rpc_client_check.py` in the b11739
//!   chroot (twice);
//! * our client ↔ llama.cpp's server, protocols 7 and 8: the scenario of
//!   `tests/interop/scenario.rs`.

#[path = "../interop/harness.rs"]
mod harness;
#[path = "../interop/scenario.rs"]
mod scenario;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use proto_core::wire::{Command as Cmd, Dialect, ProtocolVersion, Request, Response};

use harness::{check_conversation, Conversation, ConversationSummary, Recorder};

const FINISH: Duration = Duration::from_secs(30);

/// Checks every conversation and merges their summaries.
fn check_all(dialect: Dialect, conversations: &[Conversation], what: &str) -> ConversationSummary {
    assert!(
        !conversations.is_empty(),
        "{what}: no connection was recorded"
    );
    let mut all = ConversationSummary::default();
    for (i, conversation) in conversations.iter().enumerate() {
        if conversation.client_to_server.is_empty() {
            // a readiness probe (connect + close) or an aborted client
            assert!(
                conversation.server_to_client.is_empty(),
                "{what}: connection {i} got bytes without asking"
            );
            continue;
        }
        let summary = check_conversation(dialect, conversation)
            .unwrap_or_else(|e| panic!("{what}: connection {i}: {e}"));
        all.requests.extend(summary.requests);
        all.responses.extend(summary.responses);
    }
    all
}

fn assert_saw(summary: &ConversationSummary, commands: &[Cmd], what: &str) {
    let seen: BTreeSet<&str> = summary
        .requests
        .iter()
        .map(|r| harness::command_name(r.command))
        .collect();
    let missing: Vec<&str> = commands
        .iter()
        .map(|&c| harness::command_name(c))
        .filter(|c| !seen.contains(c))
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: never captured {missing:?} (captured {seen:?})"
    );
}

const V7_ALL: [Cmd; 18] = [
    Cmd::Hello,
    Cmd::DeviceCount,
    Cmd::GetDeviceMemory,
    Cmd::GetAlignment,
    Cmd::GetMaxSize,
    Cmd::AllocBuffer,
    Cmd::BufferGetBase,
    Cmd::GetAllocSize,
    Cmd::InitTensor,
    Cmd::BufferClear,
    Cmd::SetTensor,
    Cmd::SetTensorHash,
    Cmd::GetTensor,
    Cmd::CopyTensor,
    Cmd::MemsetTensor,
    Cmd::GraphCompute,
    Cmd::GraphRecompute,
    Cmd::FreeBuffer,
];

fn cache_flags(summary: &ConversationSummary) -> BTreeSet<u8> {
    summary
        .requests
        .iter()
        .filter_map(|r| match &r.request {
            Request::SetTensor { header, .. } => Some(header.cache_flag),
            _ => None,
        })
        .collect()
}

fn hash_answers(summary: &ConversationSummary) -> Vec<u8> {
    summary
        .responses
        .iter()
        .filter_map(|(_, r)| match r {
            Response::SetTensorHash(v) => Some(*v),
            _ => None,
        })
        .collect()
}

/// The compute captures carry real graphs: MUL_MAT among the ops, nodes with the COMPUTE flag
/// and non-zero use counts.
fn assert_graph_ops(summary: &ConversationSummary, what: &str) {
    let graphs: Vec<_> = summary
        .requests
        .iter()
        .filter_map(|r| match &r.request {
            Request::GraphCompute(g) => Some(g),
            _ => None,
        })
        .collect();
    assert!(!graphs.is_empty(), "{what}: no GRAPH_COMPUTE captured");
    let ops: BTreeSet<&str> = graphs
        .iter()
        .flat_map(|g| g.tensors.iter())
        .filter_map(|t| proto_core::ggml::op_name(t.op))
        .collect();
    assert!(ops.contains("MUL_MAT"), "{what}: ops {ops:?}");
    assert!(
        graphs
            .iter()
            .flat_map(|g| g.tensors.iter())
            .any(|t| t.flags & proto_core::ggml::flags::COMPUTE != 0 && t.use_count > 0),
        "{what}: no node with the COMPUTE flag and a use count"
    );
    eprintln!("{what}: {} graphs, ops {ops:?}", graphs.len());
}

fn print_summary(what: &str, summary: &ConversationSummary) {
    let bytes: usize = summary.requests.iter().map(|r| r.frame_len).sum();
    eprintln!(
        "{what}: {} requests ({bytes} bytes): {:?}",
        summary.requests.len(),
        summary.request_counts()
    );
}

#[test]
fn capture_llama_client_and_llama_server_protocol_7() {
    let peer = harness::b11434();
    let logs = tempfile::tempdir().expect("tempdir");
    let cache = tempfile::tempdir().expect("tempdir");

    // rpc_client_check.c, twice, through the proxy
    let (mut server, addr) = harness::start_b11434_server(&peer, logs.path(), Some(cache.path()));
    let recorder = Recorder::start(addr);
    harness::run_c_check(
        &peer,
        &recorder.endpoint(),
        &[],
        "llama.cpp's server through the recording proxy",
    );
    let first = check_all(Dialect::V7, &recorder.finish(FINISH), "C client, first run");
    let recorder = Recorder::start(addr);
    harness::run_c_check(
        &peer,
        &recorder.endpoint(),
        &[],
        "llama.cpp's server through the recording proxy (2nd run)",
    );
    let second = check_all(
        Dialect::V7,
        &recorder.finish(FINISH),
        "C client, second run",
    );
    // real graphs: every case of the C program's --compute mode
    let (status, list) = harness::run_c(&peer, &["-", "--compute", "list"]);
    assert!(status.success(), "{list}");
    let recorder = Recorder::start(addr);
    for case in list.lines().filter(|l| !l.trim().is_empty()) {
        harness::run_c_check(
            &peer,
            &recorder.endpoint(),
            &["--compute", case.trim()],
            "llama.cpp's server through the recording proxy (compute)",
        );
    }
    let graphs = check_all(
        Dialect::V7,
        &recorder.finish(FINISH),
        "C client, compute cases",
    );
    server.assert_alive("after the captured runs");
    drop(server);
    print_summary("protocol 7, C client, run 1", &first);
    print_summary("protocol 7, C client, run 2", &second);
    print_summary("protocol 7, C client, compute cases", &graphs);
    assert_graph_ops(&graphs, "protocol 7 compute cases");
    assert_saw(&first, &V7_ALL, "protocol 7, C client");
    // run 1: the weight misses the cache (0) and goes out with cache_flag 1;
    // run 2: it hits (1) and no SET_TENSOR carries cache_flag 1
    assert_eq!(
        hash_answers(&first),
        vec![0, 1],
        "SET_TENSOR_HASH answers, run 1 (miss, then hit of the same data)"
    );
    assert!(
        cache_flags(&first).contains(&1),
        "run 1 sent no SET_TENSOR with cache_flag 1"
    );
    assert_eq!(
        hash_answers(&second),
        vec![1, 1],
        "SET_TENSOR_HASH answers, run 2"
    );
    assert!(
        !cache_flags(&second).contains(&1),
        "run 2 sent a SET_TENSOR with cache_flag 1"
    );

    // test-rpc-multi-server against two servers, both behind proxies
    let (server_a, addr_a) = harness::start_b11434_server(&peer, logs.path(), None);
    let (server_b, addr_b) = harness::start_b11434_server(&peer, logs.path(), None);
    let (rec_a, rec_b) = (Recorder::start(addr_a), Recorder::start(addr_b));
    let mut command = Command::new(peer.multi_server_client());
    command
        .arg(rec_a.endpoint())
        .arg(rec_b.endpoint())
        .env("GGML_RPC_NO_RDMA", "1");
    let (status, output) = harness::run_with_timeout(
        "test-rpc-multi-server",
        &mut command,
        Duration::from_secs(60),
    );
    assert!(
        status.success(),
        "test-rpc-multi-server through the proxies failed ({status}):\n{output}"
    );
    let a = check_all(
        Dialect::V7,
        &rec_a.finish(FINISH),
        "test-rpc-multi-server, server A",
    );
    let b = check_all(
        Dialect::V7,
        &rec_b.finish(FINISH),
        "test-rpc-multi-server, server B",
    );
    drop((server_a, server_b));
    print_summary("protocol 7, test-rpc-multi-server, server A", &a);
    print_summary("protocol 7, test-rpc-multi-server, server B", &b);
    // server B computes a graph whose only tensor lives in a buffer of server A: it must travel
    // with buffer = data = 0
    let graph = b
        .requests
        .iter()
        .find_map(|r| match &r.request {
            Request::GraphCompute(g) => Some(g.clone()),
            _ => None,
        })
        .expect("server B got a GRAPH_COMPUTE");
    assert!(
        graph.tensors.iter().all(|t| t.buffer == 0 && t.data == 0),
        "foreign tensor sent with a buffer: {graph:?}"
    );
    // ... and that graph is one F32 leaf (op NONE, no COMPUTE flag): nothing to calculate. The
    // MUL_MAT tensors of test-rpc-multi-server only appear in GET_ALLOC_SIZE, never in a graph.
    assert_eq!(graph.node_ids.len(), 1, "{graph:?}");
    assert_eq!(graph.tensors.len(), 1, "{graph:?}");
    assert_eq!(
        graph.tensors[0].op,
        proto_core::ggml::Op::NONE.0,
        "{graph:?}"
    );
    assert_eq!(
        graph.tensors[0].flags & proto_core::ggml::flags::COMPUTE,
        0,
        "{graph:?}"
    );
    assert!(
        a.requests
            .iter()
            .chain(&b.requests)
            .all(|r| !matches!(&r.request, Request::GraphCompute(g)
            if g.tensors.iter().any(|t| t.op == proto_core::ggml::Op::MUL_MAT.0))),
        "a MUL_MAT tensor travelled in a graph"
    );
    // server A is asked GET_ALLOC_SIZE for two MUL_MAT tensors differing only in nb
    let mul_mats = a
        .requests
        .iter()
        .filter(|r| matches!(&r.request, Request::GetAllocSize(q) if q.tensor.op == proto_core::ggml::Op::MUL_MAT.0))
        .count();
    assert_eq!(
        mul_mats, 2,
        "GET_ALLOC_SIZE requests for MUL_MAT tensors at server A"
    );

    for summary in [&first, &second, &graphs, &a, &b] {
        harness::assert_vectors_cover("7.0.0", summary, "protocol 7, llama.cpp client");
    }
}

#[test]
fn capture_llama_client_and_llama_server_protocol_8() {
    let peer = harness::b11739();
    let logs = tempfile::tempdir().expect("tempdir");
    let inside = format!(
        "/tmp/interop-cache-{}-{}",
        std::process::id(),
        harness::unique()
    );
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(peer.chroot.join(inside.trim_start_matches('/')));
    let (mut server, addr) = harness::start_b11739_server(&peer, logs.path(), Some(&inside));
    let recorder = Recorder::start(addr);
    harness::run_py_check(
        &peer,
        &recorder.endpoint(),
        &[],
        "llama.cpp b11739's server through the recording proxy",
    );
    let first = check_all(
        Dialect::V8,
        &recorder.finish(FINISH),
        "Python client, first run",
    );
    let recorder = Recorder::start(addr);
    harness::run_py_check(
        &peer,
        &recorder.endpoint(),
        &[],
        "llama.cpp b11739's server through the recording proxy (2nd run)",
    );
    let second = check_all(
        Dialect::V8,
        &recorder.finish(FINISH),
        "Python client, second run",
    );
    let (status, list) = harness::run_py(&peer, &["-", "--compute", "list"]);
    assert!(status.success(), "{list}");
    let recorder = Recorder::start(addr);
    for case in list.lines().filter(|l| !l.trim().is_empty()) {
        harness::run_py_check(
            &peer,
            &recorder.endpoint(),
            &["--compute", case.trim()],
            "llama.cpp b11739's server through the recording proxy (compute)",
        );
    }
    let graphs = check_all(
        Dialect::V8,
        &recorder.finish(FINISH),
        "Python client, compute cases",
    );
    server.assert_alive("after the captured runs");
    drop(server);
    print_summary("protocol 8, Python client, run 1", &first);
    print_summary("protocol 8, Python client, run 2", &second);
    print_summary("protocol 8, Python client, compute cases", &graphs);
    assert_graph_ops(&graphs, "protocol 8 compute cases");
    let mut v8_all = V7_ALL.to_vec();
    v8_all.extend([Cmd::SetTensor2d, Cmd::GetTensor2d]);
    assert_saw(&first, &v8_all, "protocol 8, Python client");
    assert_eq!(
        hash_answers(&first),
        vec![0, 1],
        "SET_TENSOR_HASH answers, run 1"
    );
    assert_eq!(
        hash_answers(&second),
        vec![1, 1],
        "SET_TENSOR_HASH answers, run 2"
    );
    // the graph went out with its uid, the second compute as GRAPH_RECOMPUTE of that uid
    let uid = first
        .requests
        .iter()
        .find_map(|r| match &r.request {
            Request::GraphCompute(g) => Some(g.uid),
            _ => None,
        })
        .expect("a GRAPH_COMPUTE");
    assert_ne!(uid, 0, "the graph was sent with uid 0");
    assert!(
        first
            .requests
            .iter()
            .any(|r| matches!(r.request, Request::GraphRecompute { uid: u, .. } if u == uid)),
        "no GRAPH_RECOMPUTE of uid {uid:#x}"
    );
    for summary in [&first, &second, &graphs] {
        harness::assert_vectors_cover("8.0.0", summary, "protocol 8, llama.cpp client");
    }
}

fn capture_our_client(
    version: ProtocolVersion,
    addr: std::net::SocketAddr,
    server: &mut harness::Proc,
) -> ConversationSummary {
    let recorder = Recorder::start(addr);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let endpoint = recorder.addr;
    let result = rt.block_on(async move {
        let mut client = ggml_rpc_client::Client::connect(endpoint, version)
            .await
            .map_err(|e| format!("HELLO: {e}"))?;
        let options = scenario::Options {
            big_sizes: vec![],
            server_has_cache: false,
        };
        scenario::run(&mut client, &options).await?;
        client.close().await.map_err(|e| format!("close: {e}"))
    });
    if let Err(e) = result {
        panic!(
            "our client through the proxy: {e}\nserver log:\n{}",
            server.log()
        );
    }
    let dialect = version.dialect().unwrap();
    check_all(
        dialect,
        &recorder.finish(FINISH),
        &format!("our client, protocol {version}"),
    )
}

#[test]
fn capture_our_client_and_llama_server_protocol_7() {
    let peer = harness::b11434();
    let logs = tempfile::tempdir().expect("tempdir");
    let (mut server, addr) = harness::start_b11434_server(&peer, logs.path(), None);
    let summary = capture_our_client(ProtocolVersion::V7_0_0, addr, &mut server);
    server.assert_alive("after our client's session");
    print_summary("protocol 7, our client", &summary);
    assert_saw(&summary, &V7_ALL, "protocol 7, our client");
    harness::assert_vectors_cover("7.0.0", &summary, "protocol 7, our client");
}

#[test]
fn capture_our_client_and_llama_server_protocol_8() {
    let peer = harness::b11739();
    let logs = tempfile::tempdir().expect("tempdir");
    let (mut server, addr) = harness::start_b11739_server(&peer, logs.path(), None);
    let summary = capture_our_client(ProtocolVersion::V8_0_0, addr, &mut server);
    server.assert_alive("after our client's session");
    print_summary("protocol 8, our client", &summary);
    let mut v8_all = V7_ALL.to_vec();
    v8_all.extend([Cmd::SetTensor2d, Cmd::GetTensor2d]);
    assert_saw(&summary, &v8_all, "protocol 8, our client");
    harness::assert_vectors_cover("8.0.0", &summary, "protocol 8, our client");
}

/// The checker itself must not be vacuous: it rejects every kind of deviation.
#[test]
fn conversation_checker_rejects_deviations() {
    use bytes::Bytes;
    let hello = Request::Hello { caps: [0; 24] }
        .to_frame(Dialect::V7)
        .unwrap();
    let hello_rsp = Response::Hello {
        version: ProtocolVersion::V7_0_0,
        flags: 0,
        caps: [0; 24],
    }
    .to_frame();
    let count = Request::DeviceCount.to_frame(Dialect::V7).unwrap();
    let count_rsp = Response::DeviceCount(1).to_frame();
    let join = |parts: &[&[u8]]| Bytes::from(parts.concat());
    let conv = |c2s: Bytes, s2c: Bytes| Conversation {
        client_to_server: c2s,
        server_to_client: s2c,
    };

    let ok = check_conversation(
        Dialect::V7,
        &conv(join(&[&hello, &count]), join(&[&hello_rsp, &count_rsp])),
    )
    .unwrap();
    assert_eq!(ok.requests.len(), 2);
    assert_eq!(ok.responses.len(), 2);

    let cases: Vec<(&str, Dialect, Conversation)> = vec![
        (
            "not HELLO first",
            Dialect::V7,
            conv(join(&[&count]), join(&[&count_rsp])),
        ),
        (
            "half a header",
            Dialect::V7,
            conv(join(&[&hello, &[0x0f, 0]]), join(&[&hello_rsp])),
        ),
        (
            "id 18 in protocol 7",
            Dialect::V7,
            conv(
                join(&[&hello, &[18], &0u64.to_le_bytes()]),
                join(&[&hello_rsp]),
            ),
        ),
        (
            "payload cut short",
            Dialect::V7,
            conv(
                join(&[
                    &hello,
                    &count[..count.len()],
                    &[0x0b, 4, 0, 0, 0, 0, 0, 0, 0, 0],
                ]),
                join(&[&hello_rsp, &count_rsp]),
            ),
        ),
        (
            "wrong fixed size",
            Dialect::V7,
            conv(
                join(&[&hello, &[0x0f, 1, 0, 0, 0, 0, 0, 0, 0, 0]]),
                join(&[&hello_rsp]),
            ),
        ),
        (
            "missing response",
            Dialect::V7,
            conv(join(&[&hello, &count]), join(&[&hello_rsp])),
        ),
        (
            "response of the wrong size",
            Dialect::V7,
            conv(
                join(&[&hello, &count]),
                join(&[&hello_rsp, &8u64.to_le_bytes(), &[0; 8]]),
            ),
        ),
        (
            "bytes after the last response",
            Dialect::V7,
            conv(
                join(&[&hello, &count]),
                join(&[&hello_rsp, &count_rsp, &[0]]),
            ),
        ),
        (
            "id 22 (COMM_FREE) in protocol 7",
            Dialect::V7,
            conv(
                join(&[&hello, &[22], &4u64.to_le_bytes(), &[0; 4]]),
                join(&[&hello_rsp]),
            ),
        ),
    ];
    for (what, dialect, conversation) in cases {
        assert!(
            check_conversation(dialect, &conversation).is_err(),
            "the checker accepted: {what}"
        );
    }

    // GRAPH_COMPUTE with trailing bytes decodes (the reference ignores them) but does not
    // re-encode to the same bytes: the checker reports it, as the real client never sends them.
    let graph = proto_core::wire::GraphComputeRequest {
        device: 0,
        uid: 0,
        node_ids: vec![1],
        tensors: vec![proto_core::wire::RpcTensor::contiguous(1, 0, [1, 1, 1, 1]).unwrap()],
    };
    let frame = Request::GraphCompute(Box::new(graph))
        .to_frame(Dialect::V7)
        .unwrap();
    let mut padded = frame.to_vec();
    padded.push(0);
    let size = u64::from_le_bytes(padded[1..9].try_into().unwrap()) + 1;
    padded[1..9].copy_from_slice(&size.to_le_bytes());
    let err = check_conversation(
        Dialect::V7,
        &conv(join(&[&hello, &padded]), join(&[&hello_rsp])),
    )
    .unwrap_err();
    assert!(err.contains("re-encodes differently"), "{err}");
}
