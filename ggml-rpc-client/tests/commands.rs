//! Client-side behaviour of the client against our server over loopback TCP. The
//! server-side command round trips, hostile input and concurrency tests run against every shell
//! in `ggml-rpc-server/tests/conformance.rs`.

mod common;

use common::{bytes_tensor, within, TestServer};
use ggml_rpc_client::Client;
use proto_core::wire::ProtocolVersion;
use shell_tokio::ServerConfig;

#[tokio::test]
async fn connect_auto_follows_the_server_major() {
    for version in [ProtocolVersion::V7_0_0, ProtocolVersion::V8_0_0] {
        let server = TestServer::start(ServerConfig::new(version)).await;
        let mut client = within(Client::connect_auto(server.addr)).await.unwrap();
        assert_eq!(client.server_version(), version);
        assert_eq!(client.dialect(), version.dialect().unwrap());
        assert_eq!(client.device_count().await.unwrap(), 1);
        // A fixed version that does not match is refused as the reference client refuses it.
        let other = if version.major == 7 {
            ProtocolVersion::V8_0_0
        } else {
            ProtocolVersion::V7_0_0
        };
        let error = Client::connect(server.addr, other).await.unwrap_err();
        assert_eq!(error.version_mismatch(), Some(version));
        server.shutdown().await;
    }
}

#[tokio::test]
async fn protocol_7_refuses_protocol_8_commands_on_the_client_side() {
    let server = TestServer::start(ServerConfig::new(ProtocolVersion::V7_0_0)).await;
    let mut client = server.client(ProtocolVersion::V7_0_0).await;
    let tensor = bytes_tensor(1, 0, 0, 8);
    let error = client.get_tensor_2d(&tensor, 0, 1, 1, 1).await.unwrap_err();
    assert_eq!(
        error.protocol_kind(),
        Some(proto_core::ErrorKind::UnknownCommand)
    );
    server.shutdown().await;
}
