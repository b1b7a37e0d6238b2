//! Interop (a): OUR client (`ggml_rpc_client::Client`) against llama.cpp's REAL servers.
//!
//! * protocol 7: llama.cpp b11434's `ggml-rpc-server -d CPU -c` (built by
//!   `scripts/peer/build-b11434.sh`);
//! * protocol 8: llama.cpp b11739's server in its Debian 13 chroot (set up by
//!   `scripts/peer/setup-b11739.sh`), with `--cache`;
//! * protocol 8.0.1: llama.cpp b12032+1's `ggml-rpc-server -d CPU -c` (built by
//!   `scripts/peer/build-b12032.sh`; RDMA compiled in, kept off with `GGML_RPC_NO_RDMA`).
//!
//! Each test checks the HELLO version rule both ways (the right major connects, the other is
//! refused by our client, `connect_auto` lands on the server's major), runs the command
//! scenario of `tests/interop/scenario.rs` (every command, byte-exact round trips of 1 byte,
//! odd sizes at odd offsets, 1 MiB, 64 MiB and 256 MiB, addresses built from BUFFER_GET_BASE),
//! and then runs the same scenario against OUR server in-process and compares the
//! server-independent answers (alignment, max size, alloc sizes, copy and cache results, ...).
//!
//! A missing peer fails the test with the script to run; nothing is skipped.

#[path = "../interop/harness.rs"]
mod harness;
#[path = "../interop/scenario.rs"]
mod scenario;

use std::net::SocketAddr;
use std::time::Duration;

use ggml_rpc_client::Client;
use proto_core::wire::ProtocolVersion;

use harness::{OurServer, Proc};
use scenario::{diff_facts, Facts, Options};

const MIB: usize = 1 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Checks the HELLO rules against a server speaking `version`, then runs the scenario on a
/// fresh connection. `server` (when given) is the reference process, whose log is shown on
/// failure.
fn exercise(
    addr: SocketAddr,
    version: ProtocolVersion,
    options: &Options,
    server: Option<&mut Proc>,
    what: &str,
) -> Facts {
    let rt = runtime();
    let result: Result<Facts, String> = rt.block_on(async {
        let deadline = Duration::from_secs(30);
        let other = if version.major == 7 { ProtocolVersion::V8_0_0 } else { ProtocolVersion::V7_0_0 };
        // The other major: our client must refuse the server (same rule as llama.cpp's client).
        match tokio::time::timeout(deadline, Client::connect(addr, other)).await {
            Err(_) => return Err(format!("HELLO speaking {other}: no answer")),
            Ok(Ok(_)) => return Err(format!("our client speaking {other} accepted a {version} server")),
            Ok(Err(e)) => {
                if e.version_mismatch() != Some(version) {
                    return Err(format!("HELLO speaking {other}: expected a version mismatch naming {version}, got {e}"));
                }
            }
        }
        // connect_auto tries 8 first and falls back to the server's major.
        let auto = tokio::time::timeout(deadline, Client::connect_auto(addr))
            .await
            .map_err(|_| "connect_auto: no answer".to_string())?
            .map_err(|e| format!("connect_auto: {e}"))?;
        if auto.server_version() != version {
            return Err(format!("connect_auto: server version {}", auto.server_version()));
        }
        drop(auto);
        // The real session.
        let mut client = tokio::time::timeout(deadline, Client::connect(addr, version))
            .await
            .map_err(|_| "HELLO: no answer".to_string())?
            .map_err(|e| format!("HELLO: {e}"))?;
        if client.server_version() != version {
            return Err(format!("HELLO: server version {}", client.server_version()));
        }
        if client.hello().caps != [0; 24] {
            return Err(format!("HELLO: non-zero transport caps {:?} with GGML_RPC_NO_RDMA", client.hello().caps));
        }
        let facts = scenario::run(&mut client, options).await?;
        client.close().await.map_err(|e| format!("close: {e}"))?;
        Ok(facts)
    });
    match result {
        Ok(facts) => facts,
        Err(error) => {
            let log = server
                .map(|p| format!("\n{} log:\n{}", p.name, p.log()))
                .unwrap_or_default();
            panic!("our client against {what} ({addr}): {error}{log}");
        }
    }
}

/// HELLO byte 3: llama.cpp 7.0.0 and 8.0.0 always send 0 (padding); our server sends the
/// newest upstream's "tensor cache" flag (0x01) when it has a cache, and our extensions bit
/// (0x80, `proto_core::wire::HELLO_FLAG_EXTENSIONS`) unless started with `--no-extensions`.
/// Reference 7.0.0/8.0.0 clients ignore the byte (interop_llama_client.rs runs them against
/// our server with a cache and the extensions bit), so this documented difference is checked
/// on its own instead of failing the comparison.
const HELLO_FLAGS: &str = "hello flags";

