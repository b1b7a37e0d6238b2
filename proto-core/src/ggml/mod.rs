//! ggml's tables that are part of the de-facto wire contract: tensor types, ops and flags.

pub mod ops;
mod table;
pub mod types;

pub use ops::{op_name, GluOp, Op, UnaryOp, OP_COUNT};
pub use table::GgmlTable;
pub use types::{type_info, TypeInfo, TYPE_COUNT};

/// Tensor flag bits carried in `rpc_tensor.flags`.
pub mod flags {
    /// The tensor is a graph input.
    pub const INPUT: i32 = 1;
    /// The tensor is a graph output.
    pub const OUTPUT: i32 = 2;
    /// The tensor holds trainable parameters.
    pub const PARAM: i32 = 4;
    /// The tensor defines a loss.
    pub const LOSS: i32 = 8;
    /// The node must be computed; backends skip nodes without it.
    pub const COMPUTE: i32 = 16;
}
