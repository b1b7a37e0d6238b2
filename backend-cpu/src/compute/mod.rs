//! Graph execution on the CPU.
//!
//! [`run`] executes a validated [`Graph`] in node order, as ggml's CPU backend does: nodes
//! without the COMPUTE flag and layout-only ops (NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE) are
//! skipped, every other node runs its kernel on its sources' bytes — each read through its own
//! `ne`/`nb` — into its destination's bytes, which are wherever its record says (a view, an
//! in-place op's source, a fresh tensor).
//!
//! The steps:
//! 1. lock every buffer the computed nodes touch, ascending [`BufferId`], write locks, for the
//!    whole graph (`crate::buffers` documents the locking order);
//! 2. plan (`plan/`): check every node against its op's rules and build its kernel — a graph
//!    with one bad or unsupported node is refused here, before anything is written;
//! 3. execute the steps in order (`ops/`), each spreading its work over the threads
//!    (`pool.rs`). Values read at run time (row and expert ids) are checked by the kernels
//!    before they write; such a failure stops the graph with an error, leaving the nodes
//!    already run as they are.
//!
//! Where things are:
//! * `memory.rs`: the locked bytes, bounds and aliasing checks, destination parts — the only
//!   `unsafe` code of the engine;
//! * `view.rs`: tensor layouts, strided reads and type conversions (safe);
//! * `plan/`: the per-op shape, type and parameter rules (`mod.rs` the shared types and the
//!   dispatch from op to checker, one file per op family as in `ops/`);
//! * `pool.rs`: the threads (a persistent pool per backend);
//! * `ops/`: the kernels, one file per op family (its module documentation lists them);
//! * `quant/`: ggml's quantized formats (dequantize, quantize, dot products).

mod memory;
mod ops;
mod plan;
mod pool;
pub(crate) mod quant;
mod view;

use std::panic::{catch_unwind, AssertUnwindSafe};

use proto_core::backend::BufferId;
use proto_core::graph::Graph;
use proto_core::{Error, Result};

use crate::buffers::BufferPool;

use memory::Arena;
pub(crate) use pool::Pool;

#[cfg(test)]
pub(crate) use plan::NOT_IMPLEMENTED;

/// Runs a validated graph on the threads of `pool`. A graph that breaks an op's rules, or that
/// uses an op or type without a kernel, is refused before any byte is written.
pub(crate) fn run(buffers: &BufferPool, pool: &Pool, graph: &Graph) -> Result<()> {
    let ids: Vec<BufferId> = plan::buffers(graph);
    // Held (`Arc`s) for the whole graph, so a concurrent FREE_BUFFER cannot take the memory
    // away; locked in ascending id order, as every multi-buffer operation of the pool does.
    let held = ids
        .iter()
        .map(|&id| buffers.get(id))
        .collect::<Result<Vec<_>>>()?;
    let mut guards: Vec<_> = held.iter().map(|buffer| buffer.write()).collect();
    let mut arena = Arena::new(
        ids.iter()
            .copied()
            .zip(guards.iter_mut().map(|guard| guard.bytes_mut())),
    );
    let steps = plan::build(graph, &|id| arena.buffer_len(id))?;
    // A panic would be a bug in a kernel; it must not take the connection's thread (or the
    // server) down with it, and the locks are released either way.
    let mut memo = ops::GraphMemo::default();
    catch_unwind(AssertUnwindSafe(|| {
        steps
            .iter()
            .try_for_each(|step| ops::execute(step, &mut arena, pool, &mut memo))
    }))
    .unwrap_or_else(|_| Err(Error::Backend("CPU compute engine panicked".into())))
}

#[cfg(test)]
mod tests;
