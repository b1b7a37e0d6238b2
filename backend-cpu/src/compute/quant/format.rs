//! The per-type format table: one row per ggml type the quant module handles, as ggml's
//! `type_traits` / `type_traits_cpu` (block geometry, `to_float`, `from_float`,
//! `from_float_ref`, `vec_dot`, `vec_dot_type`).
//!
//! Rows name their type by ggml's type name and are placed at the type id that
//! `proto_core::ggml::types` gives that name, with the block size and bytes per block taken from
//! that same table: the type ids and block geometry live in proto-core only. Adding a type here is
//! one [`SPECS`] row plus its kernels.
//!
//! Callers look a row up once per node or row ([`format`]) and call its kernels directly, so no
//! per-element code goes through the table.

use std::sync::LazyLock;

use proto_core::ggml::{type_info, TYPE_COUNT};

use super::{
    fp4, fp8, iq1, iq2, iq3, iq4_nl, iq4_xs, k_quantize, q1_q2, q4, q5, q8, simd, ternary,
};

/// Dequantizes whole blocks: `dst.len()` elements from the prefix of `src` they take.
pub type Dequantize = fn(&[u8], &mut [f32]);
/// Quantizes `src.len()` values (whole blocks) into the prefix of `dst` they take.
pub type Quantize = fn(&[f32], &mut [u8]);
/// A row dot product: weights, activations in the weights' `vec_dot_type`.
pub type RowDot = fn(&[u8], &[u8]) -> f32;

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Format {
    /// Elements per block (ggml's `blck_size`).
    pub block_size: usize,
    /// Bytes per block (ggml's `type_size`).
    pub block_bytes: usize,
    /// The type activations are converted to before a dot product with rows of this type
    /// (ggml-cpu's `vec_dot_type`); `None` where ggml-cpu has none.
    pub vec_dot_type: Option<u32>,
    /// `to_float`, bit-exact with ggml.
    pub dequantize: Dequantize,
    /// `from_float`: what ggml-cpu runs on x86-64 (the AVX code for Q8_0 / Q8_1, the reference
    /// quantizer for the others); `None` for types that cannot be quantized into.
    pub quantize: Option<Quantize>,
    /// `from_float_ref`: ggml's reference quantizer; `None` where ggml has none here.
    pub quantize_ref: Option<Quantize>,
    /// The row dot product with activations in `vec_dot_type`; `None` for the activation-only
    /// formats (Q8_1, Q8_K).
    pub dot: Option<RowDot>,
}

impl Format {
    /// Whether values can be quantized into this type (`quantize_row` accepts it).
    pub fn can_quantize_into(&self) -> bool {
        self.quantize.is_some()
    }

    /// Bytes of `n` elements (ggml's `ggml_row_size`); `None` for `n` not a multiple of the
    /// block size.
    pub fn row_bytes(&self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size) {
            return None;
        }
        (n / self.block_size).checked_mul(self.block_bytes)
    }
}

/// A row of [`SPECS`]: the kernels of the type named `name`; ids and sizes come from
/// proto-core.
struct Spec {
    name: &'static str,
    vec_dot_type: Option<&'static str>,
    dequantize: Dequantize,
    quantize: Option<Quantize>,
    quantize_ref: Option<Quantize>,
    dot: Option<RowDot>,
}

/// A type whose `from_float` is its reference quantizer (all but Q8_0 and Q8_1).
const fn quantized_by_ref(
    name: &'static str,
    vec_dot_type: &'static str,
    dequantize: Dequantize,
    quantize: Quantize,
    dot: RowDot,
) -> Spec {
    Spec {
        name,
        vec_dot_type: Some(vec_dot_type),
        dequantize,
        quantize: Some(quantize),
        quantize_ref: Some(quantize),
        dot: Some(dot),
    }
}

