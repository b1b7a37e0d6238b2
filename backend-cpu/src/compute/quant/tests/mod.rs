//! Tests of the quantized formats: known answers, round trips, dot products against
//! dequantized dot products, activation quantizers against hand-computed ggml results, the
//! AVX2 kernels against the portable ones, and length errors.

use super::*;
use proto_core::ggml::type_info;
use proto_core::ggml::types::id as ty;

/// ggml's name of type `t`, for matching on types the tests name by string.
fn type_name(t: u32) -> &'static str {
    type_info(t).expect("a ggml type").name
}

/// Elements per block and bytes per block of `t` (the format table's).
fn block_layout(t: u32) -> Option<(usize, usize)> {
    format(t).map(|f| (f.block_size, f.block_bytes))
}

/// Every type with a `to_float` here.
fn dequant_types() -> [u32; 31] {
    [
        "f32", "f16", "bf16", "f8_e4m3", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_K",
        "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq4_nl", "iq4_xs", "mxfp4", "nvfp4", "tq1_0",
        "tq2_0", "q1_0", "q2_0", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s",
        "iq1_m",
    ]
    .map(id)
}

/// The grid formats: dequantization and dot products, no quantizer.
fn grid_types() -> [u32; 7] {
    [
        "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m",
    ]
    .map(id)
}

/// Every weight type (`supports`): all but the activation-only formats.
fn weight_types() -> Vec<u32> {
    dequant_types()
        .into_iter()
        .filter(|&t| !matches!(type_name(t), "q8_1" | "q8_K"))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Helpers

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    /// Activation-like data: mostly small, a few outliers, some exact zeros.
    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| match self.next_u64() % 50 {
                0 => 0.0,
                1 => self.unit() * 8.0,
                _ => self.unit() * (1.0 + (i % 7) as f32 * 0.25),
            })
            .collect()
    }
}

fn f16_bits(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

fn deq(type_id: u32, src: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(type_id, src, &mut out).unwrap();
    out
}

fn quant(type_id: u32, src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; row_size(type_id, src.len()).unwrap()];
    quantize_row(type_id, src, &mut out).unwrap();
    out
}

fn quant_ref(type_id: u32, src: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; row_size(type_id, src.len()).unwrap()];
    quantize_row_ref(type_id, src, &mut out).unwrap();
    out
}

/// A random K-quant row whose f16 super-block scales are small and finite (every other byte
/// pattern is a valid K-quant block).
fn random_k_row(rng: &mut Rng, type_id: u32, blocks: usize) -> Vec<u8> {
    let (_, bytes) = block_layout(type_id).unwrap();
    let mut row = rng.bytes(blocks * bytes);
    for b in row.chunks_exact_mut(bytes) {
        let mut scale = || f16_bits(0.001 + (rng.next_u64() % 1000) as f32 * 1e-5);
        match type_name(type_id) {
            "q2_K" => {
                b[80..82].copy_from_slice(&scale());
                b[82..84].copy_from_slice(&scale());
            }
            "q3_K" => b[108..110].copy_from_slice(&scale()),
            "q4_K" | "q5_K" => {
                b[0..2].copy_from_slice(&scale());
                b[2..4].copy_from_slice(&scale());
            }
            "q6_K" => b[208..210].copy_from_slice(&scale()),
            _ => unreachable!(),
        }
    }
    row
}

/// A random row of a grid format (any bytes are valid blocks) whose f16 super-block scales
/// are small and finite (IQ1_M's is spread over the top nibbles of its four scale words).
fn random_grid_row(rng: &mut Rng, type_id: u32, blocks: usize) -> Vec<u8> {
    let (_, bytes) = block_layout(type_id).unwrap();
    let mut row = rng.bytes(blocks * bytes);
    for b in row.chunks_exact_mut(bytes) {
        let h = half::f16::from_f32(0.001 + (rng.next_u64() % 1000) as f32 * 1e-5).to_bits();
        if type_id == id("iq1_m") {
            for k in 0..4 {
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0F) | ((((h >> (4 * k)) & 15) as u8) << 4);
            }
        } else {
            b[..2].copy_from_slice(&h.to_le_bytes());
        }
    }
    row
}

