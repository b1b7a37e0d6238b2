//! The decoder behind [`Graph::decode`]: a fixed sequence of linear passes, none recursive.
//!
//! Order of the checks (the first failure is returned): counts, each record on its own, id
//! uniqueness, link resolution, cycles, view bounds, the node list, node order, then the
//! resolver and the storage rule. Structure is settled before the resolver runs so that the
//! resolver only ever sees records of a well-formed graph.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::{slot, Graph, GraphLimits, GraphTensor, TensorIndex};
use crate::backend::TensorLocation;
use crate::error::{Error, Result};
use crate::ggml::{GluOp, Op, UnaryOp};
use crate::wire::{GraphComputeRequest, RpcTensor, MAX_SRC};

fn invalid(reason: String) -> Error {
    Error::InvalidGraph(reason)
}

pub(super) fn decode(
    request: &GraphComputeRequest,
    limits: &GraphLimits,
    resolve: &mut dyn FnMut(&RpcTensor, u64) -> Result<Option<TensorLocation>>,
) -> Result<Graph> {
    let n_nodes = request.node_ids.len();
    let n_tensors = request.tensors.len();
    if n_nodes == 0 {
        // The reference client asserts n_nodes > 0; an empty graph is not something it sends.
        return Err(invalid("the node list is empty".into()));
    }
    if n_nodes > limits.max_nodes {
        return Err(invalid(format!(
            "{n_nodes} nodes exceed the limit of {}",
            limits.max_nodes
        )));
    }
    if n_tensors > limits.max_tensors {
        return Err(invalid(format!(
            "{n_tensors} tensors exceed the limit of {}",
            limits.max_tensors
        )));
    }
    // Only reachable with limits configured above u32::MAX: indices must fit a TensorIndex.
    if TensorIndex::try_from(n_tensors).is_err() {
        return Err(invalid(format!("{n_tensors} tensors cannot be indexed")));
    }

    let mut tensors = Vec::with_capacity(n_tensors);
    for (position, record) in request.tensors.iter().enumerate() {
        tensors.push(check_record(position, record)?);
    }
    let ids = index_ids(&request.tensors)?;
    resolve_links(&mut tensors, &ids)?;
    let order = topological_order(&tensors)?;
    for tensor in &tensors {
        check_view(tensor, &tensors)?;
    }
    let (nodes, positions) = node_indices(&request.node_ids, &ids, n_tensors)?;
    check_node_order(&nodes, &positions, &order, &tensors)?;
    for tensor in tensors.iter_mut() {
        tensor.location = resolve(&tensor.record, tensor.byte_size)?;
    }
    check_storage(&nodes, &tensors)?;
    Ok(Graph {
        device: request.device,
        uid: request.uid,
        nodes,
        tensors,
    })
}

/// Everything a record can be checked for without looking at other records.
fn check_record(position: usize, record: &RpcTensor) -> Result<GraphTensor> {
    if record.id == 0 {
        // 0 means "no tensor" in every link field, so a tensor with id 0 could never be named.
        return Err(invalid(format!("tensor #{position} has id 0")));
    }
    // G3: ggml's constructor aborts on an element count overflowing i64 and silently truncates
    // sizes for a misaligned ne[0].
    record.validate_shape()?;
    let byte_size = record.byte_size()?;
    check_op(record)?;
    Ok(GraphTensor {
        record: record.clone(),
        src: [None; MAX_SRC],
        view_src: None,
        byte_size,
        location: None,
    })
}

/// G6/G7: the op must be in ggml's table, must not be a custom op (their op_params hold client
/// function pointers the server would call), and UNARY/GLU sub-ops must be in their tables
/// (backends index dispatch tables with them).
fn check_op(record: &RpcTensor) -> Result<()> {
    let op = Op(record.op);
    let refuse = |reason| {
        Err(Error::OpRefused {
            op: record.op,
            reason,
        })
    };
    if !op.is_valid() {
        return refuse("op id outside ggml's op table");
    }
    if op.is_custom() {
        return refuse("custom ops carry client function pointers");
    }
    if op == Op::UNARY && !UnaryOp(record.op_params[0]).is_valid() {
        return refuse("unary sub-op outside ggml's unary table");
    }
    if op == Op::GLU && !GluOp(record.op_params[0]).is_valid() {
        return refuse("GLU sub-op outside ggml's GLU table");
    }
    Ok(())
}

