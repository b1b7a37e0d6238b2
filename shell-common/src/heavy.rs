//! Which events a shell runs off its event loop (a blocking thread, `block_in_place`).

use proto_core::session::ServerEvent;
use proto_core::wire::Request;

/// Transfers at least this large are heavy.
pub const HEAVY_BYTES: u64 = 1 << 20;

/// Whether an event may keep the thread busy long enough to stall other connections.
pub fn is_heavy(event: &ServerEvent) -> bool {
    match event {
        ServerEvent::TensorData(chunk) => chunk.len() as u64 >= HEAVY_BYTES,
        ServerEvent::TensorWriteBegin { .. } | ServerEvent::TensorWriteEnd => false,
        ServerEvent::Request(request) => match request {
            Request::GraphCompute(_)
            | Request::GraphRecompute { .. }
            | Request::CopyTensor { .. }
            | Request::BufferClear { .. }
            | Request::SetTensorHash { .. } => true,
            Request::GetTensor { size, .. } | Request::MemsetTensor { size, .. } => {
                *size >= HEAVY_BYTES
            }
            Request::GetTensor2d(header) => {
                header.size.saturating_mul(header.n_copies) >= HEAVY_BYTES
            }
            Request::SetTensor { data, .. } | Request::SetTensor2d { data, .. } => {
                data.len() as u64 >= HEAVY_BYTES
            }
            _ => false,
        },
    }
}
