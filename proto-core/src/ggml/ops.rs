//! ggml's ops in the newest numbering (llama.cpp b12032+1, protocol 8.0.1), unary sub-ops and
//! GLU sub-ops. Peers of protocol 7.0.0 and 8.0.0 number the ops from `UNARY` on one lower: the
//! wire ids are translated by [`GgmlTable`](super::GgmlTable), never compared with these directly.

/// Number of ops in the newest table (`GGML_OP_COUNT` of protocol 8.0.1).
pub const OP_COUNT: u32 = 102;

/// A ggml op in the newest numbering (see the module documentation). A graph decoded by
/// [`Graph::decode`](crate::graph::Graph::decode) holds these, whatever table its peer used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Op(pub u32);

#[allow(missing_docs)]
impl Op {
    /// `GGML_OP_NONE`.
    pub const NONE: Op = Op(0);
    /// `GGML_OP_DUP`.
    pub const DUP: Op = Op(1);
    /// `GGML_OP_ADD`.
    pub const ADD: Op = Op(2);
    /// `GGML_OP_ADD_ID`.
    pub const ADD_ID: Op = Op(3);
    /// `GGML_OP_ADD1`.
    pub const ADD1: Op = Op(4);
    /// `GGML_OP_ACC`.
    pub const ACC: Op = Op(5);
    /// `GGML_OP_SUB`.
    pub const SUB: Op = Op(6);
    /// `GGML_OP_MUL`.
    pub const MUL: Op = Op(7);
    /// `GGML_OP_DIV`.
    pub const DIV: Op = Op(8);
    /// `GGML_OP_SQR`.
    pub const SQR: Op = Op(9);
    /// `GGML_OP_SQRT`.
    pub const SQRT: Op = Op(10);
    /// `GGML_OP_LOG`.
    pub const LOG: Op = Op(11);
    /// `GGML_OP_SIN`.
    pub const SIN: Op = Op(12);
    /// `GGML_OP_COS`.
    pub const COS: Op = Op(13);
    /// `GGML_OP_SUM`.
    pub const SUM: Op = Op(14);
    /// `GGML_OP_SUM_ROWS`.
    pub const SUM_ROWS: Op = Op(15);
    /// `GGML_OP_CUMSUM`.
    pub const CUMSUM: Op = Op(16);
    /// `GGML_OP_MEAN`.
    pub const MEAN: Op = Op(17);
    /// `GGML_OP_ARGMAX`.
    pub const ARGMAX: Op = Op(18);
    /// `GGML_OP_COUNT_EQUAL`.
    pub const COUNT_EQUAL: Op = Op(19);
    /// `GGML_OP_REPEAT`.
    pub const REPEAT: Op = Op(20);
    /// `GGML_OP_REPEAT_BACK`.
    pub const REPEAT_BACK: Op = Op(21);
    /// `GGML_OP_CONCAT`.
    pub const CONCAT: Op = Op(22);
    /// `GGML_OP_SILU_BACK`.
    pub const SILU_BACK: Op = Op(23);
    /// `GGML_OP_NORM`.
    pub const NORM: Op = Op(24);
    /// `GGML_OP_RMS_NORM`.
    pub const RMS_NORM: Op = Op(25);
    /// `GGML_OP_RMS_NORM_BACK`.
    pub const RMS_NORM_BACK: Op = Op(26);
    /// `GGML_OP_GROUP_NORM`.
    pub const GROUP_NORM: Op = Op(27);
    /// `GGML_OP_L2_NORM`.
    pub const L2_NORM: Op = Op(28);
    /// `GGML_OP_MUL_MAT`.
    pub const MUL_MAT: Op = Op(29);
    /// `GGML_OP_MUL_MAT_ID`.
    pub const MUL_MAT_ID: Op = Op(30);
    /// `GGML_OP_OUT_PROD`.
    pub const OUT_PROD: Op = Op(31);
    /// `GGML_OP_SCALE`.
    pub const SCALE: Op = Op(32);
    /// `GGML_OP_SET`.
    pub const SET: Op = Op(33);
    /// `GGML_OP_CPY`.
    pub const CPY: Op = Op(34);
    /// `GGML_OP_CONT`.
    pub const CONT: Op = Op(35);
    /// `GGML_OP_RESHAPE`.
    pub const RESHAPE: Op = Op(36);
    /// `GGML_OP_VIEW`.
    pub const VIEW: Op = Op(37);
    /// `GGML_OP_PERMUTE`.
    pub const PERMUTE: Op = Op(38);
    /// `GGML_OP_TRANSPOSE`.
    pub const TRANSPOSE: Op = Op(39);
    /// `GGML_OP_GET_ROWS`.
    pub const GET_ROWS: Op = Op(40);
    /// `GGML_OP_GET_ROWS_BACK`.
    pub const GET_ROWS_BACK: Op = Op(41);
    /// `GGML_OP_SET_ROWS`.
    pub const SET_ROWS: Op = Op(42);
    /// `GGML_OP_DIAG`.
    pub const DIAG: Op = Op(43);
    /// `GGML_OP_DIAG_MASK_INF`.
    pub const DIAG_MASK_INF: Op = Op(44);
    /// `GGML_OP_DIAG_MASK_ZERO`.
    pub const DIAG_MASK_ZERO: Op = Op(45);
    /// `GGML_OP_SOFT_MAX`.
    pub const SOFT_MAX: Op = Op(46);
    /// `GGML_OP_SOFT_MAX_BACK`.
    pub const SOFT_MAX_BACK: Op = Op(47);
    /// `GGML_OP_ROPE`.
    pub const ROPE: Op = Op(48);
    /// `GGML_OP_ROPE_BACK`.
    pub const ROPE_BACK: Op = Op(49);
    /// `GGML_OP_CLAMP`.
    pub const CLAMP: Op = Op(50);
    /// `GGML_OP_CONV_TRANSPOSE_1D`.
    pub const CONV_TRANSPOSE_1D: Op = Op(51);
    /// `GGML_OP_IM2COL`.
    pub const IM2COL: Op = Op(52);
    /// `GGML_OP_IM2COL_BACK`.
    pub const IM2COL_BACK: Op = Op(53);
    /// `GGML_OP_IM2COL_3D`.
    pub const IM2COL_3D: Op = Op(54);
    /// `GGML_OP_COL2IM_1D`.
    pub const COL2IM_1D: Op = Op(55);
    /// `GGML_OP_CONV_2D`.
    pub const CONV_2D: Op = Op(56);
    /// `GGML_OP_CONV_3D`.
    pub const CONV_3D: Op = Op(57);
    /// `GGML_OP_CONV_2D_DW`.
    pub const CONV_2D_DW: Op = Op(58);
    /// `GGML_OP_CONV_TRANSPOSE_2D`.
    pub const CONV_TRANSPOSE_2D: Op = Op(59);
    /// `GGML_OP_POOL_1D`.
    pub const POOL_1D: Op = Op(60);
    /// `GGML_OP_POOL_2D`.
    pub const POOL_2D: Op = Op(61);
    /// `GGML_OP_POOL_2D_BACK`.
    pub const POOL_2D_BACK: Op = Op(62);
    /// `GGML_OP_UPSCALE`.
    pub const UPSCALE: Op = Op(63);
    /// `GGML_OP_PAD`.
    pub const PAD: Op = Op(64);
    /// `GGML_OP_PAD_REFLECT_1D`.
    pub const PAD_REFLECT_1D: Op = Op(65);
    /// `GGML_OP_ROLL`.
    pub const ROLL: Op = Op(66);
    /// `GGML_OP_ARANGE`.
    pub const ARANGE: Op = Op(67);
    /// `GGML_OP_TIMESTEP_EMBEDDING`.
    pub const TIMESTEP_EMBEDDING: Op = Op(68);
    /// `GGML_OP_ARGSORT`.
    pub const ARGSORT: Op = Op(69);
    /// `GGML_OP_TOP_K`.
    pub const TOP_K: Op = Op(70);
    /// `GGML_OP_LEAKY_RELU`.
    pub const LEAKY_RELU: Op = Op(71);
    /// `GGML_OP_TRI`.
    pub const TRI: Op = Op(72);
    /// `GGML_OP_FILL`.
    pub const FILL: Op = Op(73);
    /// `GGML_OP_FLASH_ATTN_EXT`.
    pub const FLASH_ATTN_EXT: Op = Op(74);
    /// `GGML_OP_FLASH_ATTN_BACK`.
    pub const FLASH_ATTN_BACK: Op = Op(75);
    /// `GGML_OP_SSM_CONV`.
    pub const SSM_CONV: Op = Op(76);
    /// `GGML_OP_SSM_SCAN`.
    pub const SSM_SCAN: Op = Op(77);
    /// `GGML_OP_WIN_PART`.
    pub const WIN_PART: Op = Op(78);
    /// `GGML_OP_WIN_UNPART`.
    pub const WIN_UNPART: Op = Op(79);
    /// `GGML_OP_GET_REL_POS`.
    pub const GET_REL_POS: Op = Op(80);
    /// `GGML_OP_ADD_REL_POS`.
    pub const ADD_REL_POS: Op = Op(81);
    /// `GGML_OP_RWKV_WKV6`.
    pub const RWKV_WKV6: Op = Op(82);
    /// `GGML_OP_GATED_LINEAR_ATTN`.
    pub const GATED_LINEAR_ATTN: Op = Op(83);
    /// `GGML_OP_RWKV_WKV7`.
    pub const RWKV_WKV7: Op = Op(84);
    /// `GGML_OP_SOLVE_TRI`.
    pub const SOLVE_TRI: Op = Op(85);
    /// `GGML_OP_GATED_DELTA_NET`.
    pub const GATED_DELTA_NET: Op = Op(86);
    /// `GGML_OP_LIGHTNING_INDEXER`.
    pub const LIGHTNING_INDEXER: Op = Op(87);
    /// `GGML_OP_DSV4_HC_COMB`.
    pub const DSV4_HC_COMB: Op = Op(88);
    /// `GGML_OP_DSV4_HC_PRE`.
    pub const DSV4_HC_PRE: Op = Op(89);
    /// `GGML_OP_DSV4_HC_POST`.
    pub const DSV4_HC_POST: Op = Op(90);
    /// `GGML_OP_TOP_K_MASK` (8.0.1 only).
    pub const TOP_K_MASK: Op = Op(91);
    /// `GGML_OP_UNARY`.
    pub const UNARY: Op = Op(92);
    /// `GGML_OP_MAP_CUSTOM1`.
    pub const MAP_CUSTOM1: Op = Op(93);
    /// `GGML_OP_MAP_CUSTOM2`.
    pub const MAP_CUSTOM2: Op = Op(94);
    /// `GGML_OP_MAP_CUSTOM3`.
    pub const MAP_CUSTOM3: Op = Op(95);
    /// `GGML_OP_CUSTOM`.
    pub const CUSTOM: Op = Op(96);
    /// `GGML_OP_CROSS_ENTROPY_LOSS`.
    pub const CROSS_ENTROPY_LOSS: Op = Op(97);
    /// `GGML_OP_CROSS_ENTROPY_LOSS_BACK`.
    pub const CROSS_ENTROPY_LOSS_BACK: Op = Op(98);
    /// `GGML_OP_OPT_STEP_ADAMW`.
    pub const OPT_STEP_ADAMW: Op = Op(99);
    /// `GGML_OP_OPT_STEP_SGD`.
    pub const OPT_STEP_SGD: Op = Op(100);
    /// `GGML_OP_GLU`.
    pub const GLU: Op = Op(101);
}

