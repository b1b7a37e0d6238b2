//! Graph execution on the CPU.
//!
//! Today this module only admits graphs: nodes that need no arithmetic run (trivially), and
//! anything else is refused with [`Error::OpRefused`] before a single byte is touched, so a
//! refused graph leaves every buffer as it was.
//!
//! The compute engine belongs here, in its own submodules, when it lands:
//! * `compute/plan.rs`: per-graph planning (which nodes to run, scratch sizes, task splits);
//! * `compute/ops/`: one file per op family (element-wise, norms, mat-mul, rope, attention...),
//!   each registering the ops it supports so [`plan`] can replace its "not implemented" refusal
//!   with a table lookup;
//! * `compute/pool.rs`: the worker threads, sized by [`crate::CpuConfig::threads`].
//!
//! Kernels get their tensors' bytes through [`crate::buffers::BufferPool`], which owns the
//! locking rules (ascending buffer ids when several buffers are locked at once).

// Used by the op kernels as they land.
#[allow(dead_code)]
pub(crate) mod quant;

use proto_core::ggml::Op;
use proto_core::graph::{Graph, TensorIndex};
use proto_core::{Error, Result};

use crate::buffers::BufferPool;

/// Why a node is refused until the compute engine exists.
pub(crate) const NOT_IMPLEMENTED: &str = "not implemented by the CPU backend yet";

/// Runs a validated graph. Returns the refusal of the first node that cannot run, before
/// anything is executed.
pub(crate) fn run(_buffers: &BufferPool, _threads: usize, graph: &Graph) -> Result<()> {
    let work = plan(graph)?;
    // No node that needs arithmetic can be admitted yet, so there is nothing to execute.
    debug_assert!(work.is_empty());
    Ok(())
}

/// The nodes that need execution, in order; fails on the first one that cannot be executed.
///
/// A node needs execution when it carries the COMPUTE flag (ggml's CPU backend skips the
/// others) and its op does more than reinterpret memory: NONE, RESHAPE, VIEW, PERMUTE and
/// TRANSPOSE only describe a layout (ggml's `ggml_op_is_empty`), their bytes are the bytes of
/// their source.
pub(crate) fn plan(graph: &Graph) -> Result<Vec<TensorIndex>> {
    let mut work = Vec::new();
    for &index in &graph.nodes {
        let node = graph.tensor(index);
        if !node.is_compute() || node.op().is_view() {
            continue;
        }
        if !has_kernel(node.op()) {
            return Err(Error::OpRefused {
                op: node.record.op,
                reason: NOT_IMPLEMENTED,
            });
        }
        work.push(index);
    }
    Ok(work)
}

/// Whether an op with arithmetic has a kernel: none yet. The engine replaces this with its
/// op table.
fn has_kernel(_op: Op) -> bool {
    false
}