fn assert_same_facts(theirs: &Facts, ours: &Facts, what: &str) {
    assert_eq!(
        theirs.get(HELLO_FLAGS).map(String::as_str),
        Some("0"),
        "{what}: llama.cpp's HELLO byte 3"
    );
    // 0 (as llama.cpp 7.0.0/8.0.0), the cache flag 0x01 (as the newest upstream) and our
    // extensions bit 0x80; any other bit would be undefined.
    let flags = ours.get(HELLO_FLAGS).map(String::as_str);
    assert!(
        matches!(flags, Some("0" | "1" | "128" | "129")),
        "{what}: our HELLO byte 3 with a tensor cache is {flags:?}"
    );
    let strip = |facts: &Facts| {
        let mut facts = facts.clone();
        facts.remove(HELLO_FLAGS);
        facts
    };
    let diff = diff_facts(&strip(theirs), &strip(ours));
    assert!(
        diff.is_empty(),
        "{what}: our server answers differently from llama.cpp's:\n  {}\n(llama.cpp: {theirs:#?})",
        diff.join("\n  ")
    );
}

#[test]
fn our_client_against_llama_b11434_server_protocol_7() {
    let peer = harness::b11434();
    let logs = tempfile::tempdir().expect("tempdir");
    let cache = tempfile::tempdir().expect("tempdir");
    let (mut server, addr) = harness::start_b11434_server(&peer, logs.path(), Some(cache.path()));
    let options = Options {
        big_sizes: vec![MIB, 64 * MIB, 256 * MIB],
        server_has_cache: true,
    };
    let theirs = exercise(
        addr,
        ProtocolVersion::V7_0_0,
        &options,
        Some(&mut server),
        "llama.cpp b11434 ggml-rpc-server",
    );
    server.assert_alive("after the scenario");
    assert_cache_stored(&cache.path().join("rpc"), "llama.cpp b11434");
    drop(server);

    // the same scenario against our server: same answers
    same_answers_from_our_server(&theirs, ProtocolVersion::V7_0_0);
}

#[test]
fn our_client_against_llama_b11739_server_protocol_8() {
    let peer = harness::b11739();
    let logs = tempfile::tempdir().expect("tempdir");
    // the cache directory lives inside the chroot
    let inside = format!(
        "/tmp/interop-cache-{}-{}",
        std::process::id(),
        harness::unique()
    );
    let host_cache = peer.chroot.join(inside.trim_start_matches('/'));
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(host_cache.clone());
    let (mut server, addr) = harness::start_b11739_server(&peer, logs.path(), Some(&inside));
    let options = Options {
        big_sizes: vec![MIB, 64 * MIB, 256 * MIB],
        server_has_cache: true,
    };
    let theirs = exercise(
        addr,
        ProtocolVersion::V8_0_0,
        &options,
        Some(&mut server),
        "llama.cpp b11739 rpc server",
    );
    server.assert_alive("after the scenario");
    drop(server);

    same_answers_from_our_server(&theirs, ProtocolVersion::V8_0_0);
}

#[test]
fn our_client_against_llama_b12032_server_protocol_8_0_1() {
    let peer = harness::b12032();
    let logs = tempfile::tempdir().expect("tempdir");
    let cache = tempfile::tempdir().expect("tempdir");
    let (mut server, addr) = harness::start_b12032_server(&peer, logs.path(), Some(cache.path()));
    let options = Options {
        big_sizes: vec![MIB, 64 * MIB, 256 * MIB],
        server_has_cache: true,
    };
    let theirs = exercise(
        addr,
        ProtocolVersion::V8_0_1,
        &options,
        Some(&mut server),
        "llama.cpp b12032 ggml-rpc-server",
    );
    server.assert_alive("after the scenario");
    assert_eq!(
        theirs.get("server version").map(String::as_str),
        Some("8.0.1"),
        "b12032's HELLO"
    );
    // the graph ops went out in 8.0.1's numbering (UNARY is 92 there, 91 before)
    assert_eq!(
        theirs.get("unary wire op").map(String::as_str),
        Some("Some(92)"),
        "UNARY's wire id to an 8.0.1 server"
    );
    assert_cache_stored(&cache.path().join("rpc"), "llama.cpp b12032");
    drop(server);

    same_answers_from_our_server(&theirs, ProtocolVersion::V8_0_1);
}

/// The reference stored the SET_TENSOR with cache_flag 1 as `<hash as 16 hex digits>` in `dir`.
fn assert_cache_stored(dir: &std::path::Path, who: &str) {
    let stored: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        stored
            .iter()
            .any(|n| n.len() == 16 && n.chars().all(|c| c.is_ascii_hexdigit())),
        "{who}'s server did not store the cache_flag=1 upload (files: {stored:?})"
    );
}

/// The same scenario against our server speaking `version` (with a cache, 1 MiB transfers
/// only): the same answers as `theirs`, and every buffer freed afterwards.
fn same_answers_from_our_server(theirs: &Facts, version: ProtocolVersion) {
    let ours_cache = tempfile::tempdir().expect("tempdir");
    let ours = OurServer::start(version, Some(ours_cache.path()));
    let small = Options {
        big_sizes: vec![MIB],
        server_has_cache: true,
    };
    let facts = exercise(
        ours.addr,
        version,
        &small,
        None,
        &format!("our server (protocol {version})"),
    );
    assert_same_facts(theirs, &facts, &format!("protocol {version}"));
    ours.wait_no_buffers(Duration::from_secs(10));
}
