//! `ggml-rpc probe`: what a server announces and what its devices offer.

use std::fmt::Write as _;

use ggml_rpc_client::Client;
use proto_core::backend::DeviceMemory;

use crate::units::format_bytes;

/// One device's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReport {
    /// Free and total memory.
    pub memory: DeviceMemory,
    /// Buffer alignment.
    pub alignment: u64,
    /// Largest buffer.
    pub max_size: u64,
}

/// Queries every device.
pub async fn probe(client: &mut Client) -> anyhow::Result<Vec<DeviceReport>> {
    let count = client.device_count().await?;
    let mut devices = Vec::new();
    for device in 0..count {
        devices.push(DeviceReport {
            memory: client.device_memory(device).await?,
            alignment: client.alignment(device).await?,
            max_size: client.max_size(device).await?,
        });
    }
    Ok(devices)
}

/// The report as printed.
pub fn render(endpoint: &str, client: &Client, devices: &[DeviceReport]) -> String {
    let mut out = String::new();
    let flags = client.server_flags();
    let cache_text = if client.server_has_tensor_cache() {
        "tensor cache"
    } else {
        "no tensor cache"
    };
    let flag_text = if client.offers_extensions() {
        format!("{cache_text}, extensions")
    } else {
        cache_text.to_owned()
    };
    let _ = writeln!(out, "endpoint  : {endpoint} ({})", client.peer_addr());
    let table = client.server_table();
    let _ = writeln!(out, "protocol  : {}", client.server_version());
    let _ = writeln!(
        out,
        "op table  : {table} ({} ops, {} types)",
        table.op_count(),
        table.type_count()
    );
    let _ = writeln!(out, "flags     : {flags:#04x} ({flag_text})");
    let _ = writeln!(out, "devices   : {}", devices.len());
    for (index, device) in devices.iter().enumerate() {
        let memory = if device.memory.total == 0 && device.memory.free == 0 {
            "memory unknown".to_owned()
        } else {
            format!(
                "{} free of {}",
                format_bytes(device.memory.free),
                format_bytes(device.memory.total)
            )
        };
        let max = if device.max_size == u64::MAX {
            "unlimited".to_owned()
        } else {
            format_bytes(device.max_size)
        };
        let _ = writeln!(
            out,
            "device {index:<3}: {memory}, alignment {}, max buffer {max}",
            device.alignment
        );
    }
    out
}
