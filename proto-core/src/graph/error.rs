//! [`GraphError`]: why a graph was rejected, as facts rather than text.
//!
//! Carried by [`Error::InvalidGraph`](crate::Error::InvalidGraph); its `Display` is the
//! human-readable reason that follows "invalid graph: " in logs.

use std::fmt;

use super::TensorIndex;

/// A link field of a tensor record that names another tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Link {
    /// `src[slot]`.
    Src(usize),
    /// `view_src`.
    ViewSrc,
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::Src(slot) => write!(f, "src[{slot}]"),
            Link::ViewSrc => f.write_str("view_src"),
        }
    }
}

/// A structural problem of a GRAPH_COMPUTE graph. Tensor and node ids are the client's ids;
/// positions (`#n`) are places in the request's tensor or node list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// The node list is empty.
    #[error("the node list is empty")]
    EmptyNodeList,
    /// More nodes than [`GraphLimits::max_nodes`](super::GraphLimits::max_nodes).
    #[error("{got} nodes exceed the limit of {limit}")]
    TooManyNodes {
        /// The configured limit.
        limit: usize,
        /// The node count received.
        got: usize,
    },
    /// More tensors than [`GraphLimits::max_tensors`](super::GraphLimits::max_tensors).
    #[error("{got} tensors exceed the limit of {limit}")]
    TooManyTensors {
        /// The configured limit.
        limit: usize,
        /// The tensor count received.
        got: usize,
    },
    /// A tensor count that a [`TensorIndex`] cannot address (only with limits above
    /// `u32::MAX`).
    #[error("{count} tensors cannot be indexed")]
    TensorsNotIndexable {
        /// The tensor count received.
        count: usize,
    },
    /// A tensor position that a [`TensorIndex`] cannot address.
    #[error("tensor #{position} cannot be indexed")]
    PositionNotIndexable {
        /// The position in the tensor list.
        position: usize,
    },
    /// A tensor record with id 0 (which every link field reads as "no tensor").
    #[error("tensor #{position} has id 0")]
    ZeroTensorId {
        /// The position in the tensor list.
        position: usize,
    },
    /// Two tensor records with the same id.
    #[error("tensor id {id:#x} appears twice (#{first} and #{second})")]
    DuplicateId {
        /// The repeated id.
        id: u64,
        /// Position of the first record with it.
        first: TensorIndex,
        /// Position of the repeat.
        second: usize,
    },
    /// A `src`/`view_src` link naming an id that is not in the tensor list.
    #[error("tensor {tensor:#x}: {link} = {id:#x} is not among the tensors")]
    DanglingLink {
        /// The tensor holding the link.
        tensor: u64,
        /// Which field.
        link: Link,
        /// The id it names.
        id: u64,
    },
    /// The `src`/`view_src` links form a cycle.
    #[error("the src/view_src links form a cycle through tensor {tensor:#x}")]
    Cycle {
        /// A tensor on the cycle.
        tensor: u64,
    },
    /// A non-empty view that does not lie inside its `view_src`.
    #[error(
        "view {view:#x} ({size} bytes at offset {offset}) exceeds its view_src {view_src:#x} ({view_src_size} bytes)"
    )]
    ViewOutOfBounds {
        /// The view's id.
        view: u64,
        /// The view's byte size.
        size: u64,
        /// Its `view_offs`.
        offset: u64,
        /// The `view_src` id.
        view_src: u64,
        /// The `view_src`'s byte size.
        view_src_size: u64,
    },
    /// A node list entry of 0.
    #[error("node #{position} has id 0")]
    ZeroNodeId {
        /// The position in the node list.
        position: usize,
    },
    /// A node list entry naming an id that is not in the tensor list.
    #[error("node #{position}: id {id:#x} is not among the tensors")]
    UnknownNode {
        /// The position in the node list.
        position: usize,
        /// The id.
        id: u64,
    },
    /// A node listed twice.
    #[error("node {id:#x} is listed twice (#{first} and #{second})")]
    DuplicateNode {
        /// The node's id.
        id: u64,
        /// Its first position in the node list.
        first: usize,
        /// The repeat's position.
        second: usize,
    },
    /// A node that reads bytes a node listed after it produces.
    #[error("node #{position} ({node:#x}) uses tensor {tensor:#x}, which node #{producer} produces later")]
    UsesLaterNode {
        /// The reading node's position in the node list.
        position: usize,
        /// The reading node's id.
        node: u64,
        /// The id of the tensor it reads.
        tensor: u64,
        /// Position of the node that produces that tensor's bytes.
        producer: usize,
    },
    /// A non-empty tensor that a computed node reads or writes has no location on this server.
    #[error("tensor {tensor:#x} ({size} bytes), used by computed node {node:#x}, has no storage on this server")]
    MissingStorage {
        /// The tensor without storage.
        tensor: u64,
        /// Its byte size.
        size: u64,
        /// The computed node that uses it.
        node: u64,
    },
    /// A tensor index outside the tensor list: a graph whose invariants do not hold (a decoded
    /// graph never has one).
    #[error("tensor index {index} is out of range ({len} tensors)")]
    IndexOutOfRange {
        /// The index.
        index: TensorIndex,
        /// The number of tensors.
        len: usize,
    },
    /// A tensor of an executed graph whose storage the backend refuses (overlaps, strides or
    /// extents it cannot honour).
    #[error("{backend} compute: {reason}")]
    BadStorage {
        /// The backend that refused it ("CPU", ...).
        backend: &'static str,
        /// What is wrong with the storage.
        reason: &'static str,
    },
    /// A tensor whose `(buffer, data)` extent leaves the buffer it names.
    #[error("tensor {tensor:#x} lies outside its buffer")]
    OutsideBuffer {
        /// The tensor's id.
        tensor: u64,
    },
    /// A node that a backend cannot execute as described (shapes, types or parameters that
    /// contradict its op).
    #[error("node {node:#x} ({op}): {reason}")]
    BadNode {
        /// The node's id.
        node: u64,
        /// The op's name ("?" outside ggml's table).
        op: &'static str,
        /// What contradicts the op.
        reason: String,
    },
}