/// A weight format with no quantizer (ggml-cpu has no `from_float` for the grid formats).
const fn dequantize_only(name: &'static str, dequantize: Dequantize, dot: RowDot) -> Spec {
    Spec {
        name,
        vec_dot_type: Some("q8_K"),
        dequantize,
        quantize: None,
        quantize_ref: None,
        dot: Some(dot),
    }
}

/// Every type the quant module handles, in ggml's type id order.
static SPECS: &[Spec] = &[
    quantized_by_ref(
        "f32",
        "f32",
        simd::dequantize_f32,
        simd::quantize_f32,
        simd::vec_dot_f32,
    ),
    quantized_by_ref(
        "f16",
        "f16",
        simd::dequantize_f16,
        simd::quantize_f16,
        simd::vec_dot_f16,
    ),
    quantized_by_ref(
        "q4_0",
        "q8_0",
        simd::dequantize_q4_0,
        q4::quantize_q4_0_ref,
        simd::vec_dot_q4_0_q8_0,
    ),
    quantized_by_ref(
        "q4_1",
        "q8_1",
        simd::dequantize_q4_1,
        q4::quantize_q4_1_ref,
        simd::vec_dot_q4_1_q8_1,
    ),
    quantized_by_ref(
        "q5_0",
        "q8_0",
        simd::dequantize_q5_0,
        q5::quantize_q5_0_ref,
        simd::vec_dot_q5_0_q8_0,
    ),
    quantized_by_ref(
        "q5_1",
        "q8_1",
        simd::dequantize_q5_1,
        q5::quantize_q5_1_ref,
        simd::vec_dot_q5_1_q8_1,
    ),
    Spec {
        name: "q8_0",
        vec_dot_type: Some("q8_0"),
        dequantize: simd::dequantize_q8_0,
        quantize: Some(simd::quantize_q8_0),
        quantize_ref: Some(q8::quantize_q8_0_ref),
        dot: Some(simd::vec_dot_q8_0_q8_0),
    },
    // An activation format: ggml maps it to itself but has no dot product for it.
    Spec {
        name: "q8_1",
        vec_dot_type: Some("q8_1"),
        dequantize: simd::dequantize_q8_1,
        quantize: Some(simd::quantize_q8_1),
        quantize_ref: Some(q8::quantize_q8_1_ref),
        dot: None,
    },
    quantized_by_ref(
        "q2_K",
        "q8_K",
        simd::dequantize_q2_k,
        k_quantize::quantize_q2_k_ref,
        simd::vec_dot_q2_k_q8_k,
    ),
    quantized_by_ref(
        "q3_K",
        "q8_K",
        simd::dequantize_q3_k,
        k_quantize::quantize_q3_k_ref,
        simd::vec_dot_q3_k_q8_k,
    ),
    quantized_by_ref(
        "q4_K",
        "q8_K",
        simd::dequantize_q4_k,
        k_quantize::quantize_q4_k_ref,
        simd::vec_dot_q4_k_q8_k,
    ),
    quantized_by_ref(
        "q5_K",
        "q8_K",
        simd::dequantize_q5_k,
        k_quantize::quantize_q5_k_ref,
        simd::vec_dot_q5_k_q8_k,
    ),
    quantized_by_ref(
        "q6_K",
        "q8_K",
        simd::dequantize_q6_k,
        k_quantize::quantize_q6_k_ref,
        simd::vec_dot_q6_k_q8_k,
    ),
    // The K-quants' activation format: no dot product and no `vec_dot_type` of its own.
    Spec {
        name: "q8_K",
        vec_dot_type: None,
        dequantize: simd::dequantize_q8_k,
        quantize: Some(simd::quantize_q8_k),
        quantize_ref: Some(simd::quantize_q8_k),
        dot: None,
    },
    dequantize_only(
        "iq2_xxs",
        iq2::dequantize_iq2_xxs,
        iq2::vec_dot_iq2_xxs_q8_k,
    ),
    dequantize_only("iq2_xs", iq2::dequantize_iq2_xs, iq2::vec_dot_iq2_xs_q8_k),
    dequantize_only(
        "iq3_xxs",
        iq3::dequantize_iq3_xxs,
        iq3::vec_dot_iq3_xxs_q8_k,
    ),
    dequantize_only("iq1_s", iq1::dequantize_iq1_s, iq1::vec_dot_iq1_s_q8_k),
    quantized_by_ref(
        "iq4_nl",
        "q8_0",
        iq4_nl::dequantize_iq4_nl,
        iq4_nl::quantize_iq4_nl_ref,
        iq4_nl::vec_dot_iq4_nl_q8_0,
    ),
    dequantize_only("iq3_s", iq3::dequantize_iq3_s, iq3::vec_dot_iq3_s_q8_k),
    dequantize_only("iq2_s", iq2::dequantize_iq2_s, iq2::vec_dot_iq2_s_q8_k),
    quantized_by_ref(
        "iq4_xs",
        "q8_K",
        iq4_xs::dequantize_iq4_xs,
        iq4_xs::quantize_iq4_xs_ref,
        iq4_xs::vec_dot_iq4_xs_q8_k,
    ),
    dequantize_only("iq1_m", iq1::dequantize_iq1_m, iq1::vec_dot_iq1_m_q8_k),
    quantized_by_ref(
        "bf16",
        "bf16",
        simd::dequantize_bf16,
        simd::quantize_bf16,
        simd::vec_dot_bf16,
    ),
    quantized_by_ref(
        "tq1_0",
        "q8_K",
        ternary::dequantize_tq1_0,
        ternary::quantize_tq1_0_ref,
        ternary::vec_dot_tq1_0_q8_k,
    ),
    quantized_by_ref(
        "tq2_0",
        "q8_K",
        ternary::dequantize_tq2_0,
        ternary::quantize_tq2_0_ref,
        ternary::vec_dot_tq2_0_q8_k,
    ),
    quantized_by_ref(
        "mxfp4",
        "q8_0",
        fp4::dequantize_mxfp4,
        fp4::quantize_mxfp4_ref,
        fp4::vec_dot_mxfp4_q8_0,
    ),
    quantized_by_ref(
        "nvfp4",
        "q8_0",
        fp4::dequantize_nvfp4,
        fp4::quantize_nvfp4_ref,
        fp4::vec_dot_nvfp4_q8_0,
    ),
    quantized_by_ref(
        "q1_0",
        "q8_0",
        q1_q2::dequantize_q1_0,
        q1_q2::quantize_q1_0_ref,
        q1_q2::vec_dot_q1_0_q8_0,
    ),
    quantized_by_ref(
        "q2_0",
        "q8_0",
        q1_q2::dequantize_q2_0,
        q1_q2::quantize_q2_0_ref,
        q1_q2::vec_dot_q2_0_q8_0,
    ),
    // 8.0.1 (b12032+1): one byte per element, not a "quantized" type in ggml's sense, but
    // ggml-cpu's row has the same shape (`from_float`, `vec_dot` with F32 activations).
    quantized_by_ref(
        "f8_e4m3",
        "f32",
        fp8::dequantize_f8_e4m3,
        fp8::quantize_f8_e4m3,
        simd::vec_dot_f8_e4m3_f32,
    ),
];

