//! Which work a shell runs off its event loop (a blocking thread, `block_in_place`).

use crate::dispatch::BufferTable;
#[cfg(test)]
use crate::ggml::GgmlTable;
use crate::session::ServerEvent;
use crate::wire::Request;

/// Transfers at least this large are heavy.
pub const HEAVY_BYTES: u64 = 1 << 20;

/// Buffers at least this large (one, or all of a closing client's) are freed off the event
/// loop: returning memory to the system takes milliseconds per hundred MiB (unmapping 1 GiB of
/// touched 4 KiB pages: about 110 ms here), which every other client of the loop would wait
/// out.
pub const HEAVY_FREE_BYTES: u64 = 16 << 20;

/// Whether an event may keep the thread busy long enough to stall other connections.
/// `buffers` (the connection's) says how large a buffer to free is.
pub fn is_heavy(event: &ServerEvent, buffers: &BufferTable) -> bool {
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
            Request::FreeBuffer { buffer } => buffers
                .get(*buffer)
                .is_ok_and(|entry| entry.size >= HEAVY_FREE_BYTES),
            _ => false,
        },
    }
}

/// Whether freeing everything a closing client holds (`buffers`) is heavy (see
/// [`HEAVY_FREE_BYTES`]).
pub fn is_heavy_to_free(buffers: &BufferTable) -> bool {
    buffers.total_bytes() >= HEAVY_FREE_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BufferId;

    #[test]
    fn freeing_a_large_buffer_or_client_is_heavy() {
        let mut buffers = BufferTable::new(GgmlTable::V8_0_1);
        let small = buffers
            .insert(BufferId(1), 0, HEAVY_FREE_BYTES - 1)
            .unwrap();
        let free = |buffer| ServerEvent::Request(Request::FreeBuffer { buffer });
        assert!(!is_heavy(&free(small), &buffers));
        assert!(!is_heavy_to_free(&buffers));
        let large = buffers.insert(BufferId(2), 0, HEAVY_FREE_BYTES).unwrap();
        assert!(is_heavy(&free(large), &buffers));
        assert!(is_heavy_to_free(&buffers));
        // An unknown handle is the dispatcher's error to report, at once.
        assert!(!is_heavy(&free(0), &buffers));
        // Two small buffers add up.
        let mut two = BufferTable::new(GgmlTable::V8_0_1);
        two.insert(BufferId(1), 0, HEAVY_FREE_BYTES / 2).unwrap();
        assert!(!is_heavy_to_free(&two));
        two.insert(BufferId(2), 0, HEAVY_FREE_BYTES / 2).unwrap();
        assert!(is_heavy_to_free(&two));
    }
}
