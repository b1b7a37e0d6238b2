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
//! * `scratch.rs`: per-thread spare vectors for the kernels' scratch rows;
//! * `ops/`: the kernels, one file per op family (its module documentation lists them);
//! * `quant/`: ggml's quantized formats (dequantize, quantize, dot products).

mod memory;
mod ops;
mod plan;
mod pool;
pub(crate) mod quant;
mod scratch;
mod view;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use proto_core::backend::{BufferId, PreparedGraph};
use proto_core::graph::Graph;
use proto_core::{Error, Result};

use crate::buffers::BufferPool;

use memory::Arena;
pub(crate) use pool::Pool;

#[cfg(test)]
pub(crate) use plan::NOT_IMPLEMENTED;

/// A stored graph's checked plan, kept in its [`PreparedGraph`] slot for GRAPH_RECOMPUTE.
///
/// It depends on the graph and on the sizes of the buffers it was checked against, nothing
/// else: the steps name buffers by id and offset, never by address, and every run still checks
/// each step's bytes against the locked buffers (`Arena::node`). It is used only while every
/// buffer it names is live with the size it had; otherwise it is planned again.
#[derive(Debug)]
struct Prepared {
    /// The buffers `run` locks, ascending.
    ids: Vec<BufferId>,
    /// Their sizes when the plan was checked, in the order of `ids`.
    lens: Vec<Option<usize>>,
    steps: Vec<plan::Step>,
}

/// Runs a validated graph on the threads of `pool`. A graph that breaks an op's rules, or that
/// uses an op or type without a kernel, is refused before any byte is written.
#[cfg(test)]
pub(crate) fn run(buffers: &BufferPool, pool: &Pool, graph: &Graph) -> Result<()> {
    run_stored(buffers, pool, graph, None, &AtomicU64::new(0))
}

/// [`run`] for a stored graph. With a `slot`, the plan is taken from it when it still fits the buffers, and a fresh plan
/// is left in it otherwise; `plans` counts the plans built.
pub(crate) fn run_stored(
    buffers: &BufferPool,
    pool: &Pool,
    graph: &Graph,
    slot: Option<&mut Option<PreparedGraph>>,
    plans: &AtomicU64,
) -> Result<()> {
    // Taken out while the graph runs, put back after: a plan is owned by one run at a time.
    let mut slot = slot;
    let cached = slot
        .as_mut()
        .and_then(|slot| slot.take())
        .and_then(|prepared| prepared.downcast::<Prepared>().ok());
    let ids: Vec<BufferId> = match &cached {
        Some(prepared) => prepared.ids.clone(),
        None => plan::buffers(graph),
    };
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
    let lens = |arena: &Arena<'_>| -> Vec<Option<usize>> {
        ids.iter().map(|&id| arena.buffer_len(id)).collect()
    };
    let prepared = match cached {
        Some(prepared) if prepared.lens == lens(&arena) => prepared,
        _ => {
            plans.fetch_add(1, Ordering::Relaxed);
            let steps = plan::build(graph, &|id| arena.buffer_len(id))?;
            Box::new(Prepared {
                ids: ids.clone(),
                lens: lens(&arena),
                steps,
            })
        }
    };
    // A panic would be a bug in a kernel; it must not take the connection's thread (or the
    // server) down with it, and the locks are released either way.
    let mut memo = ops::GraphMemo::default();
    let result = catch_unwind(AssertUnwindSafe(|| {
        prepared
            .steps
            .iter()
            .try_for_each(|step| ops::execute(step, &mut arena, pool, &mut memo))
    }))
    .unwrap_or_else(|_| Err(Error::Backend("CPU compute engine panicked".into())));
    if let Some(slot) = slot {
        // A failed run keeps its plan too: what failed was a value read at run time.
        *slot = Some(prepared);
    }
    result
}

#[cfg(test)]
mod tests;