impl Op {
    /// Whether the op is inside ggml's newest op table.
    pub fn is_valid(self) -> bool {
        self.0 < OP_COUNT
    }

    /// Ops whose `op_params` carry client function pointers; a server must never run them.
    pub fn is_custom(self) -> bool {
        matches!(
            self,
            Op::MAP_CUSTOM1 | Op::MAP_CUSTOM2 | Op::MAP_CUSTOM3 | Op::CUSTOM
        )
    }

    /// Ops that only reinterpret memory (no compute): views, reshapes and permutations.
    pub fn is_view(self) -> bool {
        matches!(
            self,
            Op::NONE | Op::RESHAPE | Op::VIEW | Op::PERMUTE | Op::TRANSPOSE
        )
    }
}

static OP_NAMES: [&str; OP_COUNT as usize] = [
    "NONE",
    "DUP",
    "ADD",
    "ADD_ID",
    "ADD1",
    "ACC",
    "SUB",
    "MUL",
    "DIV",
    "SQR",
    "SQRT",
    "LOG",
    "SIN",
    "COS",
    "SUM",
    "SUM_ROWS",
    "CUMSUM",
    "MEAN",
    "ARGMAX",
    "COUNT_EQUAL",
    "REPEAT",
    "REPEAT_BACK",
    "CONCAT",
    "SILU_BACK",
    "NORM",
    "RMS_NORM",
    "RMS_NORM_BACK",
    "GROUP_NORM",
    "L2_NORM",
    "MUL_MAT",
    "MUL_MAT_ID",
    "OUT_PROD",
    "SCALE",
    "SET",
    "CPY",
    "CONT",
    "RESHAPE",
    "VIEW",
    "PERMUTE",
    "TRANSPOSE",
    "GET_ROWS",
    "GET_ROWS_BACK",
    "SET_ROWS",
    "DIAG",
    "DIAG_MASK_INF",
    "DIAG_MASK_ZERO",
    "SOFT_MAX",
    "SOFT_MAX_BACK",
    "ROPE",
    "ROPE_BACK",
    "CLAMP",
    "CONV_TRANSPOSE_1D",
    "IM2COL",
    "IM2COL_BACK",
    "IM2COL_3D",
    "COL2IM_1D",
    "CONV_2D",
    "CONV_3D",
    "CONV_2D_DW",
    "CONV_TRANSPOSE_2D",
    "POOL_1D",
    "POOL_2D",
    "POOL_2D_BACK",
    "UPSCALE",
    "PAD",
    "PAD_REFLECT_1D",
    "ROLL",
    "ARANGE",
    "TIMESTEP_EMBEDDING",
    "ARGSORT",
    "TOP_K",
    "LEAKY_RELU",
    "TRI",
    "FILL",
    "FLASH_ATTN_EXT",
    "FLASH_ATTN_BACK",
    "SSM_CONV",
    "SSM_SCAN",
    "WIN_PART",
    "WIN_UNPART",
    "GET_REL_POS",
    "ADD_REL_POS",
    "RWKV_WKV6",
    "GATED_LINEAR_ATTN",
    "RWKV_WKV7",
    "SOLVE_TRI",
    "GATED_DELTA_NET",
    "LIGHTNING_INDEXER",
    "DSV4_HC_COMB",
    "DSV4_HC_PRE",
    "DSV4_HC_POST",
    "TOP_K_MASK",
    "UNARY",
    "MAP_CUSTOM1",
    "MAP_CUSTOM2",
    "MAP_CUSTOM3",
    "CUSTOM",
    "CROSS_ENTROPY_LOSS",
    "CROSS_ENTROPY_LOSS_BACK",
    "OPT_STEP_ADAMW",
    "OPT_STEP_SGD",
    "GLU",
];