/// Maps every id to its position. The reference lets the first of two equal ids win; a
/// well-formed client never repeats one, so a repeat is rejected rather than guessed at.
fn index_ids(records: &[RpcTensor]) -> Result<HashMap<u64, TensorIndex>> {
    // SipHash (std's default) keeps client-chosen ids from degrading the map.
    let mut ids = HashMap::with_capacity(records.len());
    for (position, record) in records.iter().enumerate() {
        let index = to_index(position)?;
        match ids.entry(record.id) {
            Entry::Vacant(entry) => {
                entry.insert(index);
            }
            Entry::Occupied(entry) => {
                return Err(invalid(format!(
                    "tensor id {:#x} appears twice (#{} and #{position})",
                    record.id,
                    entry.get()
                )));
            }
        }
    }
    Ok(ids)
}

fn to_index(position: usize) -> Result<TensorIndex> {
    TensorIndex::try_from(position)
        .map_err(|_| invalid(format!("tensor #{position} cannot be indexed")))
}

/// Turns every non-zero `src[i]` / `view_src` id into an index; an id missing from the list is
/// an error (the reference would fail to create it too, but only once it got there).
fn resolve_links(tensors: &mut [GraphTensor], ids: &HashMap<u64, TensorIndex>) -> Result<()> {
    for tensor in tensors.iter_mut() {
        let owner = tensor.record.id;
        // The field name is only formatted on the error path: this loop runs for every link
        // of every tensor.
        let lookup = |field: &dyn Fn() -> String, id: u64| -> Result<Option<TensorIndex>> {
            if id == 0 {
                return Ok(None);
            }
            ids.get(&id).copied().map(Some).ok_or_else(|| {
                invalid(format!(
                    "tensor {owner:#x}: {} = {id:#x} is not among the tensors",
                    field()
                ))
            })
        };
        for (i, &id) in tensor.record.src.iter().enumerate() {
            tensor.src[i] = lookup(&|| format!("src[{i}]"), id)?;
        }
        tensor.view_src = lookup(&|| "view_src".to_string(), tensor.record.view_src)?;
    }
    Ok(())
}

/// Kahn's algorithm over the `src`/`view_src` links: returns every index, sources before the
/// tensors that link to them, or the cycle error. Iterative and O(tensors + links), so a
/// 100,000-long chain costs no stack (G8: the reference recurses once per link).
fn topological_order(tensors: &[GraphTensor]) -> Result<Vec<TensorIndex>> {
    let n = tensors.len();
    // pending[t]: links of t whose target is not yet ordered (counted with multiplicity).
    let mut pending = vec![0u32; n];
    // users[start[d]..start[d + 1]]: the tensors linking to d, so that ordering d releases
    // exactly its users (a compressed adjacency list: two allocations instead of n).
    let mut start = vec![0usize; n + 1];
    for (t, tensor) in tensors.iter().enumerate() {
        for target in tensor.links(to_index(t)?) {
            pending[t] += 1;
            start[slot(target) + 1] += 1;
        }
    }
    for d in 0..n {
        start[d + 1] += start[d];
    }
    let mut next = start.clone();
    let mut users = vec![0 as TensorIndex; start[n]];
    for (t, tensor) in tensors.iter().enumerate() {
        let user = to_index(t)?;
        for target in tensor.links(user) {
            users[next[slot(target)]] = user;
            next[slot(target)] += 1;
        }
    }

    let mut order = Vec::with_capacity(n);
    for (t, &count) in pending.iter().enumerate() {
        if count == 0 {
            order.push(to_index(t)?);
        }
    }
    // `order` doubles as the FIFO queue: everything before `head` has released its users.
    let mut head = 0;
    while let Some(&done) = order.get(head) {
        head += 1;
        for &user in &users[start[slot(done)]..start[slot(done) + 1]] {
            pending[slot(user)] -= 1;
            if pending[slot(user)] == 0 {
                order.push(user);
            }
        }
    }
    if order.len() < n {
        let member = cycle_member(tensors, &pending);
        return Err(invalid(format!(
            "the src/view_src links form a cycle through tensor {:#x}",
            tensors[slot(member)].record.id
        )));
    }
    Ok(order)
}

/// A tensor on a cycle, given Kahn's leftovers. Every unordered tensor (pending > 0) links to at
/// least one unordered tensor, so following such links from any of them must revisit one within
/// n steps; the first revisited tensor lies on a cycle.
fn cycle_member(tensors: &[GraphTensor], pending: &[u32]) -> TensorIndex {
    let unordered = |t: &TensorIndex| pending[slot(*t)] > 0;
    let mut seen = vec![false; tensors.len()];
    let Some(mut current) = (0..tensors.len())
        .filter_map(|t| TensorIndex::try_from(t).ok())
        .find(|t| unordered(t))
    else {
        return 0;
    };
    while !seen[slot(current)] {
        seen[slot(current)] = true;
        match tensors[slot(current)].links(current).find(|t| unordered(t)) {
            Some(target) => current = target,
            // Unreachable by the invariant above; `current` is still a sound thing to name.
            None => break,
        }
    }
    current
}

