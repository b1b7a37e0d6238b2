//! Runs `tests/c/client.c` — a verbs client built against the system's `<infiniband/verbs.h>` and
//! linked with `-libverbs`, exactly as llama.cpp is — with `LD_LIBRARY_PATH` at a freshly linked
//! fabric `libibverbs.so.1`. Each scenario forks two processes that talk over the fabric. The
//! client asserts that the device is "fabric0", so it cannot pass against another libibverbs.
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

struct Built {
    _dir: tempfile::TempDir,
    lib_dir: PathBuf,
    client: PathBuf,
    /// The same client, also linked (not as-needed) with librdmacm, as `rdma-sys` users may be.
    client_rdmacm: PathBuf,
}

mod common;
use common::crate_dir;

/// Links the fabric and compiles the C client, once per test process.
fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("vfab-")
            .tempdir()
            .expect("tempdir");
        let lib_dir = dir.path().join("lib");
        common::link_fabric(&lib_dir);
        let compile = |out: &PathBuf, libs: &[&str]| {
            let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
                .arg(out)
                .arg(crate_dir().join("tests/c/client.c"))
                .args(libs)
                .status()
                .expect("run cc");
            assert!(st.success(), "compiling tests/c/client.c failed");
        };
        let client = dir.path().join("client");
        compile(&client, &["-libverbs"]);
        let client_rdmacm = dir.path().join("client-rdmacm");
        compile(
            &client_rdmacm,
            &["-Wl,--no-as-needed", "-lrdmacm", "-libverbs"],
        );
        Built {
            _dir: dir,
            lib_dir,
            client,
            client_rdmacm,
        }
    })
}

fn run(scenario: &str, env: &[(&str, &str)]) {
    run_with(&built().client, scenario, env);
}

fn run_with(client: &PathBuf, scenario: &str, env: &[(&str, &str)]) {
    let b = built();
    let sockets = tempfile::Builder::new()
        .prefix("vfab-sock-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let out = Command::new("timeout")
        .arg("120")
        .arg(client)
        .arg(scenario)
        .env("LD_LIBRARY_PATH", &b.lib_dir)
        .env("GGML_VERBS_FABRIC_DIR", sockets.path())
        .envs(env.iter().copied())
        .output()
        .expect("run client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scenario {scenario} failed: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    if scenario != "modify" && scenario != "cleanup" {
        assert_eq!(stdout.trim(), format!("ok {scenario}"), "stderr: {stderr}");
    }
}

#[test]
fn sends_arrive_in_order_with_payloads_and_completions_on_both_sides() {
    run("exchange", &[]);
}

#[test]
fn loads_and_works_in_a_process_that_also_links_librdmacm() {
    // librdmacm is linked with -z now: every libibverbs symbol it imports must resolve at load.
    run_with(&built().client_rdmacm, "exchange", &[]);
}

#[test]
fn receive_smaller_than_send_fails_both_sides() {
    run("small", &[]);
}

#[test]
fn send_waits_for_a_posted_receive() {
    run("norecv", &[]);
}

#[test]
fn peer_killed_gives_retry_exceeded_and_flushes() {
    run("kill", &[]);
}

#[test]
fn peer_qp_in_error_fails_a_waiting_send() {
    run("peer_error", &[]);
}

#[test]
fn completion_channel_fd_is_readable_once_an_armed_cq_completes() {
    run("chanpoll", &[]);
}

#[test]
fn send_to_a_peer_that_never_reaches_rtr_times_out() {
    run("rtr_timeout", &[("GGML_VERBS_FABRIC_TIMEOUT_MS", "500")]);
}

#[test]
fn state_machine_masks_and_protection_are_checked() {
    run("modify", &[]);
}

#[test]
fn destroy_leaves_no_sockets_threads_or_fds() {
    run("cleanup", &[]);
}

#[test]
fn library_has_the_soname_and_symbol_versions_of_rdma_core_44() {
    let so = built().lib_dir.join("libibverbs.so.1");
    let out = Command::new("readelf")
        .args(["-W", "-d", "--dyn-syms"])
        .arg(&so)
        .output()
        .expect("readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Library soname: [libibverbs.so.1]"));
    for sym in [
        "ibv_create_comp_channel@@IBVERBS_1.0",
        "ibv_post_send",
        "ibv_open_device@@IBVERBS_1.1",
        "ibv_query_port@@IBVERBS_1.1",
        "_ibv_query_gid_ex@@IBVERBS_1.11",
        "ibv_reg_mr_iova2@@IBVERBS_1.8",
    ] {
        if sym == "ibv_post_send" {
            // An inline function of the header: a real libibverbs does not export it either.
            assert!(
                !text.contains(" ibv_post_send"),
                "ibv_post_send must not be exported"
            );
        } else {
            assert!(text.contains(sym), "{sym} not exported");
        }
    }
    // Nothing of Rust's runtime leaks into the dynamic symbol table.
    assert!(!text.contains("rust_"), "Rust symbols exported");
}