/// ggml's display name of an op (newest numbering), `None` when out of range.
pub fn op_name(op: u32) -> Option<&'static str> {
    OP_NAMES.get(usize::try_from(op).ok()?).copied()
}

/// Number of unary sub-ops (`GGML_UNARY_OP_COUNT`).
pub const UNARY_OP_COUNT: i32 = 22;

/// A unary sub-op id (`op_params[0]` of a `GGML_OP_UNARY` node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnaryOp(pub i32);

#[allow(missing_docs)]
impl UnaryOp {
    /// `GGML_UNARY_OP_ABS`.
    pub const ABS: UnaryOp = UnaryOp(0);
    /// `GGML_UNARY_OP_SGN`.
    pub const SGN: UnaryOp = UnaryOp(1);
    /// `GGML_UNARY_OP_NEG`.
    pub const NEG: UnaryOp = UnaryOp(2);
    /// `GGML_UNARY_OP_STEP`.
    pub const STEP: UnaryOp = UnaryOp(3);
    /// `GGML_UNARY_OP_TANH`.
    pub const TANH: UnaryOp = UnaryOp(4);
    /// `GGML_UNARY_OP_ELU`.
    pub const ELU: UnaryOp = UnaryOp(5);
    /// `GGML_UNARY_OP_RELU`.
    pub const RELU: UnaryOp = UnaryOp(6);
    /// `GGML_UNARY_OP_SIGMOID`.
    pub const SIGMOID: UnaryOp = UnaryOp(7);
    /// `GGML_UNARY_OP_GELU`.
    pub const GELU: UnaryOp = UnaryOp(8);
    /// `GGML_UNARY_OP_GELU_QUICK`.
    pub const GELU_QUICK: UnaryOp = UnaryOp(9);
    /// `GGML_UNARY_OP_SILU`.
    pub const SILU: UnaryOp = UnaryOp(10);
    /// `GGML_UNARY_OP_HARDSWISH`.
    pub const HARDSWISH: UnaryOp = UnaryOp(11);
    /// `GGML_UNARY_OP_HARDSIGMOID`.
    pub const HARDSIGMOID: UnaryOp = UnaryOp(12);
    /// `GGML_UNARY_OP_EXP`.
    pub const EXP: UnaryOp = UnaryOp(13);
    /// `GGML_UNARY_OP_EXPM1`.
    pub const EXPM1: UnaryOp = UnaryOp(14);
    /// `GGML_UNARY_OP_SOFTPLUS`.
    pub const SOFTPLUS: UnaryOp = UnaryOp(15);
    /// `GGML_UNARY_OP_GELU_ERF`.
    pub const GELU_ERF: UnaryOp = UnaryOp(16);
    /// `GGML_UNARY_OP_XIELU`.
    pub const XIELU: UnaryOp = UnaryOp(17);
    /// `GGML_UNARY_OP_FLOOR`.
    pub const FLOOR: UnaryOp = UnaryOp(18);
    /// `GGML_UNARY_OP_CEIL`.
    pub const CEIL: UnaryOp = UnaryOp(19);
    /// `GGML_UNARY_OP_ROUND`.
    pub const ROUND: UnaryOp = UnaryOp(20);
    /// `GGML_UNARY_OP_TRUNC`.
    pub const TRUNC: UnaryOp = UnaryOp(21);
}