/// A non-empty view must lie inside its source: ggml asserts
/// `view_offs + size <= nbytes(view_src)` when it builds the view, and backends read the view's
/// bytes relative to the source. Empty views are exempt, as in ggml.
fn check_view(tensor: &GraphTensor, tensors: &[GraphTensor]) -> Result<()> {
    let Some(source) = tensor.view_src else {
        return Ok(());
    };
    if tensor.byte_size == 0 {
        return Ok(());
    }
    let source = &tensors[slot(source)];
    let offset = tensor.record.view_offs;
    let fits = offset
        .checked_add(tensor.byte_size)
        .is_some_and(|end| end <= source.byte_size);
    if !fits {
        return Err(invalid(format!(
            "view {:#x} ({} bytes at offset {offset}) exceeds its view_src {:#x} ({} bytes)",
            tensor.record.id, tensor.byte_size, source.record.id, source.byte_size
        )));
    }
    Ok(())
}

/// The node list as indices, and for each tensor its position in the node list (if any).
/// Node id 0 is rejected (G8: the reference leaves an empty slot that backends dereference), as
/// are unknown ids and repeats (a ggml graph holds each tensor once; running one twice would
/// apply in-place or accumulating ops twice).
fn node_indices(
    node_ids: &[u64],
    ids: &HashMap<u64, TensorIndex>,
    n_tensors: usize,
) -> Result<(Vec<TensorIndex>, Vec<Option<usize>>)> {
    let mut nodes = Vec::with_capacity(node_ids.len());
    let mut positions: Vec<Option<usize>> = vec![None; n_tensors];
    for (position, &id) in node_ids.iter().enumerate() {
        if id == 0 {
            return Err(invalid(format!("node #{position} has id 0")));
        }
        let index = ids.get(&id).copied().ok_or_else(|| {
            invalid(format!(
                "node #{position}: id {id:#x} is not among the tensors"
            ))
        })?;
        if let Some(first) = positions[slot(index)] {
            return Err(invalid(format!(
                "node {id:#x} is listed twice (#{first} and #{position})"
            )));
        }
        positions[slot(index)] = Some(position);
        nodes.push(index);
    }
    Ok((nodes, positions))
}

/// Backends run the nodes in list order, so a node must not read a node listed after it: that
/// would read bytes not yet produced. "Read" covers a source, anything on that source's
/// `view_src` chain (a view's bytes are its source's), and the `view_src` chain of the node
/// itself (an in-place node writes into bytes its source node produces). ggml's post-order
/// graph builder always satisfies this.
fn check_node_order(
    nodes: &[TensorIndex],
    positions: &[Option<usize>],
    order: &[TensorIndex],
    tensors: &[GraphTensor],
) -> Result<()> {
    // latest[t]: the last node position among t and its view_src chain. Filled in topological
    // order so that the view_src's entry is final before t's is computed.
    let mut latest: Vec<Option<usize>> = vec![None; tensors.len()];
    for &t in order {
        let via_source = tensors[slot(t)]
            .view_src
            .and_then(|source| latest[slot(source)]);
        latest[slot(t)] = positions[slot(t)].max(via_source);
    }
    for (position, &node) in nodes.iter().enumerate() {
        let tensor = &tensors[slot(node)];
        for read in tensor.links(node) {
            // `producer == position` would need a cycle, already rejected.
            if let Some(producer) = latest[slot(read)].filter(|&p| p >= position) {
                return Err(invalid(format!(
                    "node #{position} ({:#x}) uses tensor {:#x}, which node #{producer} produces later",
                    tensor.record.id,
                    tensors[slot(read)].record.id
                )));
            }
        }
    }
    Ok(())
}

/// G8: a computed node writes its own bytes and reads its sources' bytes; every one of those
/// that is non-empty must live in memory the resolver mapped, never memory the server does not
/// own. Nodes without COMPUTE are never executed, so they need nothing.
fn check_storage(nodes: &[TensorIndex], tensors: &[GraphTensor]) -> Result<()> {
    for &node in nodes {
        let tensor = &tensors[slot(node)];
        if !tensor.is_compute() {
            continue;
        }
        for used in std::iter::once(node).chain(tensor.sources()) {
            let used = &tensors[slot(used)];
            if used.byte_size > 0 && used.location.is_none() {
                return Err(invalid(format!(
                    "tensor {:#x} ({} bytes), used by computed node {:#x}, has no storage on this server",
                    used.record.id, used.byte_size, tensor.record.id
                )));
            }
        }
    }
    Ok(())
}