/// A row of weights of `type_id` for dot-product tests.
fn random_weights(rng: &mut Rng, type_id: u32, n: usize) -> Vec<u8> {
    match type_name(type_id) {
        "q2_K" | "q3_K" | "q4_K" | "q5_K" | "q6_K" => random_k_row(rng, type_id, n / QK_K),
        _ if grid_types().contains(&type_id) => random_grid_row(rng, type_id, n / QK_K),
        _ => quant_ref(type_id, &rng.floats(n)),
    }
}

// ---------------------------------------------------------------------------------------
// Tables

#[test]
fn quant_layouts_match_the_type_table() {
    for t in dequant_types() {
        let info = type_info(t).unwrap();
        let (block, bytes) = block_layout(t).unwrap();
        assert_eq!(
            (block as u32, bytes as u32),
            (info.block_size, info.type_size),
            "{}",
            info.name
        );
    }
    assert_eq!(row_size(ty::Q4_0, 64), Some(36));
    assert_eq!(row_size(ty::Q4_K, 512), Some(288));
    assert_eq!(row_size(ty::Q4_0, 33), None);
    assert_eq!(row_size(ty::F16, 3), Some(6));
    assert_eq!(row_size(id("iq4_nl"), 64), Some(36));
    assert_eq!(row_size(id("mxfp4"), 64), Some(34));
    assert_eq!(row_size(id("nvfp4"), 128), Some(72));
    assert_eq!(row_size(id("nvfp4"), 32), None);
    assert_eq!(row_size(id("q1_0"), 256), Some(36));
    assert_eq!(row_size(id("q2_0"), 64), Some(18));
    assert_eq!(row_size(id("tq1_0"), 256), Some(54));
    assert_eq!(row_size(id("iq3_s"), 512), Some(220));
    assert_eq!(block_layout(28), None); // F64
}

#[test]
fn quant_vec_dot_type_is_ggml_cpus_table() {
    let expect = [
        (ty::F32, ty::F32),
        (ty::F16, ty::F16),
        (ty::BF16, ty::BF16),
        (ty::Q4_0, ty::Q8_0),
        (id("q5_0"), ty::Q8_0),
        (ty::Q8_0, ty::Q8_0),
        (id("q4_1"), id("q8_1")),
        (id("q5_1"), id("q8_1")),
        (id("q8_1"), id("q8_1")),
        (id("q2_K"), id("q8_K")),
        (id("q3_K"), id("q8_K")),
        (ty::Q4_K, id("q8_K")),
        (id("q5_K"), id("q8_K")),
        (id("q6_K"), id("q8_K")),
        (id("iq4_nl"), ty::Q8_0),
        (id("iq4_xs"), id("q8_K")),
        (id("mxfp4"), ty::Q8_0),
        (id("nvfp4"), ty::Q8_0),
        (id("tq1_0"), id("q8_K")),
        (id("tq2_0"), id("q8_K")),
        (id("q1_0"), ty::Q8_0),
        (id("q2_0"), ty::Q8_0),
        (id("iq2_xxs"), id("q8_K")),
        (id("iq2_xs"), id("q8_K")),
        (id("iq2_s"), id("q8_K")),
        (id("iq3_xxs"), id("q8_K")),
        (id("iq3_s"), id("q8_K")),
        (id("iq1_s"), id("q8_K")),
        (id("iq1_m"), id("q8_K")),
        (ty::F8_E4M3, ty::F32),
    ];
    for (t, v) in expect {
        assert_eq!(vec_dot_type(t), Some(v), "type {t}");
    }
    for t in [id("q8_K"), 24, 26, 28, 31, 44, 1000] {
        assert_eq!(vec_dot_type(t), None, "type {t}");
    }
}

#[test]
fn quant_supports_exactly_the_weight_types() {
    for t in 0..64 {
        assert_eq!(supports(t), weight_types().contains(&t), "type {t}");
    }
}

mod c_loops;
mod dot;
mod fp8;
mod golden;
mod grids;
mod known_answers;
mod vector;
