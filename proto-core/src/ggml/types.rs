//! The ggml tensor type table, newest (protocol 8.0.1: `f8_e4m3` added as id 43). Peers of
//! protocol 7.0.0 and 8.0.0 know ids below 43 only: see [`GgmlTable`](super::GgmlTable).

/// Number of type ids in the newest table (`GGML_TYPE_COUNT` of protocol 8.0.1).
pub const TYPE_COUNT: u32 = 44;

/// One entry of the ggml type table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeInfo {
    /// ggml's display name (`"f32"`, `"q4_K"`, ...).
    pub name: &'static str,
    /// Elements per block (1 for plain types).
    pub block_size: u32,
    /// Bytes per block.
    pub type_size: u32,
    /// ggml's `is_quantized` flag.
    pub quantized: bool,
}

const fn t(name: &'static str, block_size: u32, type_size: u32, quantized: bool) -> TypeInfo {
    TypeInfo {
        name,
        block_size,
        type_size,
        quantized,
    }
}

const REMOVED: TypeInfo = t("removed", 0, 0, false);

/// The table indexed by type id. Removed ids have a block size of 0.
static TYPES: [TypeInfo; TYPE_COUNT as usize] = [
    t("f32", 1, 4, false),
    t("f16", 1, 2, false),
    t("q4_0", 32, 18, true),
    t("q4_1", 32, 20, true),
    REMOVED,
    REMOVED,
    t("q5_0", 32, 22, true),
    t("q5_1", 32, 24, true),
    t("q8_0", 32, 34, true),
    t("q8_1", 32, 36, true),
    t("q2_K", 256, 84, true),
    t("q3_K", 256, 110, true),
    t("q4_K", 256, 144, true),
    t("q5_K", 256, 176, true),
    t("q6_K", 256, 210, true),
    t("q8_K", 256, 292, true),
    t("iq2_xxs", 256, 66, true),
    t("iq2_xs", 256, 74, true),
    t("iq3_xxs", 256, 98, true),
    t("iq1_s", 256, 50, true),
    t("iq4_nl", 32, 18, true),
    t("iq3_s", 256, 110, true),
    t("iq2_s", 256, 82, true),
    t("iq4_xs", 256, 136, true),
    t("i8", 1, 1, false),
    t("i16", 1, 2, false),
    t("i32", 1, 4, false),
    t("i64", 1, 8, false),
    t("f64", 1, 8, false),
    t("iq1_m", 256, 56, true),
    t("bf16", 1, 2, false),
    REMOVED,
    REMOVED,
    REMOVED,
    t("tq1_0", 256, 54, true),
    t("tq2_0", 256, 66, true),
    REMOVED,
    REMOVED,
    REMOVED,
    t("mxfp4", 32, 17, true),
    t("nvfp4", 64, 36, true),
    t("q1_0", 128, 18, true),
    t("q2_0", 64, 18, true),
    t("f8_e4m3", 1, 1, false),
];

/// Well-known type ids used by the protocol itself.
pub mod id {
    /// `GGML_TYPE_F32`.
    pub const F32: u32 = 0;
    /// `GGML_TYPE_F16`.
    pub const F16: u32 = 1;
    /// `GGML_TYPE_Q4_0`.
    pub const Q4_0: u32 = 2;
    /// `GGML_TYPE_Q8_0`.
    pub const Q8_0: u32 = 8;
    /// `GGML_TYPE_Q4_K`.
    pub const Q4_K: u32 = 12;
    /// `GGML_TYPE_I32`.
    pub const I32: u32 = 26;
    /// `GGML_TYPE_BF16`.
    pub const BF16: u32 = 30;
    /// `GGML_TYPE_F8_E4M3` (protocol 8.0.1).
    pub const F8_E4M3: u32 = 43;
}

/// Looks a type id up in the newest table; `None` for ids out of range and for removed ids
/// (block size 0), which is exactly the set the reference deserializer rejects.
pub fn type_info(type_id: u32) -> Option<&'static TypeInfo> {
    TYPES
        .get(usize::try_from(type_id).ok()?)
        .filter(|info| info.block_size != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_and_out_of_range_ids_are_rejected() {
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 44, 1000, u32::MAX] {
            assert!(type_info(removed).is_none(), "type {removed}");
        }
        assert_eq!(type_info(id::Q4_K).unwrap().type_size, 144);
        assert_eq!(type_info(id::BF16).unwrap().name, "bf16");
        let valid = (0..TYPE_COUNT).filter(|&i| type_info(i).is_some()).count();
        assert_eq!(valid, 36);
        assert_eq!(type_info(id::F8_E4M3).unwrap().name, "f8_e4m3");
    }
}
