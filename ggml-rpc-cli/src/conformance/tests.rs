//! The case runner's classification: every case passes against our server in every shell;
//! deliberately broken fake servers are caught as refused, hung and died.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use proto_core::backend::MemoryBackend;
use proto_core::wire::ProtocolVersion;

use super::plan::{self, Case};
use super::socket::ServerFacts;
use super::*;

fn options(addr: SocketAddr, timeout_ms: u64) -> Options {
    Options {
        addr,
        version: None,
        timeout: Duration::from_millis(timeout_ms),
        only: None,
    }
}

fn run_all(options: &Options) -> (ProtocolVersion, Vec<CaseResult>) {
    let (version, _, results) =
        run(options, None, &mut |_, _| {}, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    (version, results)
}

#[test]
fn our_server_passes_every_case_in_every_shell_and_version() {
    for shell in ggml_rpc_server::shells::names() {
        for version in [
            ProtocolVersion::V7_0_0,
            ProtocolVersion::V8_0_0,
            ProtocolVersion::V8_0_1,
        ] {
            // The vectors' device model: 1 GiB devices, alignment 32.
            let backend = Arc::new(MemoryBackend::new(1, 1 << 30));
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let server = ggml_rpc_server::start(
                shell,
                listener,
                backend,
                ggml_rpc_server::ServerConfig::new(version),
            )
            .unwrap();
            let (checked, results) = run_all(&options(server.local_addr(), 5000));
            assert_eq!(checked, version, "{shell}");
            let failed: Vec<_> = results.iter().filter(|r| !r.acceptable(true)).collect();
            assert!(failed.is_empty(), "{shell} {version}: {failed:#?}");
            let passed = results
                .iter()
                .filter(|r| r.outcome == Outcome::Passed)
                .count();
            // Not applicable: only the cases needing another server configuration.
            assert!(
                passed + 10 >= results.len(),
                "{shell} {version}: {results:#?}"
            );
            assert!(results
                .iter()
                .any(|r| r.name == "hostile/abandoned_set_tensor" && r.outcome == Outcome::Passed));
            server.shutdown().unwrap();
        }
    }
}

#[test]
fn a_two_device_server_runs_the_lifecycle_sessions_byte_for_byte() {
    let backend = Arc::new(MemoryBackend::new(2, 1 << 30));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ggml_rpc_server::ServerConfig::new(ProtocolVersion::V8_0_0);
    let server = ggml_rpc_server::start("tokio", listener, backend, config).unwrap();
    let mut options = options(server.local_addr(), 5000);
    options.only = Some("lifecycle".into());
    let (_, results) = run_all(&options);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].outcome, Outcome::Passed, "{results:?}");
    // The memory backend has the vectors' device model: no device answer needed relaxing
    // (only HELLO's flags: ours offers the extension, bit 7).
    assert!(!results[0].detail.contains("GET_"), "{results:?}");
    server.shutdown().unwrap();
}

/// How a fake server misbehaves.
#[derive(Clone, Copy)]
enum Fake {
    /// HELLO (8.0.0) and DEVICE_COUNT (this many devices) answered, any HELLO accepted;
    /// every other command closes the connection.
    Answers(u32),
    /// Reads everything, answers nothing.
    Silent,
    /// As `Answers(1)`, for one connection; then the listener is gone.
    OneConnection,
    /// HELLO and DEVICE_COUNT answered; any other command closes the connection.
    ClosesOnOthers,
}

fn fake_server(kind: Fake) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || {
        let connections = match kind {
            Fake::OneConnection => 1,
            _ => usize::MAX,
        };
        for stream in listener.incoming().take(connections) {
            let Ok(stream) = stream else { return };
            let serve = move || match kind {
                Fake::Silent => drain(stream),
                Fake::Answers(devices) => answer(stream, devices, false),
                Fake::OneConnection => answer(stream, 1, false),
                Fake::ClosesOnOthers => answer(stream, 1, true),
            };
            if connections == 1 {
                serve();
            } else {
                std::thread::spawn(serve);
            }
        }
    });
    (addr, thread)
}

fn drain(mut stream: TcpStream) {
    let mut buf = [0u8; 4096];
    while matches!(stream.read(&mut buf), Ok(1..)) {}
}

fn answer(mut stream: TcpStream, devices: u32, close_on_others: bool) {
    loop {
        let mut header = [0u8; 9];
        if stream.read_exact(&mut header).is_err() {
            return;
        }
        let size = u64::from_le_bytes(header[1..].try_into().unwrap());
        let reply = match header[0] {
            14 | 15 => {
                let mut payload = vec![0u8; size.min(64) as usize];
                if size > 64 || stream.read_exact(&mut payload).is_err() {
                    return;
                }
                reply_to(header[0], devices)
            }
            _ if close_on_others => return,
            // Any other command: its payload swallowed, no answer (however long it claims to be).
            _ => {
                let mut left = size;
                let mut buf = [0u8; 4096];
                while left > 0 {
                    match stream.read(&mut buf[..left.min(4096) as usize]) {
                        Ok(1..) => {}
                        _ => return,
                    }
                    left -= left.min(4096);
                }
                continue;
            }
        };
        if stream.write_all(&reply).is_err() {
            return;
        }
    }
}

