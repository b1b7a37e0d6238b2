//! The transport hook: with `negotiate_transport`, HELLO is answered by the shell
//! (`Action::Upgrade` with the client's caps → `answer_hello`); without the hook the
//! dispatcher answers with its configured caps as before.

use std::sync::Arc;

use proto_core::backend::MemoryBackend;
use proto_core::dispatch::DispatcherConfig;
use proto_core::driver::{Action, Connection, Place, Receive};
use proto_core::session::{ClientEvent, ClientSession, ServerSessionConfig};
use proto_core::wire::{ConnCaps, ProtocolVersion};

fn connection(negotiate: bool) -> Connection<MemoryBackend> {
    let version = ProtocolVersion::V8_0_0;
    let mut dispatcher = DispatcherConfig::new(version);
    dispatcher.negotiate_transport = negotiate;
    let session = ServerSessionConfig::new(version.dialect().unwrap());
    Connection::new(
        Arc::new(MemoryBackend::new(1, 1 << 20)),
        &session,
        &dispatcher,
        false,
    )
    .unwrap()
}

/// Sends the client's HELLO; returns the first action after it.
fn hello(conn: &mut Connection<MemoryBackend>, client: &mut ClientSession) -> Action {
    while let Some(bytes) = client.poll_transmit() {
        conn.handle_input(bytes);
    }
    conn.poll(Place::Blocking).unwrap()
}

/// Delivers the server's answer; returns the caps the client saw.
fn answer(conn: &mut Connection<MemoryBackend>, client: &mut ClientSession) -> ConnCaps {
    assert!(matches!(
        conn.poll(Place::Blocking).unwrap(),
        Action::Transmit
    ));
    while let Some(bytes) = conn.poll_transmit() {
        client.handle_input(bytes);
    }
    assert!(matches!(
        conn.poll(Place::Blocking).unwrap(),
        Action::Receive(Receive::Idle)
    ));
    match client.poll_event().unwrap() {
        Some(ClientEvent::Connected(hello)) => hello.caps,
        other => panic!("expected the handshake, got {other:?}"),
    }
}

#[test]
fn offered_caps_are_answered_by_the_shell() {
    let mut conn = connection(true);
    let mut client = ClientSession::new(ProtocolVersion::V8_0_0, [3; 24]).unwrap();
    let Action::Upgrade(peer) = hello(&mut conn, &mut client) else {
        panic!("expected an upgrade")
    };
    assert_eq!(peer, [3; 24]);
    // Asked again until answered: nothing else runs before HELLO's answer.
    assert!(matches!(
        conn.poll(Place::Blocking).unwrap(),
        Action::Upgrade(_)
    ));
    conn.answer_hello([9; 24]).unwrap();
    assert_eq!(answer(&mut conn, &mut client), [9; 24]);
    assert!(conn.answer_hello([9; 24]).is_err(), "only one answer");
}

#[test]
fn zero_caps_go_to_the_shell_too() {
    let mut conn = connection(true);
    let mut client = ClientSession::new(ProtocolVersion::V8_0_0, [0; 24]).unwrap();
    assert!(matches!(hello(&mut conn, &mut client), Action::Upgrade(peer) if peer == [0; 24]));
    conn.answer_hello([0; 24]).unwrap();
    assert_eq!(answer(&mut conn, &mut client), [0; 24]);
}

#[test]
fn without_the_hook_hello_is_answered_directly() {
    let mut conn = connection(false);
    let mut client = ClientSession::new(ProtocolVersion::V8_0_0, [3; 24]).unwrap();
    assert!(matches!(hello(&mut conn, &mut client), Action::Transmit));
    assert_eq!(answer(&mut conn, &mut client), [0; 24]);
}
