//! Interop (b): llama.cpp's OWN client against OUR server.
//!
//! * `llama_multi_server_script_*`: the sdist's `tests/test-rpc-multi-server.sh` with
//!   b11434's `test-rpc-multi-server` client, first against llama.cpp's server (control), then
//!   against our `ggml-rpc-server --protocol 7` binary through a wrapper script.
//! * `llama_c_client_*`: `tests/interop/rpc_client_check.c`, linked against b11434's
//!   libggml/libggml-rpc/libggml-base, drives every protocol-7 command through the public ggml
//!   API and checks every byte; run against llama.cpp's server (control) and our server
//!   (in-process, with a tensor cache), whose answers ("fact" lines) must agree.
//! * `llama_py_client_*`: `tests/interop/rpc_client_check.py`, the same checks plus
//!   SET/GET_TENSOR_2D through b11739's libraries with ctypes, run inside the b11739 chroot,
//!   against llama.cpp b11739's server (control) and our protocol-8 server.
//!
//! A missing peer fails the test with the script to run; nothing is skipped.

#[path = "../interop/harness.rs"]
mod harness;

use std::process::Command;
use std::time::Duration;

use proto_core::wire::ProtocolVersion;

use harness::OurServer;

/// The "fact ..." lines of a check program's output.
fn facts(output: &str) -> Vec<&str> {
    output.lines().filter(|l| l.starts_with("fact ")).collect()
}

fn assert_same_facts(theirs: &str, ours: &str, what: &str) {
    let (a, b) = (facts(theirs), facts(ours));
    assert!(
        !a.is_empty(),
        "{what}: no fact lines from the control run:\n{theirs}"
    );
    assert_eq!(
        a, b,
        "{what}: llama.cpp's client sees different answers from our server than from llama.cpp's \
         server (left: llama.cpp's server, right: ours)"
    );
}

/// Runs upstream's script, again (up to 3 times in all) when its client could not connect, or
/// when the script gave up before its client ran (no output at all: a server never listened,
/// and the script's 30 s `wait_for_port` failed silently). The script picks its ports from its
/// own process id (40000 + pid % 10000), inside the kernel's ephemeral range, so they can be
/// held by another test's sockets while the whole suite runs in parallel (seen once in CI,
/// with llama.cpp's own server). Any other failure counts.
fn run_multi_server_script(
    what: &str,
    command: &mut Command,
) -> (std::process::ExitStatus, String) {
    let mut attempt = 1;
    loop {
        let (status, output) = harness::run_with_timeout(what, command, Duration::from_secs(120));
        let port_trouble =
            output.contains("Failed to connect to 127.0.0.1") || output.trim().is_empty();
        if status.success() || attempt == 3 || !port_trouble {
            return (status, output);
        }
        eprintln!("{what}: port collision on attempt {attempt}, retrying:\n{output}");
        attempt += 1;
    }
}

#[test]
fn llama_multi_server_script_against_our_server_protocol_7() {
    let peer = harness::b11434();
    let script = peer.multi_server_script();
    let client = peer.multi_server_client();

    // Control: the upstream scenario with upstream's server must pass, or the peer is broken.
    let mut control = Command::new("bash");
    control
        .arg(&script)
        .arg(peer.rpc_server())
        .arg(&client)
        .env("GGML_RPC_NO_RDMA", "1");
    let (status, output) = run_multi_server_script(
        "test-rpc-multi-server.sh (llama.cpp's server)",
        &mut control,
    );
    assert!(
        status.success(),
        "the upstream scenario fails with upstream's own server ({status}):\n{output}"
    );

    // Ours, on every shell.
    let server = harness::our_server_binary();
    for shell in harness::shells() {
        // The script starts `<server> --device CPU --host 127.0.0.1 --port P` twice; the
        // wrapper adds --protocol 7 and the shell, and keeps a copy of each server's stderr (the script deletes
        // its logs, and greps server B's for "invalid data ptr", so stderr still goes there too).
        let dir = tempfile::tempdir().expect("tempdir");
        let wrapper = dir.path().join("our-ggml-rpc-server");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/bash\nexec '{}' --protocol 7 --shell {shell} \"$@\" 2> >(tee -a '{}'/server-$$.log >&2)\n",
                server.display(),
                dir.path().display()
            ),
        )
        .expect("write wrapper");
        let mut perms = std::fs::metadata(&wrapper).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&wrapper, perms).unwrap();
        let mut ours = Command::new("bash");
        ours.arg(&script)
            .arg(&wrapper)
            .arg(&client)
            .env("GGML_RPC_NO_RDMA", "1");
        let (status, output) = run_multi_server_script(
            &format!("test-rpc-multi-server.sh (our server, {shell} shell)"),
            &mut ours,
        );
        let mut logs = String::new();
        for entry in std::fs::read_dir(dir.path()).unwrap().flatten() {
            if entry.file_name().to_string_lossy().starts_with("server-") {
                logs.push_str(&format!(
                    "--- {}:\n{}\n",
                    entry.file_name().to_string_lossy(),
                    std::fs::read_to_string(entry.path()).unwrap_or_default()
                ));
            }
        }
        assert!(
            status.success(),
            "upstream's test-rpc-multi-server.sh fails with our ggml-rpc-server --protocol 7 \
             --shell {shell} ({status}):\n{output}\nour server logs:\n{logs}"
        );
        eprintln!("our server logs:\n{logs}");
        // Both servers really ran, served a client, and closed nothing because of an error.
        assert!(
            logs.matches("Accepted client connection").count() >= 2,
            "our server logs:\n{logs}"
        );
        assert!(
            !logs.contains("WARN") && !logs.contains("ERROR"),
            "our server logged problems:\n{logs}"
        );
    }
}

