//! The devices this build can expose, `-d` selection, and the backend serving them.

use std::sync::Arc;

use backend_cpu::{CpuBackend, CpuConfig};
use proto_core::backend::{Backend, DeviceMemory};

/// One exposed device, as the banner shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// ggml's device name (`CPU`).
    pub name: String,
    /// Its description (the CPU model).
    pub description: String,
    /// Its memory figures at start-up.
    pub memory: DeviceMemory,
}

/// The backend and the devices it exposes, in wire index order.
pub struct Devices {
    /// The backend every connection shares.
    pub backend: Arc<dyn Backend>,
    /// The devices, index = position.
    pub list: Vec<DeviceInfo>,
}

/// Names of every device this build has (for `-d` and its error message).
pub fn available_names() -> Vec<&'static str> {
    vec![CpuBackend::DEVICE_NAME]
}

/// Resolves a `-d` list (`,` or `/` separated, case-insensitive) against the devices this
/// build has. `Err` carries the first unknown name.
pub fn select(list: Option<&str>) -> Result<Vec<&'static str>, String> {
    let Some(list) = list else {
        // The reference's default: every GPU, else the CPU. This build has only the CPU.
        return Ok(vec![CpuBackend::DEVICE_NAME]);
    };
    let mut selected = Vec::new();
    for wanted in list
        .split([',', '/'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let found = available_names()
            .into_iter()
            .find(|name| name.eq_ignore_ascii_case(wanted))
            .ok_or_else(|| wanted.to_owned())?;
        if selected.contains(&found) {
            // One CPU device exists; naming it twice cannot expose it twice.
            tracing::warn!(device = found, "device listed twice; exposed once");
        } else {
            selected.push(found);
        }
    }
    if selected.is_empty() {
        return Err(list.to_owned());
    }
    Ok(selected)
}

/// Builds the backend for the selected devices (only `CPU` exists in this build).
pub fn open(selected: &[&str], config: CpuConfig) -> Devices {
    debug_assert_eq!(selected, [CpuBackend::DEVICE_NAME]);
    let cpu = CpuBackend::new(config);
    let list = vec![DeviceInfo {
        name: cpu.device_name().to_owned(),
        description: cpu.device_description(),
        memory: cpu.device_memory(0),
    }];
    Devices {
        backend: Arc::new(cpu),
        list,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_is_case_insensitive_and_rejects_unknown_names() {
        assert_eq!(select(None), Ok(vec!["CPU"]));
        assert_eq!(select(Some("cpu")), Ok(vec!["CPU"]));
        assert_eq!(select(Some("CPU/cpu")), Ok(vec!["CPU"]));
        assert_eq!(select(Some("CPU,CUDA0")), Err("CUDA0".to_owned()));
        assert_eq!(select(Some(",")), Err(",".to_owned()));
    }
}