impl UnaryOp {
    /// Whether the id is inside ggml's unary table.
    pub fn is_valid(self) -> bool {
        (0..UNARY_OP_COUNT).contains(&self.0)
    }
}

/// Number of GLU sub-ops (`GGML_GLU_OP_COUNT`).
pub const GLU_OP_COUNT: i32 = 7;

/// A GLU sub-op id (`op_params[0]` of a `GGML_OP_GLU` node; `op_params[1]` is the swapped flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GluOp(pub i32);

#[allow(missing_docs)]
impl GluOp {
    /// `GGML_GLU_OP_REGLU`.
    pub const REGLU: GluOp = GluOp(0);
    /// `GGML_GLU_OP_GEGLU`.
    pub const GEGLU: GluOp = GluOp(1);
    /// `GGML_GLU_OP_SWIGLU`.
    pub const SWIGLU: GluOp = GluOp(2);
    /// `GGML_GLU_OP_SWIGLU_OAI`.
    pub const SWIGLU_OAI: GluOp = GluOp(3);
    /// `GGML_GLU_OP_GEGLU_ERF`.
    pub const GEGLU_ERF: GluOp = GluOp(4);
    /// `GGML_GLU_OP_GEGLU_QUICK`.
    pub const GEGLU_QUICK: GluOp = GluOp(5);
    /// `GGML_GLU_OP_SWIGLU_CLAMP`.
    pub const SWIGLU_CLAMP: GluOp = GluOp(6);
}

impl GluOp {
    /// Whether the id is inside ggml's GLU table.
    pub fn is_valid(self) -> bool {
        (0..GLU_OP_COUNT).contains(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_the_reference_numbering() {
        assert_eq!(op_name(0), Some("NONE"));
        assert_eq!(op_name(Op::MUL_MAT.0), Some("MUL_MAT"));
        assert_eq!(op_name(Op::GLU.0), Some("GLU"));
        assert_eq!(Op::FLASH_ATTN_EXT.0, 74);
        assert_eq!(op_name(91), Some("TOP_K_MASK"));
        assert_eq!((Op::UNARY.0, Op::GLU.0), (92, 101));
        assert_eq!(op_name(OP_COUNT), None);
        assert!(Op::CUSTOM.is_custom() && !Op::UNARY.is_custom());
        assert!(!Op(OP_COUNT).is_valid());
        assert!(UnaryOp::TRUNC.is_valid() && !UnaryOp(22).is_valid() && !UnaryOp(-1).is_valid());
        assert!(GluOp::SWIGLU_CLAMP.is_valid() && !GluOp(7).is_valid());
    }
}