/// proto-core's `blocking_server` example (the canonical loop around the connection driver, on
/// `std::net` and the in-memory backend) serves llama.cpp's own client: every memory command,
/// a 64 MiB tensor both ways, graph compute and recompute.
#[test]
fn llama_c_client_against_the_blocking_server_example() {
    let peer = harness::b11434();
    let logs = tempfile::tempdir().expect("tempdir");
    let example = harness::blocking_server_example();
    let (mut server, addr) =
        harness::start_program("blocking_server", &example, logs.path(), |port| {
            vec![format!("127.0.0.1:{port}"), "7".into()]
        });
    let output = harness::run_c_check(
        &peer,
        &addr.to_string(),
        &["--big", "64"],
        "the blocking_server example",
    );
    assert!(facts(&output).len() > 3, "fact lines expected:\n{output}");
    server.assert_alive("after the C check");
}

#[test]
fn llama_c_client_against_our_server_protocol_7() {
    let peer = harness::b11434();
    let logs = tempfile::tempdir().expect("tempdir");

    // Control: the check passes against llama.cpp's own server.
    let cache = tempfile::tempdir().expect("tempdir");
    let (mut server, addr) = harness::start_b11434_server(&peer, logs.path(), Some(cache.path()));
    let theirs = harness::run_c_check(
        &peer,
        &addr.to_string(),
        &["--big", "64"],
        "llama.cpp b11434's server",
    );
    server.assert_alive("after the C check");
    drop(server);

    // Ours on every shell, twice on one server (the second run finds the weight in the tensor
    // cache).
    for shell in harness::shells() {
        let ours_cache = tempfile::tempdir().expect("tempdir");
        let ours = OurServer::start_on(shell, ProtocolVersion::V7_0_0, Some(ours_cache.path()));
        let first = harness::run_c_check(
            &peer,
            &ours.endpoint(),
            &["--big", "64"],
            &format!("our server (protocol 7, {shell} shell)"),
        );
        assert_same_facts(&theirs, &first, &format!("protocol 7, C client, {shell}"));
        let second = harness::run_c_check(
            &peer,
            &ours.endpoint(),
            &[],
            &format!("our server (protocol 7, {shell} shell), second run"),
        );
        assert_same_facts(
            &theirs,
            &second,
            &format!("protocol 7, C client, {shell}, second run"),
        );
        ours.wait_no_buffers(Duration::from_secs(10));
    }
}

#[test]
fn llama_py_client_against_our_server_protocol_8() {
    let peer = harness::b11739();
    let logs = tempfile::tempdir().expect("tempdir");

    // Control: the check passes against llama.cpp b11739's own server.
    let (mut server, addr) = harness::start_b11739_server(&peer, logs.path(), None);
    let theirs = harness::run_py_check(
        &peer,
        &addr.to_string(),
        &["--big", "64"],
        "llama.cpp b11739's server",
    );
    server.assert_alive("after the Python check");
    drop(server);

    for shell in harness::shells() {
        let ours_cache = tempfile::tempdir().expect("tempdir");
        let ours = OurServer::start_on(shell, ProtocolVersion::V8_0_0, Some(ours_cache.path()));
        let first = harness::run_py_check(
            &peer,
            &ours.endpoint(),
            &["--big", "64"],
            &format!("our server (protocol 8, {shell} shell)"),
        );
        assert_same_facts(
            &theirs,
            &first,
            &format!("protocol 8, Python client, {shell}"),
        );
        let second = harness::run_py_check(
            &peer,
            &ours.endpoint(),
            &[],
            &format!("our server (protocol 8, {shell} shell), second run"),
        );
        assert_same_facts(
            &theirs,
            &second,
            &format!("protocol 8, Python client, {shell}, second run"),
        );
        ours.wait_no_buffers(Duration::from_secs(10));
    }
}