/// The type id proto-core's table gives the type named `name` (the spelling of
/// `ggml_type_name`).
pub fn type_id(name: &str) -> Option<u32> {
    (0..TYPE_COUNT).find(|&id| type_info(id).is_some_and(|info| info.name == name))
}

/// The type id of the ggml type named `name`, which must exist: tests name the types they
/// use this way rather than keep their own copy of the ids.
#[cfg(test)]
pub(crate) fn id(name: &str) -> u32 {
    type_id(name).unwrap_or_else(|| panic!("{name} is not a ggml type name"))
}

/// The table, indexed by type id; built on first use from [`SPECS`] and proto-core's table.
static FORMATS: LazyLock<[Option<Format>; TYPE_COUNT as usize]> = LazyLock::new(|| {
    let mut table = [None; TYPE_COUNT as usize];
    for spec in SPECS {
        let id = type_id(spec.name).expect("a format row names a ggml type");
        let info = type_info(id).expect("a known type");
        table[id as usize] = Some(Format {
            block_size: info.block_size as usize,
            block_bytes: info.type_size as usize,
            vec_dot_type: spec
                .vec_dot_type
                .map(|name| type_id(name).expect("a vec_dot_type names a ggml type")),
            dequantize: spec.dequantize,
            quantize: spec.quantize,
            quantize_ref: spec.quantize_ref,
            dot: spec.dot,
        });
    }
    table
});

