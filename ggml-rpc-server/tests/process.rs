//! The `ggml-rpc-server` process: flags, banner, serving, and shutdown on SIGTERM.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use ggml_rpc_client::Client;
use proto_core::tensor_cache::fnv1a64;
use proto_core::wire::{ProtocolVersion, RpcTensor};

const SERVER: &str = env!("CARGO_BIN_EXE_ggml-rpc-server");
const DEADLINE: Duration = Duration::from_secs(20);

/// A port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the server and returns it with the banner (stdout up to the transport line).
fn start(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(SERVER)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut banner = String::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            banner.push_str(&line);
            banner.push('\n');
            if line.contains("transport") {
                let _ = tx.send(banner.clone());
            }
        }
    });
    let banner = rx.recv_timeout(DEADLINE).expect("banner printed");
    (child, banner)
}

/// A signal (`-TERM`, `-INT`), then the exit status and stderr.
fn terminate(mut child: Child, signal: &str) -> (bool, String) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (tx, rx) = mpsc::channel();
    let mut stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    let stderr = rx
        .recv_timeout(DEADLINE)
        .expect("the server exits on SIGTERM");
    (child.wait().unwrap().success(), stderr)
}

/// The shells of this build (the default features: all three).
const SHELLS: [&str; 3] = ["tokio", "uring", "smol"];

#[test]
fn serves_clients_and_stops_on_sigterm() {
    for shell in SHELLS {
        serves_clients_and_stops_on_sigterm_with(shell);
    }
}

fn serves_clients_and_stops_on_sigterm_with(shell: &str) {
    let cache = tempfile::tempdir().unwrap();
    let port = free_port();
    let port_text = port.to_string();
    let cache_dir = cache.path().join("rpc");
    let (child, banner) = start(&[
        "-p",
        &port_text,
        "-t",
        "1",
        "--cache-dir",
        cache_dir.to_str().unwrap(),
        "--shell",
        shell,
    ]);
    assert!(
        banner.starts_with("Starting RPC server v8.0.1\n"),
        "{banner}"
    );
    assert!(banner.contains(&format!("  endpoint       : 127.0.0.1:{port}\n")));
    assert!(banner.contains(&format!("  local cache    : {}\n", cache_dir.display())));
    assert!(banner.contains("Devices:\n  CPU: "));
    // `--transport auto`: TCP until a client switches (the line says why or why not).
    assert!(
        banner.contains(" MiB free)\n  transport      : TCP ("),
        "{banner}"
    );
    assert!(
        banner.contains("  clients        : llama.cpp of protocol 8.0.1 (b12032 and later)"),
        "{banner}"
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = Client::connect_auto(("127.0.0.1", port)).await.unwrap();
        assert_eq!(client.server_version(), ProtocolVersion::V8_0_1);
        assert!(client.server_has_tensor_cache());
        assert_eq!(client.device_count().await.unwrap(), 1);
        assert_eq!(client.alignment(0).await.unwrap(), 32);
        let buffer = client.alloc_buffer(0, 4096).await.unwrap().unwrap();
        let base = client.buffer_base(buffer.handle).await.unwrap();
        let mut tensor = RpcTensor::contiguous(1, 24, [4096, 1, 1, 1]).unwrap();
        tensor.buffer = buffer.handle;
        tensor.data = base;
        let data = Bytes::from((0..4096).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        client
            .set_tensor_with_cache_flag(&tensor, 0, data.clone(), true)
            .await
            .unwrap();
        assert_eq!(client.get_tensor(&tensor, 0, 4096).await.unwrap(), data);
        let entry = cache_dir.join(format!("{:016x}", fnv1a64(&data)));
        assert_eq!(std::fs::read(entry).unwrap(), data);
    });
    let (success, stderr) = terminate(child, "-TERM");
    assert!(success, "{shell}: {stderr}");
    assert!(stderr.contains("Accepted client connection"), "{stderr}");
    assert!(stderr.contains("Client connection closed"), "{stderr}");
    assert!(stderr.contains("server stopped"), "{stderr}");
    assert!(stderr.contains(&format!("shell=\"{shell}\"")), "{stderr}");
    assert!(!stderr.contains("WARNING"), "{stderr}");
}

/// Pinned to one CPU (`taskset -c 0`, as in the llama-bench comparisons), the tokio shell
/// still runs two workers: with one, every graph of a lone client would go through
/// `block_in_place`'s thread handoff instead of running inline.
#[test]
fn the_tokio_shell_keeps_two_workers_on_one_cpu() {
    let port = free_port().to_string();
    let mut child = Command::new("taskset")
        .args(["-c", "0", SERVER, "-p", &port, "--shell", "tokio"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("taskset (util-linux) runs");
    let workers = || {
        std::fs::read_dir(format!("/proc/{}/task", child.id()))
            .unwrap()
            .filter(|task| {
                let comm = task.as_ref().unwrap().path().join("comm");
                std::fs::read_to_string(comm).is_ok_and(|name| name.trim() == "rpc-io")
            })
            .count()
    };
    // The listener is bound before the runtime starts: give the workers a moment to appear.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut seen = workers();
    while seen < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        seen = workers();
    }
    let affinity = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        affinity.contains("Cpus_allowed_list:\t0\n"),
        "pinned to CPU 0: {affinity}"
    );
    assert_eq!(seen, 2);
}

