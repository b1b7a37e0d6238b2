//! `ggml-rpc probe` and `ggml-rpc bench` against servers of both protocol versions.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;

use proto_core::backend::MemoryBackend;
use proto_core::wire::ProtocolVersion;
use shell_tokio::{serve, ServerConfig};

const CLI: &str = env!("CARGO_BIN_EXE_ggml-rpc");

/// A server on a background runtime; stops when the returned sender drops.
fn server(version: ProtocolVersion) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let backend = Arc::new(MemoryBackend::new(2, 1 << 30));
            serve(listener, backend, ServerConfig::new(version), async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
    });
    (addr_rx.recv().unwrap(), stop)
}

fn run(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(CLI).args(args).output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn probe_detects_the_protocol_and_lists_devices() {
    for (version, text, table) in [
        (
            ProtocolVersion::V7_0_0,
            "7.0.0",
            "7.0.0/8.0.0 (101 ops, 43 types)",
        ),
        (
            ProtocolVersion::V8_0_0,
            "8.0.0",
            "7.0.0/8.0.0 (101 ops, 43 types)",
        ),
        (
            ProtocolVersion::V8_0_1,
            "8.0.1",
            "8.0.1 (102 ops, 44 types)",
        ),
    ] {
        let (addr, _stop) = server(version);
        let endpoint = addr.to_string();
        let (ok, stdout, stderr) = run(&["probe", &endpoint]);
        assert!(ok, "{stderr}");
        assert!(
            stdout.contains(&format!("protocol  : {text}\nop table  : {table}\n")),
            "{stdout}"
        );
        assert!(
            stdout.contains("flags     : 0x80 (no tensor cache, extensions)"),
            "{stdout}"
        );
        assert!(stdout.contains("devices   : 2\n"), "{stdout}");
        assert!(
            stdout.contains("device 0  : 1 GiB free of 1 GiB, alignment 32, max buffer 1 GiB"),
            "{stdout}"
        );
        assert!(stdout.contains("device 1  : "), "{stdout}");
        // A fixed protocol of the other major is refused with a clear error.
        let other = if version.major == 7 { "8" } else { "7" };
        let (ok, _, stderr) = run(&["--protocol", other, "probe", &endpoint]);
        assert!(!ok);
        assert!(stderr.contains("incompatible"), "{stderr}");
    }
}

#[test]
fn bench_prints_a_table() {
    let (addr, _stop) = server(ProtocolVersion::V8_0_0);
    let endpoint = addr.to_string();
    let (ok, stdout, stderr) = run(&[
        "bench",
        &endpoint,
        "--size",
        "1MiB",
        "--iterations",
        "2",
        "--small-rounds",
        "50",
        "--device",
        "1",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("server 8.0.0, device 1"), "{stdout}");
    for row in ["SET_TENSOR", "GET_TENSOR", "GET_ALIGNMENT"] {
        assert!(
            stdout.lines().any(|line| line.starts_with(row)),
            "{row} missing:\n{stdout}"
        );
    }
    assert!(stdout.contains("1 MiB"), "{stdout}");
    assert!(
        stdout.contains("GB/s") && stdout.contains("rt/s"),
        "{stdout}"
    );
}

#[test]
fn bench_refuses_a_missing_device_and_an_unreachable_server() {
    let (addr, _stop) = server(ProtocolVersion::V8_0_0);
    let (ok, _, stderr) = run(&[
        "bench",
        &addr.to_string(),
        "--size",
        "4KiB",
        "--device",
        "5",
    ]);
    assert!(!ok);
    assert!(stderr.contains("device 5 does not exist"), "{stderr}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (ok, _, stderr) = run(&["probe", &closed.to_string()]);
    assert!(!ok);
    assert!(stderr.contains("cannot connect"), "{stderr}");
}
