//! Shared harness of the interop tests against the real llama.cpp peers.
//!
//! Included by every `tests/tests/interop_*.rs` with `#[path = "../interop/harness.rs"]`.
//! Everything here has a timeout: no wait can hang a test.
//!
//! * locating the peers ([`b11434`], [`b11739`], [`b12032`]): a missing peer is a test **failure** with the
//!   script to run, never a skip;
//! * child processes with a kill-on-drop guard ([`Proc`]) and readiness polling ([`wait_port`]);
//! * our server in-process ([`OurServer`]) or as the built binary ([`our_server_binary`]);
//! * the C check program ([`c_check_program`]) and the chroot Python check ([`run_py_check`]);
//! * a recording TCP proxy ([`Recorder`]) and the parser that checks a captured conversation
//!   with `proto_core` ([`check_conversation`]).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto_core::wire::{
    Command as Cmd, Dialect, ProtocolVersion, Request, Response, REQUEST_HEADER_SIZE,
    RESPONSE_HEADER_SIZE,
};

/// How long a server may take to start listening.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Logging

/// Installs a tracing subscriber (once) so that our server's log lines (why it closed a
/// connection, ...) appear in the output of a failing test. `RUST_LOG` overrides the level.
pub fn init_logging() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

// ---------------------------------------------------------------------------------------------
// Peers

/// The peer cache root (`$GGML_RPC_PEER_CACHE`, default `/var/cache/ggml-rpc-peer`).
pub fn peer_cache() -> PathBuf {
    std::env::var_os("GGML_RPC_PEER_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/ggml-rpc-peer"))
}

/// llama.cpp b11434 (protocol 7.0.0), built from source by `scripts/peer/build-b11434.sh`.
#[derive(Debug, Clone)]
pub struct B11434 {
    /// `$ROOT/b11434`.
    pub dir: PathBuf,
    /// Its `bin/`.
    pub bin: PathBuf,
    /// Its `lib/`.
    pub lib: PathBuf,
    /// Its `include/`.
    pub include: PathBuf,
    /// Its `src/` (the whole source tree).
    pub src: PathBuf,
}

impl B11434 {
    /// `bin/ggml-rpc-server`.
    pub fn rpc_server(&self) -> PathBuf {
        self.bin.join("ggml-rpc-server")
    }
    /// `bin/test-rpc-multi-server`.
    pub fn multi_server_client(&self) -> PathBuf {
        self.bin.join("test-rpc-multi-server")
    }
    /// `src/tests/test-rpc-multi-server.sh`.
    pub fn multi_server_script(&self) -> PathBuf {
        self.src.join("tests/test-rpc-multi-server.sh")
    }
}

/// llama.cpp b11739 (protocol 8.0.0): prebuilt libraries in a Debian 13 chroot, set up by
/// `scripts/peer/setup-b11739.sh`.
#[derive(Debug, Clone)]
pub struct B11739 {
    /// `$ROOT/b11739`.
    pub dir: PathBuf,
    /// The chroot.
    pub chroot: PathBuf,
    /// The host launcher of the server (`$ROOT/b11739/rpc-server`).
    pub launcher: PathBuf,
}

/// llama.cpp b12032+1 (protocol 8.0.1, with the multi-rank `COMM_INIT` change and RDMA
/// compiled in), built from source by `scripts/peer/build-b12032.sh`. No `test-backend-ops`.
#[derive(Debug, Clone)]
pub struct B12032 {
    /// `$ROOT/b12032`.
    pub dir: PathBuf,
    /// Its `bin/` (`ggml-rpc-server`, `llama-bench`, `llama-completion`).
    pub bin: PathBuf,
}

impl B12032 {
    /// `bin/ggml-rpc-server`.
    pub fn rpc_server(&self) -> PathBuf {
        self.bin.join("ggml-rpc-server")
    }
}

fn require(what: &str, script: &str, paths: &[&Path]) {
    let missing: Vec<String> = paths
        .iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "the real llama.cpp peer {what} is missing ({}): run {script} (as root; it installs \
         into $GGML_RPC_PEER_CACHE, default /var/cache/ggml-rpc-peer; see scripts/peer/README.md)",
        missing.join(", ")
    );
}