#[test]
fn sigint_stops_every_shell_with_a_client_connected() {
    for shell in SHELLS {
        let port = free_port();
        let (child, _) = start(&["-p", &port.to_string(), "--shell", shell]);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut client = runtime.block_on(async {
            let mut client = Client::connect_auto(("127.0.0.1", port)).await.unwrap();
            assert_eq!(client.device_count().await.unwrap(), 1);
            client
        });
        let (success, stderr) = terminate(child, "-INT");
        assert!(success, "{shell}: {stderr}");
        assert!(
            stderr.contains("Client connection closed: server shutting down"),
            "{shell}: {stderr}"
        );
        runtime.block_on(async {
            assert!(client.device_count().await.is_err());
        });
    }
}

/// Where the kernel refuses io_uring (here: a seccomp filter that fails `io_uring_setup` with
/// EPERM, as container runtimes do), `--shell uring` says so at start-up and exits non-zero.
#[cfg(target_os = "linux")]
#[test]
fn uring_refused_by_the_kernel_is_reported_at_start_up() {
    use std::os::unix::process::CommandExt as _;

    let mut command = Command::new(SERVER);
    command.args(["-p", &free_port().to_string(), "--shell", "uring"]);
    // SAFETY: the hook only makes two prctl calls with data on its own stack (async-signal-safe).
    unsafe {
        command.pre_exec(deny_io_uring_setup);
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("io_uring is not available: "), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("Starting RPC server"));
}

/// Installs a seccomp filter on the current process: `io_uring_setup` fails with EPERM,
/// every other system call is allowed.
#[cfg(target_os = "linux")]
fn deny_io_uring_setup() -> std::io::Result<()> {
    const LD_NR: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let mut filter = [
        // seccomp_data.nr is at offset 0
        libc::sock_filter {
            code: LD_NR,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: JEQ,
            jt: 0,
            jf: 1,
            k: libc::SYS_io_uring_setup as u32,
        },
        libc::sock_filter {
            code: RET,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: RET,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: plain prctl calls; the program outlives the call that copies it into the kernel.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[test]
fn protocol_7_and_the_exposure_warning() {
    let port = free_port().to_string();
    let (child, banner) = start(&[
        "-H",
        "0.0.0.0",
        "--insecure-plain",
        "-p",
        &port,
        "--protocol",
        "7",
    ]);
    assert!(
        banner.starts_with("Starting RPC server v7.0.0\n"),
        "{banner}"
    );
    assert!(banner.contains("  local cache    : n/a\n"));
    let (success, stderr) = terminate(child, "-TERM");
    assert!(success);
    assert!(
        stderr.contains("WARNING: Host ('0.0.0.0') is != '127.0.0.1'"),
        "{stderr}"
    );
    assert!(stderr.contains("Never expose the RPC server to an open network!"));
}

#[test]
fn plain_tcp_off_loopback_without_insecure_plain_exits_1() {
    let port = free_port().to_string();
    let output = Command::new(SERVER)
        .args(["-H", "0.0.0.0", "-p", &port])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to serve plain TCP on 0.0.0.0"),
        "{stderr}"
    );
}

#[test]
fn unreadable_tls_files_exit_1_naming_the_file() {
    let port = free_port().to_string();
    let output = Command::new(SERVER)
        .args(["-p", &port, "--tls-cert", "/nonexistent/server.crt"])
        .args(["--tls-key", "/nonexistent/server.key"])
        .args(["--tls-client-ca", "/nonexistent/ca.crt"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot set up TLS"), "{stderr}");
    assert!(stderr.contains("/nonexistent/"), "{stderr}");
}

#[test]
fn an_unknown_device_lists_the_devices_and_exits_1() {
    let output = Command::new(SERVER).args(["-d", "CUDA0"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown device: CUDA0"), "{stderr}");
    assert!(stderr.contains("  CPU"), "{stderr}");
    assert!(stderr.contains("No devices found"), "{stderr}");
}

#[test]
fn bad_flags_are_refused() {
    for args in [
        &["-H", "localhost"][..],
        &["-p", "0"],
        &["-t", "0"],
        &["--shell", "nope"],
    ] {
        let output = Command::new(SERVER).args(args).output().unwrap();
        assert!(!output.status.success(), "{args:?}");
    }
}

/// The congestion control of the server's side of the connection from local port `client`
/// (as `ss` shows it: the algorithm's name opens the detail line).
fn server_side_congestion(server: u16, client: u16) -> String {
    let filter = format!("( sport = :{server} and dport = :{client} )");
    let output = Command::new("ss")
        .args(["-Htin", "state", "established", &filter])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let details = text
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("one socket: {text}"));
    details
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn same_host_clients_get_congestion_control_without_pacing_on_every_shell() {
    let system = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .unwrap()
        .trim()
        .to_owned();
    for shell in SHELLS {
        for keep in [false, true] {
            let port = free_port();
            let port_arg = port.to_string();
            let mut args = vec!["-p", &port_arg, "--shell", shell];
            if keep {
                args.push("--system-congestion-control");
            }
            let (child, _) = start(&args);
            let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let client = stream.local_addr().unwrap().port();
            // The server tunes the socket right after accepting it.
            let deadline = std::time::Instant::now() + DEADLINE;
            let mut seen = String::new();
            while std::time::Instant::now() < deadline {
                seen = server_side_congestion(port, client);
                if !seen.is_empty() && (keep || seen != system || system == "cubic") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(stream);
            terminate(child, "-TERM");
            if keep {
                assert_eq!(seen, system, "{shell} with --system-congestion-control");
            } else {
                assert!(
                    seen == "cubic" || seen == "reno",
                    "{shell}: the server's side runs {seen}"
                );
            }
        }
    }
}