/// Runs every compute case of a check program against `endpoint`; returns the failures.
fn compute_failures(
    cases: &[String],
    what: &str,
    run: impl Fn(&str) -> (std::process::ExitStatus, String),
) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        let (status, output) = run(case);
        if status.success() && output.contains(&format!("compute {case} nmse=")) {
            eprintln!(
                "{what}: {}",
                output
                    .lines()
                    .find(|l| l.starts_with("compute "))
                    .unwrap_or("")
            );
        } else {
            failures.push(format!("--- {case} ({status}):\n{}", output.trim_end()));
        }
    }
    failures
}

fn case_list(output: &str) -> Vec<String> {
    let cases: Vec<String> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    assert!(cases.len() >= 5, "compute case list: {output}");
    cases
}

/// Real graphs (MUL_MAT of F32/F16/Q8_0/Q4_0/Q4_K weights, ADD, MUL, RMS_NORM, SILU, SOFT_MAX,
/// SCALE, GET_ROWS, ROPE, CPY, and a small FFN chain) sent by llama.cpp's client: the results
/// from our server must match the local CPU backend of the same llama.cpp build.
#[test]
fn llama_c_client_computes_on_our_server_protocol_7() {
    let peer = harness::b11434();
    let (status, list) = harness::run_c(&peer, &["-", "--compute", "list"]);
    assert!(status.success(), "{list}");
    let cases = case_list(&list);
    let logs = tempfile::tempdir().expect("tempdir");

    let (mut server, addr) = harness::start_b11434_server(&peer, logs.path(), None);
    let endpoint = addr.to_string();
    let control = compute_failures(&cases, "llama.cpp's server", |case| {
        harness::run_c(&peer, &[&endpoint, "--compute", case])
    });
    server.assert_alive("after the compute cases");
    assert!(
        control.is_empty(),
        "compute cases fail against llama.cpp's own server:\n{}\nserver log:\n{}",
        control.join("\n"),
        server.log()
    );
    drop(server);

    for shell in harness::shells() {
        let ours = OurServer::start_on(shell, ProtocolVersion::V7_0_0, None);
        let endpoint = ours.endpoint();
        let failures = compute_failures(&cases, &format!("our server ({shell})"), |case| {
            harness::run_c(&peer, &[&endpoint, "--compute", case])
        });
        assert!(
            failures.is_empty(),
            "{} of {} graphs from llama.cpp's client (protocol 7) fail on our server ({shell} \
             shell):\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
        ours.wait_no_buffers(Duration::from_secs(10));
    }
}

/// The same with b11739's client (protocol 8: graph uids, asynchronous compute on the server).
#[test]
fn llama_py_client_computes_on_our_server_protocol_8() {
    let peer = harness::b11739();
    let (status, list) = harness::run_py(&peer, &["-", "--compute", "list"]);
    assert!(status.success(), "{list}");
    let cases = case_list(&list);
    let logs = tempfile::tempdir().expect("tempdir");

    let (mut server, addr) = harness::start_b11739_server(&peer, logs.path(), None);
    let endpoint = addr.to_string();
    let control = compute_failures(&cases, "llama.cpp's server", |case| {
        harness::run_py(&peer, &[&endpoint, "--compute", case])
    });
    server.assert_alive("after the compute cases");
    assert!(
        control.is_empty(),
        "compute cases fail against llama.cpp's own server:\n{}\nserver log:\n{}",
        control.join("\n"),
        server.log()
    );
    drop(server);

    for shell in harness::shells() {
        let ours = OurServer::start_on(shell, ProtocolVersion::V8_0_0, None);
        let endpoint = ours.endpoint();
        let failures = compute_failures(&cases, &format!("our server ({shell})"), |case| {
            harness::run_py(&peer, &[&endpoint, "--compute", case])
        });
        assert!(
            failures.is_empty(),
            "{} of {} graphs from llama.cpp's client (protocol 8) fail on our server ({shell} \
             shell):\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
        ours.wait_no_buffers(Duration::from_secs(10));
    }
}