/// Locates b11434, failing the test with the script to run if it is not installed.
pub fn b11434() -> B11434 {
    let dir = peer_cache().join("b11434");
    let peer = B11434 {
        bin: dir.join("bin"),
        lib: dir.join("lib"),
        include: dir.join("include"),
        src: dir.join("src"),
        dir,
    };
    require(
        "b11434 (protocol 7)",
        "scripts/peer/build-b11434.sh",
        &[
            &peer.dir.join(".complete"),
            &peer.rpc_server(),
            &peer.multi_server_client(),
            &peer.multi_server_script(),
            &peer.include.join("ggml-rpc.h"),
            &peer.src.join("ggml/src/ggml-impl.h"),
            &peer.lib.join("libggml-rpc.so"),
        ],
    );
    peer
}

/// Locates b11739, failing the test with the script to run if it is not installed.
pub fn b11739() -> B11739 {
    let dir = peer_cache().join("b11739");
    let peer = B11739 {
        chroot: dir.join("chroot"),
        launcher: dir.join("rpc-server"),
        dir,
    };
    require(
        "b11739 (protocol 8)",
        "scripts/peer/setup-b11739.sh",
        &[
            &peer.dir.join(".complete"),
            &peer.launcher,
            &peer.chroot.join("usr/bin/python3"),
            &peer.chroot.join("opt/llama/lib/libggml-rpc.so.0"),
            &peer.chroot.join("opt/llama/rpc_server.py"),
        ],
    );
    // chroot(2) needs root (the launcher and the Python check both chroot).
    use std::os::unix::fs::MetadataExt as _;
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0);
    assert!(
        uid == 0,
        "the llama.cpp b11739 peer (protocol 8) runs in a chroot: run the interop tests as root"
    );
    peer
}

/// Locates b12032, failing the test with the script to run if it is not installed.
pub fn b12032() -> B12032 {
    let dir = peer_cache().join("b12032");
    let peer = B12032 {
        bin: dir.join("bin"),
        dir,
    };
    require(
        "b12032+1 (protocol 8.0.1)",
        "scripts/peer/build-b12032.sh",
        &[&peer.dir.join(".complete"), &peer.rpc_server()],
    );
    peer
}