/// The format of `type_id`; `None` for types the quant module does not handle.
pub fn format(type_id: u32) -> Option<&'static Format> {
    FORMATS.get(usize::try_from(type_id).ok()?)?.as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_names_a_distinct_ggml_type_in_id_order() {
        let ids: Vec<u32> = SPECS
            .iter()
            .map(|spec| type_id(spec.name).unwrap_or_else(|| panic!("{}", spec.name)))
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        for spec in SPECS {
            if let Some(vdt) = spec.vec_dot_type {
                let activations = format(type_id(vdt).unwrap()).unwrap();
                assert!(activations.can_quantize_into(), "{} -> {vdt}", spec.name);
            }
        }
    }

    #[test]
    fn block_bytes_agree_with_the_kernels() {
        use super::super::{k_quants, QK32, QK_K};
        for (name, block_size, block_bytes) in [
            ("q4_0", QK32, q4::Q4_0_BYTES),
            ("q4_1", QK32, q4::Q4_1_BYTES),
            ("q5_0", QK32, q5::Q5_0_BYTES),
            ("q5_1", QK32, q5::Q5_1_BYTES),
            ("q8_0", QK32, q8::Q8_0_BYTES),
            ("q8_1", QK32, q8::Q8_1_BYTES),
            ("q2_K", QK_K, k_quants::Q2_K_BYTES),
            ("q3_K", QK_K, k_quants::Q3_K_BYTES),
            ("q4_K", QK_K, k_quants::Q4_K_BYTES),
            ("q5_K", QK_K, k_quants::Q5_K_BYTES),
            ("q6_K", QK_K, k_quants::Q6_K_BYTES),
            ("q8_K", QK_K, q8::Q8_K_BYTES),
            ("iq4_nl", QK32, iq4_nl::IQ4_NL_BYTES),
            ("iq4_xs", QK_K, iq4_xs::IQ4_XS_BYTES),
            ("iq2_xxs", QK_K, iq2::IQ2_XXS_BYTES),
            ("iq2_xs", QK_K, iq2::IQ2_XS_BYTES),
            ("iq2_s", QK_K, iq2::IQ2_S_BYTES),
            ("iq3_xxs", QK_K, iq3::IQ3_XXS_BYTES),
            ("iq3_s", QK_K, iq3::IQ3_S_BYTES),
            ("iq1_s", QK_K, iq1::IQ1_S_BYTES),
            ("iq1_m", QK_K, iq1::IQ1_M_BYTES),
            ("mxfp4", QK32, fp4::MXFP4_BYTES),
            ("nvfp4", fp4::QK_NVFP4, fp4::NVFP4_BYTES),
            ("tq1_0", QK_K, ternary::TQ1_0_BYTES),
            ("tq2_0", QK_K, ternary::TQ2_0_BYTES),
            ("q1_0", q1_q2::QK1_0, q1_q2::Q1_0_BYTES),
            ("q2_0", q1_q2::QK2_0, q1_q2::Q2_0_BYTES),
        ] {
            let format = format(type_id(name).unwrap()).unwrap();
            assert_eq!(
                (format.block_size, format.block_bytes),
                (block_size, block_bytes),
                "{name}"
            );
        }
    }
}
