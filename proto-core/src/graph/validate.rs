//! The decoder behind [`Graph::decode`]: a fixed sequence of linear passes, none recursive.
//!
//! Order of the checks (the first failure is returned): counts, each record on its own, id
//! uniqueness, link resolution, cycles, view bounds, the node list, node order, then the
//! resolver and the storage rule. Structure is settled before the resolver runs so that the
//! resolver only ever sees records of a well-formed graph.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::{slot, Graph, GraphError, GraphLimits, GraphTensor, Link, TensorIndex};
use crate::backend::TensorLocation;
use crate::error::{Error, Result};
use crate::ggml::{GgmlTable, GluOp, Op, UnaryOp};
use crate::wire::{GraphComputeRequest, RpcTensor, MAX_SRC};

fn invalid(error: GraphError) -> Error {
    Error::InvalidGraph(error)
}

/// The error for an index outside a list of `len` entries: unreachable for the indices the
/// decoder builds, which all come from positions in the tensor list.
#[cold]
#[inline(never)]
fn out_of_range(index: TensorIndex, len: usize) -> Error {
    invalid(GraphError::IndexOutOfRange { index, len })
}

/// `items[index]`, checked.
#[inline]
fn at<T>(items: &[T], index: TensorIndex) -> Result<&T> {
    items
        .get(slot(index))
        .ok_or_else(|| out_of_range(index, items.len()))
}

/// `&mut items[index]`, checked.
#[inline]
fn at_mut<T>(items: &mut [T], index: TensorIndex) -> Result<&mut T> {
    let len = items.len();
    items
        .get_mut(slot(index))
        .ok_or_else(|| out_of_range(index, len))
}

pub(super) fn decode(
    request: &GraphComputeRequest,
    limits: &GraphLimits,
    table: GgmlTable,
    resolve: &mut dyn FnMut(&RpcTensor, u64) -> Result<Option<TensorLocation>>,
) -> Result<Graph> {
    let n_nodes = request.node_ids.len();
    let n_tensors = request.tensors.len();
    if n_nodes == 0 {
        // The reference client asserts n_nodes > 0; an empty graph is not something it sends.
        return Err(invalid(GraphError::EmptyNodeList));
    }
    if n_nodes > limits.max_nodes {
        return Err(invalid(GraphError::TooManyNodes {
            limit: limits.max_nodes,
            got: n_nodes,
        }));
    }
    if n_tensors > limits.max_tensors {
        return Err(invalid(GraphError::TooManyTensors {
            limit: limits.max_tensors,
            got: n_tensors,
        }));
    }
    // Only reachable with limits configured above u32::MAX: indices must fit a TensorIndex.
    if TensorIndex::try_from(n_tensors).is_err() {
        return Err(invalid(GraphError::TensorsNotIndexable {
            count: n_tensors,
        }));
    }

    let mut tensors = Vec::with_capacity(n_tensors);
    for (position, record) in request.tensors.iter().enumerate() {
        tensors.push(check_record(position, record, table)?);
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
fn check_record(position: usize, record: &RpcTensor, table: GgmlTable) -> Result<GraphTensor> {
    if record.id == 0 {
        // 0 means "no tensor" in every link field, so a tensor with id 0 could never be named.
        return Err(invalid(GraphError::ZeroTensorId { position }));
    }
    // G3: ggml's constructor aborts on an element count overflowing i64 and silently truncates
    // sizes for a misaligned ne[0].
    record.validate_shape(table)?;
    let byte_size = record.byte_size()?;
    let op = check_op(record, table)?;
    let mut record = record.clone();
    record.op = op.0;
    Ok(GraphTensor {
        record,
        src: [None; MAX_SRC],
        view_src: None,
        byte_size,
        location: None,
    })
}

/// G6/G7: the op must be in the served protocol's op table, must not be a custom op (their
/// op_params hold client function pointers the server would call), and UNARY/GLU sub-ops must
/// be in their tables (backends index dispatch tables with them). Returns the op in the newest
/// numbering.
fn check_op(record: &RpcTensor, table: GgmlTable) -> Result<Op> {
    let refuse = |reason| {
        Err(Error::OpRefused {
            op: record.op,
            reason,
        })
    };
    let outside_table = || Error::OpOutsideTable {
        op: record.op,
        table,
        likely_client: table.likely_peer_table(record.op),
    };
    let op = table.op_from_wire(record.op).ok_or_else(outside_table)?;
    if op.is_custom() {
        if table.likely_peer_table(record.op).is_some() {
            return Err(outside_table());
        }
        return refuse("custom ops carry client function pointers");
    }
    if op == Op::UNARY && !UnaryOp(record.op_params[0]).is_valid() {
        return refuse("unary sub-op outside ggml's unary table");
    }
    if op == Op::GLU && !GluOp(record.op_params[0]).is_valid() {
        return refuse("GLU sub-op outside ggml's GLU table");
    }
    Ok(op)
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
                return Err(invalid(GraphError::DuplicateId {
                    id: record.id,
                    first: *entry.get(),
                    second: position,
                }));
            }
        }
    }
    Ok(ids)
}

fn to_index(position: usize) -> Result<TensorIndex> {
    TensorIndex::try_from(position)
        .map_err(|_| invalid(GraphError::PositionNotIndexable { position }))
}