/// `tests/interop/` (the C and Python sources).
pub fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("interop")
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The cargo target profile directory this test binary was built into (`target/debug`).
pub fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// A private scratch folder below the target directory (kept between runs, never in /tmp).
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = target_profile_dir().join("interop").join(name);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A child process that is killed (and reaped) when dropped. Its stdout and stderr go to a log
/// file, shown by [`Proc::log`].
pub struct Proc {
    /// A name for messages.
    pub name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Spawns `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, command: &mut Command, log: &Path) -> Proc {
        let out = std::fs::File::create(log).expect("create log file");
        let err = out.try_clone().expect("clone log handle");
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({command:?}): {e}"));
        Proc {
            name: name.to_owned(),
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Everything it wrote so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Panics (with the log) if the process has exited.
    pub fn assert_alive(&mut self, context: &str) {
        if let Some(status) = self.exited() {
            panic!(
                "{} exited ({status}) {context}; its log:\n{}",
                self.name,
                self.log()
            );
        }
    }

    /// Kills it and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago (bind port 0, read it, release it).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

/// Polls a TCP connect until it succeeds; fails if `proc` exits first or after `timeout`.
pub fn wait_port(addr: SocketAddr, proc: &mut Proc, timeout: Duration) {
    if let Err(e) = try_wait_port(addr, proc, timeout) {
        panic!("{e}");
    }
}

/// Like [`wait_port`], returning the failure instead of panicking.
pub fn try_wait_port(addr: SocketAddr, proc: &mut Proc, timeout: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(status) = proc.exited() {
            return Err(format!(
                "{} exited ({status}) before listening on {addr}; its log:\n{}",
                proc.name,
                proc.log()
            ));
        }
        if start.elapsed() > timeout {
            return Err(format!(
                "{} did not listen on {addr} within {timeout:?}; its log:\n{}",
                proc.name,
                proc.log()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts a server on a free port, retrying with another port (3 tries) when the process
/// exits before listening (another process took the port between our probe and its bind).
fn start_on_free_port(
    name: &str,
    logs: &Path,
    log_prefix: &str,
    mut command: impl FnMut(u16) -> Command,
) -> (Proc, SocketAddr) {
    let mut errors = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut proc = Proc::spawn(
            name,
            &mut command(port),
            &logs.join(format!("{log_prefix}-{port}.log")),
        );
        match try_wait_port(addr, &mut proc, START_TIMEOUT) {
            Ok(()) => return (proc, addr),
            Err(e) if proc.exited().is_some() => errors.push(e),
            Err(e) => panic!("{e}"),
        }
    }
    panic!("{name} could not be started:\n{}", errors.join("\n"));
}

/// Runs a command to completion with a deadline, returning (status, stdout + stderr). On
/// timeout the whole process group is killed and the test fails.
pub fn run_with_timeout(
    name: &str,
    command: &mut Command,
    timeout: Duration,
) -> (ExitStatus, String) {
    use std::os::unix::process::CommandExt as _;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name} ({command:?}): {e}"));
    let pgid = child.id();
    let output = Arc::new(Mutex::new(String::new()));
    let pumps: Vec<JoinHandle<()>> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut stream| {
        let output = output.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                output
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    })
    .collect();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if start.elapsed() > timeout {
            // The whole group: scripts start servers in the background.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .status();
            let _ = child.wait();
            for pump in pumps {
                let _ = pump.join();
            }
            panic!(
                "{name} did not finish within {timeout:?}; its output:\n{}",
                output.lock().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Background children that kept the pipes open must not block us forever.
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
    for pump in pumps {
        let _ = pump.join();
    }
    let text = output.lock().unwrap().clone();
    (status, text)
}

// ---------------------------------------------------------------------------------------------
// Reference servers

/// Starts b11434's `ggml-rpc-server` (protocol 7) as [`start_llama_server`] does.
pub fn start_b11434_server(
    peer: &B11434,
    logs: &Path,
    cache_root: Option<&Path>,
) -> (Proc, SocketAddr) {
    start_llama_server(&peer.rpc_server(), "b11434", logs, cache_root)
}

/// Starts b12032's `ggml-rpc-server` (protocol 8.0.1, RDMA compiled in) as
/// [`start_llama_server`] does.
pub fn start_b12032_server(
    peer: &B12032,
    logs: &Path,
    cache_root: Option<&Path>,
) -> (Proc, SocketAddr) {
    start_llama_server(&peer.rpc_server(), "b12032", logs, cache_root)
}

/// Starts a llama.cpp `ggml-rpc-server -d CPU -t 2` built from source (`build` names it in
/// messages and logs) on a free port, with `-c` and `LLAMA_CACHE` when a cache root is given,
/// and waits until it listens. `GGML_RPC_NO_RDMA=1` keeps a build with RDMA on plain TCP, even
/// on a host that has RDMA: the interop runs over TCP.
fn start_llama_server(
    binary: &Path,
    build: &str,
    logs: &Path,
    cache_root: Option<&Path>,
) -> (Proc, SocketAddr) {
    start_on_free_port(
        &format!("llama.cpp {build} ggml-rpc-server"),
        logs,
        &format!("{build}-server"),
        |port| {
            let mut command = Command::new(binary);
            command.args([
                "-d",
                "CPU",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-t",
                "2",
            ]);
            command.env("GGML_RPC_NO_RDMA", "1");
            if let Some(root) = cache_root {
                command.arg("-c").env("LLAMA_CACHE", root);
            }
            command
        },
    )
}

/// Starts b11739's server (protocol 8) in its chroot on a free port and waits until it
/// listens. `cache_in_chroot` is a path inside the chroot.
pub fn start_b11739_server(
    peer: &B11739,
    logs: &Path,
    cache_in_chroot: Option<&str>,
) -> (Proc, SocketAddr) {
    start_on_free_port(
        "llama.cpp b11739 rpc server (chroot)",
        logs,
        "b11739-server",
        |port| {
            let mut command = Command::new(&peer.launcher);
            command.args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--threads",
                "2",
                "--device",
                "CPU",
            ]);
            if let Some(dir) = cache_in_chroot {
                command.args(["--cache", dir]);
            }
            command
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Our server

/// Our server (a `CpuBackend` behind one of our shells) on 127.0.0.1:0, in this process, on
/// the shell's own threads. Dropping it shuts it down.
pub struct OurServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its backend (to check that buffers are given back).
    pub backend: Arc<backend_cpu::CpuBackend>,
    /// The shell serving it.
    pub shell: &'static str,
    server: Option<ggml_rpc_server::shells::RunningServer>,
}

/// Every shell of this build: the interop tests against llama.cpp run once per shell, since a
/// behaviour difference between shells is a bug.
pub fn shells() -> Vec<&'static str> {
    ggml_rpc_server::shells::names()
}

impl OurServer {
    /// Starts a server speaking `version` (7.0.0 or 8.0.0) on the default shell, optionally
    /// with a tensor cache directory.
    pub fn start(version: ProtocolVersion, cache_dir: Option<&Path>) -> OurServer {
        OurServer::start_on(ggml_rpc_server::shells::DEFAULT_SHELL, version, cache_dir)
    }

    /// Starts a server on the shell called `shell`.
    pub fn start_on(shell: &str, version: ProtocolVersion, cache_dir: Option<&Path>) -> OurServer {
        let mut config = shell_tokio::ServerConfig::new(version);
        if let Some(dir) = cache_dir {
            let cache = shell_tokio::FsTensorCache::open(dir).expect("open tensor cache");
            config.tensor_cache = Some(Arc::new(cache));
        }
        OurServer::start_with(shell, config)
    }

    /// Starts a server on the shell called `shell` with `config`.
    pub fn start_with(shell: &str, config: shell_tokio::ServerConfig) -> OurServer {
        init_logging();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("local_addr");
        let backend = Arc::new(backend_cpu::CpuBackend::new(backend_cpu::CpuConfig {
            threads: 2,
            ..backend_cpu::CpuConfig::default()
        }));
        let served = backend.clone() as Arc<dyn proto_core::backend::Backend>;
        let server = ggml_rpc_server::shells::start(shell, listener, served, config)
            .unwrap_or_else(|error| panic!("starting our server on the {shell} shell: {error:#}"));
        OurServer {
            addr,
            backend,
            shell: server.shell(),
            server: Some(server),
        }
    }

    /// `host:port` for llama.cpp's endpoint syntax.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Waits (bounded) until every buffer has been given back (clients gone).
    pub fn wait_no_buffers(&self, timeout: Duration) {
        let start = Instant::now();
        while self.backend.live_buffers() != 0 {
            assert!(
                start.elapsed() < timeout,
                "our server ({} shell) still holds {} buffers ({} bytes) after the clients left",
                self.shell,
                self.backend.live_buffers(),
                self.backend.used_bytes()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for OurServer {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            if let Err(error) = server.shutdown() {
                eprintln!("our server ({} shell) failed: {error:#}", self.shell);
            }
        }
    }
}

/// Builds (debug, same target directory) and returns our `ggml-rpc-server` binary, for the
/// places where llama.cpp's script needs a command. Built once per test process.
pub fn our_server_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_target("ggml-rpc-server", "--bin", "ggml-rpc-server"))
        .clone()
}

/// Builds (debug, same target directory) and returns proto-core's `blocking_server` example,
/// the canonical loop around the connection driver. Built once per test process.
pub fn blocking_server_example() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_target("proto-core", "--example", "blocking_server"))
        .clone()
}

/// `cargo build -p PACKAGE KIND NAME` in this test binary's profile and target directory;
/// returns the executable.
fn build_target(package: &str, kind: &str, name: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace_root())
        .args(["build", "-p", package, kind, name]);
    // The profile this test binary was built with (target/<profile>/deps/...).
    match target_profile_dir().file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            command.arg("--release");
        }
        Some(other) => {
            command.args(["--profile", other]);
        }
    }
    // Same target directory as this test binary (also when CARGO_TARGET_DIR is unset).
    let target_dir = target_profile_dir()
        .parent()
        .expect("target dir")
        .to_path_buf();
    command.env("CARGO_TARGET_DIR", &target_dir);
    let what = format!("cargo build -p {package} {kind} {name}");
    let (status, output) = run_with_timeout(&what, &mut command, Duration::from_secs(900));
    assert!(status.success(), "{what} failed:\n{output}");
    let bin = match kind {
        "--example" => target_profile_dir().join("examples").join(name),
        _ => target_profile_dir().join(name),
    };
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// Starts `program ARGS... 127.0.0.1:PORT ...` (the address given by `args(port)`) on a free
/// port and waits until it listens.
pub fn start_program(
    name: &str,
    program: &Path,
    logs: &Path,
    args: impl Fn(u16) -> Vec<String>,
) -> (Proc, SocketAddr) {
    start_on_free_port(name, logs, name, |port| {
        let mut command = Command::new(program);
        command.args(args(port));
        command
    })
}

// ---------------------------------------------------------------------------------------------
// The C and Python check programs

/// Compiles `tests/interop/rpc_client_check.c` against b11434 (once per test process) and
/// returns the executable.
pub fn c_check_program(peer: &B11434) -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = scratch_dir("c");
        // Built under a private name, then renamed over the shared one (atomic, so a
        // concurrent test process never runs a half-written file and nothing accumulates).
        let exe = dir.join("rpc_client_check");
        let fresh = dir.join(format!(".rpc_client_check-{}", std::process::id()));
        let source = interop_dir().join("rpc_client_check.c");
        let mut command = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()));
        command
            .arg("-std=c11")
            .arg("-O1")
            .arg("-g")
            .arg("-Wall")
            .arg("-Wextra")
            .arg("-Werror")
            .arg("-Wno-unused-function")
            .arg(&source)
            .arg("-I")
            .arg(&peer.include)
            .arg("-I")
            .arg(peer.src.join("ggml/src"))
            .arg("-L")
            .arg(&peer.lib)
            .args(["-lggml", "-lggml-rpc", "-lggml-cpu", "-lggml-base", "-lm"])
            .arg(format!("-Wl,-rpath,{}", peer.lib.display()))
            .arg("-o")
            .arg(&fresh);
        let (status, output) = run_with_timeout(
            "cc rpc_client_check.c",
            &mut command,
            Duration::from_secs(120),
        );
        assert!(
            status.success(),
            "compiling {} failed:\n{output}",
            source.display()
        );
        std::fs::rename(&fresh, &exe).expect("rename the compiled check program");
        exe
    })
    .clone()
}

/// Runs the C check program with `args`, returning (status, output).
pub fn run_c(peer: &B11434, args: &[&str]) -> (ExitStatus, String) {
    let exe = c_check_program(peer);
    let mut command = Command::new(exe);
    command.args(args).env("GGML_RPC_NO_RDMA", "1");
    run_with_timeout("rpc_client_check", &mut command, Duration::from_secs(120))
}

/// Runs the C check against `endpoint`; panics with its output unless it succeeds.
pub fn run_c_check(peer: &B11434, endpoint: &str, extra: &[&str], what: &str) -> String {
    let args: Vec<&str> = std::iter::once(endpoint)
        .chain(extra.iter().copied())
        .collect();
    let (status, output) = run_c(peer, &args);
    assert!(
        status.success(),
        "rpc_client_check against {what} ({endpoint}) failed ({status}):\n{output}"
    );
    assert!(
        output.contains("rpc_client_check: OK"),
        "no OK line:\n{output}"
    );
    output
}

/// Copies `tests/interop/rpc_client_check.py` into the b11739 chroot and runs it there with
/// the chroot's python3 and `args` (the chroot shares the network namespace, so 127.0.0.1
/// reaches servers on the host). Returns (status, output).
pub fn run_py(peer: &B11739, args: &[&str]) -> (ExitStatus, String) {
    let inside = format!("/opt/interop-{}-{}", std::process::id(), unique());
    let host_dir = peer.chroot.join(inside.trim_start_matches('/'));
    std::fs::create_dir_all(&host_dir).expect("create dir in the chroot");
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(host_dir.clone());
    std::fs::copy(
        interop_dir().join("rpc_client_check.py"),
        host_dir.join("rpc_client_check.py"),
    )
    .expect("copy the Python check into the chroot");
    let mut command = Command::new("chroot");
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LANG", "C.UTF-8")
        .env("HOME", "/root")
        .env("GGML_RPC_NO_RDMA", "1")
        .arg(&peer.chroot)
        .arg("/usr/bin/python3")
        .arg(format!("{inside}/rpc_client_check.py"))
        .args(args);
    run_with_timeout(
        "chroot python3 rpc_client_check.py",
        &mut command,
        Duration::from_secs(120),
    )
}

/// Runs the Python check (b11739's client, in the chroot) against `endpoint`; panics with its
/// output unless it succeeds.
pub fn run_py_check(peer: &B11739, endpoint: &str, extra: &[&str], what: &str) -> String {
    let args: Vec<&str> = std::iter::once(endpoint)
        .chain(extra.iter().copied())
        .collect();
    let (status, output) = run_py(peer, &args);
    assert!(
        status.success(),
        "rpc_client_check.py (b11739 client, in the chroot) against {what} ({endpoint}) \
         failed ({status}):\n{output}"
    );
    assert!(
        output.contains("rpc_client_check.py: OK"),
        "no OK line:\n{output}"
    );
    output
}

/// A process-unique counter.
pub fn unique() -> u64 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// Data

/// `len` bytes that differ at every position and between seeds, fast even in debug builds: a
/// 64 KiB pseudo-random block (xorshift) repeated, each repetition stamped with its index and
/// the seed, so that shifted, swapped or repeated blocks are detected.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    const BLOCK: usize = 64 * 1024;
    let mut block = vec![0u8; BLOCK];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in block.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    let mut out = Vec::with_capacity(len);
    let mut index = 0u64;
    while out.len() < len {
        let take = BLOCK.min(len - out.len());
        let start = out.len();
        out.extend_from_slice(&block[..take]);
        let stamp = (index ^ seed.rotate_left(32)).to_le_bytes();
        let n = stamp.len().min(take);
        out[start..start + n].copy_from_slice(&stamp[..n]);
        index += 1;
    }
    out
}

/// Where two byte strings first differ, for messages.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Asserts byte equality with a short message (never prints megabytes).
#[track_caller]
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = first_difference(got, want).unwrap_or(0);
        let show = |s: &[u8]| {
            let end = (at + 16).min(s.len());
            hex(&s[at.min(s.len())..end])
        };
        panic!(
            "{what}: data differs (got {} bytes, want {}); first difference at byte {at}: \
             got {} want {}",
            got.len(),
            want.len(),
            show(got),
            show(want)
        );
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Recording proxy

/// Both byte streams of one proxied TCP connection.
#[derive(Debug, Default)]
pub struct Conversation {
    /// What the client sent.
    pub client_to_server: Bytes,
    /// What the server answered.
    pub server_to_client: Bytes,
}

struct Connection {
    c2s: Arc<Mutex<Vec<u8>>>,
    s2c: Arc<Mutex<Vec<u8>>>,
    pumps: Vec<JoinHandle<()>>,
}

/// A TCP proxy on 127.0.0.1 that forwards every connection to `target` and records both
/// directions byte for byte.
pub struct Recorder {
    /// Where clients connect.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<Connection>>>,
}

fn pump(mut from: TcpStream, mut to: TcpStream, record: Arc<Mutex<Vec<u8>>>) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                record.lock().unwrap().extend_from_slice(&buf[..n]);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl Recorder {
    /// Starts a proxy to `target`.
    pub fn start(target: SocketAddr) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("local_addr");
        let stop = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<Vec<Connection>>> = Arc::default();
        let accept = {
            let stop = stop.clone();
            let connections = connections.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            client.set_nonblocking(false).expect("blocking");
                            let server = match TcpStream::connect_timeout(
                                &target,
                                Duration::from_secs(10),
                            ) {
                                Ok(server) => server,
                                Err(_) => continue, // the client sees EOF
                            };
                            let _ = client.set_nodelay(true);
                            let _ = server.set_nodelay(true);
                            let c2s: Arc<Mutex<Vec<u8>>> = Arc::default();
                            let s2c: Arc<Mutex<Vec<u8>>> = Arc::default();
                            let (c1, s1) =
                                (client.try_clone().unwrap(), server.try_clone().unwrap());
                            let record = c2s.clone();
                            let up = std::thread::spawn(move || pump(c1, s1, record));
                            let record = s2c.clone();
                            let down = std::thread::spawn(move || pump(server, client, record));
                            connections.lock().unwrap().push(Connection {
                                c2s,
                                s2c,
                                pumps: vec![up, down],
                            });
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Recorder {
            addr,
            stop,
            accept: Some(accept),
            connections,
        }
    }

    /// `host:port` for llama.cpp's endpoint syntax.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// Stops accepting, waits (bounded) until every proxied connection has closed in both
    /// directions, and returns the recorded conversations in connection order.
    pub fn finish(mut self, timeout: Duration) -> Vec<Conversation> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let connections = std::mem::take(&mut *self.connections.lock().unwrap());
        let start = Instant::now();
        let mut out = Vec::new();
        for connection in connections {
            for pump in connection.pumps {
                while !pump.is_finished() {
                    assert!(
                        start.elapsed() < timeout,
                        "a proxied connection did not close within {timeout:?}"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = pump.join();
            }
            out.push(Conversation {
                client_to_server: Bytes::from(std::mem::take(&mut *connection.c2s.lock().unwrap())),
                server_to_client: Bytes::from(std::mem::take(&mut *connection.s2c.lock().unwrap())),
            });
        }
        out
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------------
// Checking a captured conversation with proto_core

/// One request seen on the wire, with what it implied.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// Its command.
    pub command: Cmd,
    /// The decoded request (bulk data included).
    pub request: Request,
    /// Frame length in bytes.
    pub frame_len: usize,
}

/// What a conversation contained.
#[derive(Debug, Default, Clone)]
pub struct ConversationSummary {
    /// Every request in order.
    pub requests: Vec<SeenRequest>,
    /// Every response in order, with its command.
    pub responses: Vec<(Cmd, Response)>,
}

impl ConversationSummary {
    /// Request counts per command name.
    pub fn request_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for seen in &self.requests {
            *counts.entry(command_name(seen.command)).or_insert(0) += 1;
        }
        counts
    }

    /// Whether a request of `command` was seen.
    pub fn saw(&self, command: Cmd) -> bool {
        self.requests.iter().any(|r| r.command == command)
    }
}

/// The protocol name of a command (as the vectors spell it).
pub fn command_name(command: Cmd) -> &'static str {
    ggml_rpc_tests::fields::command_name(command)
}

/// The response payload length a request implies, `None` for commands without a response.
fn expected_response_len(request: &Request) -> Result<Option<u64>, String> {
    let command = request.command();
    if !command.has_response() {
        return Ok(None);
    }
    Ok(Some(match request {
        Request::GetTensor { size, .. } => *size,
        Request::GetTensor2d(header) => header.data_len(command).map_err(|e| e.to_string())?,
        _ => command
            .fixed_response_size()
            .ok_or_else(|| format!("{command:?} has no fixed response size"))?,
    }))
}

/// Parses a recorded conversation with proto_core: every client frame must decode with
/// `Request::from_frame` and re-encode byte for byte with `Request::to_frame`; every server
/// frame must have the size its request implies, decode with `Response::decode` and re-encode
/// byte for byte with `Response::to_frame`. Nothing is skipped: both streams must be consumed
/// exactly, and the first request must be HELLO.
pub fn check_conversation(
    dialect: Dialect,
    conversation: &Conversation,
) -> Result<ConversationSummary, String> {
    let c2s = conversation.client_to_server.clone();
    let s2c = conversation.server_to_client.clone();
    let mut summary = ConversationSummary::default();
    let mut pending: Vec<(usize, Cmd, u64)> = Vec::new();
    let mut at = 0usize;
    while at < c2s.len() {
        let index = summary.requests.len();
        if c2s.len() - at < REQUEST_HEADER_SIZE {
            return Err(format!(
                "request #{index} at byte {at}: stream ends inside a frame header ({} bytes left)",
                c2s.len() - at
            ));
        }
        let id = c2s[at];
        let size = u64::from_le_bytes(c2s[at + 1..at + 9].try_into().unwrap());
        let command = Cmd::from_id(id, dialect).ok_or_else(|| {
            format!("request #{index} at byte {at}: command id {id} is unknown to {dialect:?}")
        })?;
        let end = (at + REQUEST_HEADER_SIZE)
            .checked_add(usize::try_from(size).map_err(|_| "size overflow".to_string())?)
            .filter(|&end| end <= c2s.len())
            .ok_or_else(|| {
                format!(
                    "request #{index} ({}) at byte {at}: declares {size} payload bytes, \
                     only {} recorded",
                    command_name(command),
                    c2s.len() - at - REQUEST_HEADER_SIZE
                )
            })?;
        if index == 0 && command != Cmd::Hello {
            return Err(format!(
                "the first request is {}, not HELLO",
                command_name(command)
            ));
        }
        let frame = c2s.slice(at..end);
        let request = Request::from_frame(dialect, frame.clone()).map_err(|e| {
            format!(
                "request #{index} ({}, {} bytes) at byte {at} does not decode: {e}; head {}",
                command_name(command),
                frame.len(),
                hex(&frame[..frame.len().min(48)])
            )
        })?;
        let again = request.to_frame(dialect).map_err(|e| {
            format!(
                "request #{index} ({}) does not re-encode: {e}",
                command_name(command)
            )
        })?;
        if again != frame {
            let diff = first_difference(&again, &frame).unwrap_or(0);
            return Err(format!(
                "request #{index} ({}, {} bytes) re-encodes differently: first difference at \
                 byte {diff} (ours {} theirs {})",
                command_name(command),
                frame.len(),
                hex(&again[diff.min(again.len())..(diff + 16).min(again.len())]),
                hex(&frame[diff.min(frame.len())..(diff + 16).min(frame.len())]),
            ));
        }
        if let Some(len) = expected_response_len(&request)? {
            pending.push((index, command, len));
        }
        summary.requests.push(SeenRequest {
            command,
            request,
            frame_len: frame.len(),
        });
        at = end;
    }
    let mut at = 0usize;
    for (index, command, expected) in pending {
        let name = command_name(command);
        if s2c.len() - at < RESPONSE_HEADER_SIZE {
            return Err(format!(
                "response to request #{index} ({name}) missing: the server stream ends at byte {at}"
            ));
        }
        let size = u64::from_le_bytes(s2c[at..at + 8].try_into().unwrap());
        if size != expected {
            return Err(format!(
                "response to request #{index} ({name}) at byte {at} has size {size}, the \
                 request implies {expected}"
            ));
        }
        let end = at + RESPONSE_HEADER_SIZE + size as usize;
        if end > s2c.len() {
            return Err(format!(
                "response to request #{index} ({name}) is truncated"
            ));
        }
        let frame = s2c.slice(at..end);
        let response = Response::decode(command, expected, frame.slice(RESPONSE_HEADER_SIZE..))
            .map_err(|e| format!("response to request #{index} ({name}) does not decode: {e}"))?;
        let again = response.to_frame();
        if again != frame {
            let diff = first_difference(&again, &frame).unwrap_or(0);
            return Err(format!(
                "response to request #{index} ({name}) re-encodes differently at byte {diff}"
            ));
        }
        summary.responses.push((command, response));
        at = end;
    }
    if at != s2c.len() {
        return Err(format!(
            "the server sent {} bytes after the last expected response: {}",
            s2c.len() - at,
            hex(&s2c[at..(at + 64).min(s2c.len())])
        ));
    }
    Ok(summary)
}

/// The (direction, command) pairs the colleague's vectors cover for a protocol, read from
/// `tests/vectors/` (`None` when that folder does not exist).
pub fn vector_coverage(protocol: &str) -> Option<(Vec<String>, Vec<String>)> {
    let dir = ggml_rpc_tests::vectors_dir();
    if !dir.exists() {
        return None;
    }
    let vectors =
        ggml_rpc_tests::load_all(&dir).unwrap_or_else(|e| panic!("loading the vectors: {e}"));
    let mut requests = Vec::new();
    let mut responses = Vec::new();
    for v in vectors {
        if v.protocol != protocol || !v.valid || v.level != ggml_rpc_tests::vector::Level::Frame {
            continue;
        }
        let Some(command) = v.command.clone() else {
            continue;
        };
        match v.direction {
            ggml_rpc_tests::vector::Direction::ClientToServer => requests.push(command),
            ggml_rpc_tests::vector::Direction::ServerToClient => responses.push(command),
        }
    }
    Some((requests, responses))
}

/// Fails unless every command captured in `summary` has a valid frame vector of the same
/// command (request and, where one was seen, response) for `protocol`.
pub fn assert_vectors_cover(protocol: &str, summary: &ConversationSummary, what: &str) {
    let Some((requests, responses)) = vector_coverage(protocol) else {
        return;
    };
    let mut missing = Vec::new();
    for seen in &summary.requests {
        let name = command_name(seen.command).to_owned();
        if !requests.contains(&name) {
            missing.push(format!("request {name}"));
        }
    }
    for (command, _) in &summary.responses {
        let name = command_name(*command).to_owned();
        if !responses.contains(&name) {
            missing.push(format!("response {name}"));
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "{what}: captured frames without a valid test vector of protocol {protocol} in \
         tests/vectors/: {}",
        missing.join(", ")
    );
}