fn reply_to(command: u8, devices: u32) -> Vec<u8> {
    if command == 14 {
        let mut reply = 28u64.to_le_bytes().to_vec();
        reply.extend_from_slice(&[8, 0, 0, 0]);
        reply.extend_from_slice(&[0; 24]);
        return reply;
    }
    let mut reply = 4u64.to_le_bytes().to_vec();
    reply.extend_from_slice(&devices.to_le_bytes());
    reply
}

fn case(name: &str) -> Case {
    let facts = ServerFacts {
        version: (8, 0, 0),
        hello_flags: 0,
        devices: 1,
    };
    plan::cases(ProtocolVersion::V8_0_0, &facts, Some(name))
        .into_iter()
        .find(|case| case.name == name)
        .unwrap()
}

#[test]
fn a_wrong_answer_is_refused_and_the_server_lives_on() {
    let (addr, _thread) = fake_server(Fake::Answers(3));
    let result = run_case(
        &case("sessions/v8/hello_caps"),
        ProtocolVersion::V8_0_0,
        &options(addr, 2000),
    );
    assert_eq!(result.outcome, Outcome::Refused, "{result:?}");
    assert!(result.detail.contains("DEVICE_COUNT"), "{result:?}");
    assert!(!result.acceptable(false));
}

#[test]
fn an_accepted_invalid_frame_is_refused() {
    let (addr, _thread) = fake_server(Fake::Answers(1));
    let result = run_case(
        &case("invalid/session/v8/second_hello"),
        ProtocolVersion::V8_0_0,
        &options(addr, 2000),
    );
    assert_eq!(result.outcome, Outcome::Refused, "{result:?}");
    assert!(result.known_gap.is_empty());
    // The same server passes what it does implement.
    let fine = run_case(
        &case("sessions/v8/hello_caps"),
        ProtocolVersion::V8_0_0,
        &options(addr, 2000),
    );
    assert_eq!(fine.outcome, Outcome::Passed, "{fine:?}");
    assert!(fine.detail.contains("caps are the server's"), "{fine:?}");
}

#[test]
fn a_documented_gap_is_marked_but_fails_under_strict() {
    let (addr, _thread) = fake_server(Fake::Answers(1));
    // The fake swallows a GRAPH_COMPUTE that claims 2^62 bytes: no verdict, a G10 gap.
    let gap = run_case(
        &case("invalid/session/v8/graph_compute_too_large"),
        ProtocolVersion::V8_0_0,
        &options(addr, 300),
    );
    assert_eq!(gap.outcome, Outcome::Hung, "{gap:?}");
    assert_eq!(gap.known_gap, ["G10"]);
    assert!(gap.acceptable(false));
    assert!(!gap.acceptable(true));
    // A failure before the frame the gap is about (ALLOC_BUFFER unanswered) is no gap.
    let early = run_case(
        &case("invalid/session/v8/get_tensor_past_tensor_end"),
        ProtocolVersion::V8_0_0,
        &options(addr, 300),
    );
    assert_eq!(early.outcome, Outcome::Hung, "{early:?}");
    assert!(early.known_gap.is_empty(), "{early:?}");
}

#[test]
fn a_connection_closed_by_a_command_without_answer_is_charged_to_that_step() {
    use ggml_rpc_tests::check::SessionTarget as _;
    let hello = Request::Hello { caps: [0; 24] }
        .to_frame(Dialect::V8)
        .unwrap();
    let free = Request::FreeBuffer { buffer: 1 }
        .to_frame(Dialect::V8)
        .unwrap();
    for (kind, closes) in [(Fake::ClosesOnOthers, true), (Fake::Answers(1), false)] {
        let (addr, _thread) = fake_server(kind);
        let mut target = socket::SocketTarget::connect(addr, Duration::from_secs(2)).unwrap();
        assert_eq!(target.exchange(&hello, 36).unwrap().len(), 36);
        // FREE_BUFFER has no answer: the DEVICE_COUNT behind it tells whether it was taken.
        let step = target.exchange(&free, 0);
        assert_eq!(step.is_err(), closes, "{step:?}");
        if closes {
            assert!(step.unwrap_err().contains("after this step"));
        } else {
            assert_eq!(step.unwrap(), Vec::<u8>::new());
        }
    }
}

#[test]
fn a_server_that_never_answers_is_hung() {
    let (addr, _thread) = fake_server(Fake::Silent);
    let result = run_case(
        &case("sessions/v8/hello_caps"),
        ProtocolVersion::V8_0_0,
        &options(addr, 300),
    );
    assert_eq!(result.outcome, Outcome::Hung, "{result:?}");
    assert!(
        result.time < Duration::from_secs(5),
        "every wait is bounded: {result:?}"
    );
}

#[test]
fn a_server_gone_after_the_case_died() {
    let (addr, thread) = fake_server(Fake::OneConnection);
    let result = run_case(
        &case("sessions/v8/hello_caps"),
        ProtocolVersion::V8_0_0,
        &options(addr, 2000),
    );
    thread.join().unwrap();
    assert_eq!(result.outcome, Outcome::Died, "{result:?}");
    assert!(result.detail.contains("gone"), "{result:?}");
}

#[test]
fn no_server_at_all_is_an_error_not_a_table() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let error = run(&options(addr, 500), None, &mut |_, _| {}, &mut |_| {}).unwrap_err();
    assert!(matches!(error, ConformanceError::Probe { .. }), "{error}");
}