/// Turns every non-zero `src[i]` / `view_src` id into an index; an id missing from the list is
/// an error (the reference would fail to create it too, but only once it got there).
fn resolve_links(tensors: &mut [GraphTensor], ids: &HashMap<u64, TensorIndex>) -> Result<()> {
    for tensor in tensors.iter_mut() {
        let owner = tensor.record.id;
        let lookup = |link: Link, id: u64| -> Result<Option<TensorIndex>> {
            if id == 0 {
                return Ok(None);
            }
            ids.get(&id).copied().map(Some).ok_or_else(|| {
                invalid(GraphError::DanglingLink {
                    tensor: owner,
                    link,
                    id,
                })
            })
        };
        for (i, (resolved, &id)) in tensor.src.iter_mut().zip(&tensor.record.src).enumerate() {
            *resolved = lookup(Link::Src(i), id)?;
        }
        tensor.view_src = lookup(Link::ViewSrc, tensor.record.view_src)?;
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
    for ((t, tensor), count) in tensors.iter().enumerate().zip(pending.iter_mut()) {
        for target in tensor.links(to_index(t)?) {
            *count += 1;
            // start[target + 1]
            *start
                .get_mut(slot(target) + 1)
                .ok_or_else(|| out_of_range(target, n))? += 1;
        }
    }
    // Prefix sums: start[d] becomes the number of links to targets before d.
    let mut total = 0;
    for entry in start.iter_mut() {
        total += *entry;
        *entry = total;
    }
    let mut next = start.clone();
    let mut users = vec![0 as TensorIndex; total];
    for (t, tensor) in tensors.iter().enumerate() {
        let user = to_index(t)?;
        for target in tensor.links(user) {
            let cursor = at_mut(&mut next, target)?;
            // The cursor stays below start[target + 1] <= total: it advances once per link.
            *users
                .get_mut(*cursor)
                .ok_or_else(|| out_of_range(target, n))? = user;
            *cursor += 1;
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
        // users[start[done]..start[done + 1]]
        let released = match start.get(slot(done)..slot(done) + 2) {
            Some(&[from, to]) => users.get(from..to),
            _ => None,
        }
        .ok_or_else(|| out_of_range(done, n))?;
        for &user in released {
            let count = at_mut(&mut pending, user)?;
            *count -= 1;
            if *count == 0 {
                order.push(user);
            }
        }
    }
    if order.len() < n {
        let member = cycle_member(tensors, &pending);
        return Err(invalid(GraphError::Cycle {
            tensor: at(tensors, member)?.record.id,
        }));
    }
    Ok(order)
}

/// A tensor on a cycle, given Kahn's leftovers. Every unordered tensor (pending > 0) links to at
/// least one unordered tensor, so following such links from any of them must revisit one within
/// n steps; the first revisited tensor lies on a cycle.
fn cycle_member(tensors: &[GraphTensor], pending: &[u32]) -> TensorIndex {
    let unordered = |t: &TensorIndex| pending.get(slot(*t)).is_some_and(|&count| count > 0);
    let mut seen = vec![false; tensors.len()];
    let Some(mut current) = (0..tensors.len())
        .filter_map(|t| TensorIndex::try_from(t).ok())
        .find(|t| unordered(t))
    else {
        return 0;
    };
    // Every index here is a resolved link, so the lookups succeed; were one to fail, `current`
    // would still be a sound thing to name.
    while let Some(visited) = seen.get_mut(slot(current)) {
        if std::mem::replace(visited, true) {
            break;
        }
        let Some(tensor) = tensors.get(slot(current)) else {
            break;
        };
        match tensor.links(current).find(|t| unordered(t)) {
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
    let source = at(tensors, source)?;
    let offset = tensor.record.view_offs;
    let fits = offset
        .checked_add(tensor.byte_size)
        .is_some_and(|end| end <= source.byte_size);
    if !fits {
        return Err(invalid(GraphError::ViewOutOfBounds {
            view: tensor.record.id,
            size: tensor.byte_size,
            offset,
            view_src: source.record.id,
            view_src_size: source.byte_size,
        }));
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
            return Err(invalid(GraphError::ZeroNodeId { position }));
        }
        let index = ids
            .get(&id)
            .copied()
            .ok_or_else(|| invalid(GraphError::UnknownNode { position, id }))?;
        let listed = at_mut(&mut positions, index)?;
        if let Some(first) = *listed {
            return Err(invalid(GraphError::DuplicateNode {
                id,
                first,
                second: position,
            }));
        }
        *listed = Some(position);
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
        let via_source = match at(tensors, t)?.view_src {
            Some(source) => *at(&latest, source)?,
            None => None,
        };
        *at_mut(&mut latest, t)? = (*at(positions, t)?).max(via_source);
    }
    for (position, &node) in nodes.iter().enumerate() {
        let tensor = at(tensors, node)?;
        for read in tensor.links(node) {
            // `producer == position` would need a cycle, already rejected.
            if let Some(producer) = at(&latest, read)?.filter(|&p| p >= position) {
                return Err(invalid(GraphError::UsesLaterNode {
                    position,
                    node: tensor.record.id,
                    tensor: at(tensors, read)?.record.id,
                    producer,
                }));
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
        let tensor = at(tensors, node)?;
        if !tensor.is_compute() {
            continue;
        }
        for used in std::iter::once(node).chain(tensor.sources()) {
            let used = at(tensors, used)?;
            if used.byte_size > 0 && used.location.is_none() {
                return Err(invalid(GraphError::MissingStorage {
                    tensor: used.record.id,
                    size: used.byte_size,
                    node: tensor.record.id,
                }));
            }
        }
    }
    Ok(())
}
