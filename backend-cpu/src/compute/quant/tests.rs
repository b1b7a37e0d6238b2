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
fn dequant_types() -> [u32; 30] {
    [
        "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K",
        "q4_K", "q5_K", "q6_K", "q8_K", "iq4_nl", "iq4_xs", "mxfp4", "nvfp4", "tq1_0", "tq2_0",
        "q1_0", "q2_0", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m",
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
    ];
    for (t, v) in expect {
        assert_eq!(vec_dot_type(t), Some(v), "type {t}");
    }
    for t in [id("q8_K"), 24, 26, 28, 31, 43, 1000] {
        assert_eq!(vec_dot_type(t), None, "type {t}");
    }
}

#[test]
fn quant_supports_exactly_the_weight_types() {
    for t in 0..64 {
        assert_eq!(supports(t), weight_types().contains(&t), "type {t}");
    }
}

// ---------------------------------------------------------------------------------------
// Known answers: dequantization

#[test]
fn quant_dequantize_q4_0_known_answer() {
    // d = 0.5; qs[j] = j (low) | (15 - j) << 4 (high)
    let mut b = f16_bits(0.5).to_vec();
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let out = deq(ty::Q4_0, &b, 32);
    for j in 0..16 {
        assert_eq!(out[j], (j as f32 - 8.0) * 0.5);
        assert_eq!(out[j + 16], (7.0 - j as f32) * 0.5);
    }
}

#[test]
fn quant_dequantize_q4_1_known_answer() {
    // d = 0.25, m = -1
    let mut b = f16_bits(0.25).to_vec();
    b.extend(f16_bits(-1.0));
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let out = deq(id("q4_1"), &b, 32);
    for j in 0..16 {
        assert_eq!(out[j], j as f32 * 0.25 - 1.0);
        assert_eq!(out[j + 16], (15 - j) as f32 * 0.25 - 1.0);
    }
}

#[test]
fn quant_dequantize_q5_known_answers() {
    // qh bit j set for even j (elements 0..32); nibbles as in Q4
    let qh: u32 = 0x5555_5555;
    let nibbles: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let expect_q = |e: usize| -> i32 {
        let nib = if e < 16 {
            e as i32
        } else {
            15 - (e as i32 - 16)
        };
        nib + if e.is_multiple_of(2) { 16 } else { 0 }
    };

    let mut b = f16_bits(2.0).to_vec();
    b.extend(qh.to_le_bytes());
    b.extend(&nibbles);
    let out = deq(id("q5_0"), &b, 32);
    for (e, v) in out.iter().enumerate() {
        assert_eq!(*v, (expect_q(e) - 16) as f32 * 2.0, "q5_0 element {e}");
    }

    let mut b = f16_bits(0.5).to_vec();
    b.extend(f16_bits(3.0));
    b.extend(qh.to_le_bytes());
    b.extend(&nibbles);
    let out = deq(id("q5_1"), &b, 32);
    for (e, v) in out.iter().enumerate() {
        assert_eq!(*v, expect_q(e) as f32 * 0.5 + 3.0, "q5_1 element {e}");
    }
}

#[test]
fn quant_dequantize_q8_known_answers() {
    let qs: Vec<u8> = (0..32).map(|j| (j as i8 * 4 - 64) as u8).collect();
    let mut b = f16_bits(0.125).to_vec();
    b.extend(&qs);
    let out = deq(ty::Q8_0, &b, 32);
    for (j, v) in out.iter().enumerate() {
        assert_eq!(*v, (j as f32 * 4.0 - 64.0) * 0.125);
    }

    let mut b = f16_bits(0.125).to_vec();
    b.extend(f16_bits(99.0)); // s plays no part in dequantization
    b.extend(&qs);
    assert_eq!(deq(id("q8_1"), &b, 32), out);

    let mut b = 0.75f32.to_le_bytes().to_vec();
    b.extend((0..256).map(|j| (j as u8).wrapping_sub(128)));
    b.extend([0u8; 32]);
    let out = deq(id("q8_K"), &b, 256);
    for (j, v) in out.iter().enumerate() {
        assert_eq!(*v, 0.75 * ((j as u8).wrapping_sub(128) as i8) as f32);
    }
}

#[test]
fn quant_dequantize_float_known_answers() {
    let f16: Vec<u8> = [0x3C00u16, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00]
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect();
    let out = deq(ty::F16, &f16, 6);
    assert_eq!(&out[..5], &[1.0, -2.0, 65504.0, 2f32.powi(-24), -0.0]);
    assert_eq!(out[5], f32::INFINITY);

    let bf16: Vec<u8> = [0x3F80u16, 0xC040, 0x0001]
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect();
    assert_eq!(
        deq(ty::BF16, &bf16, 3),
        vec![1.0, -3.0, f32::from_bits(0x0001_0000)]
    );

    let f32s: Vec<u8> = [1.5f32, -0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(deq(ty::F32, &f32s, 2), vec![1.5, -0.25]);
}

/// Q2_K block: scale nibble and min nibble of group g are g % 16 and 15 - g; quants count up.
#[test]
fn quant_dequantize_q2_k_known_answer() {
    let mut b = vec![0u8; 84];
    for (g, s) in b.iter_mut().take(16).enumerate() {
        *s = (g as u8) | ((15 - g as u8) << 4);
    }
    // element 128n + 32j + l has quant (l + j + n) % 4
    for n in 0..2 {
        for l in 0..32 {
            let mut byte = 0u8;
            for j in 0..4 {
                byte |= (((l + j + n) % 4) as u8) << (2 * j);
            }
            b[16 + 32 * n + l] = byte;
        }
    }
    b[80..82].copy_from_slice(&f16_bits(0.5));
    b[82..84].copy_from_slice(&f16_bits(0.25));
    let out = deq(id("q2_K"), &b, 256);
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let e = 128 * n + 32 * j + l;
                let g = e / 16;
                let q = ((l + j + n) % 4) as f32;
                let expect = 0.5 * g as f32 * q - 0.25 * (15 - g) as f32;
                assert_eq!(out[e], expect, "element {e}");
            }
        }
    }
}

/// Q3_K block: all 16 scales set through the packed 12 bytes, high bits from hmask.
#[test]
fn quant_dequantize_q3_k_known_answer() {
    // 6-bit scale of group g: 2g + 1 (so sc - 32 = 2g - 31)
    let six: Vec<u8> = (0..16).map(|g| 2 * g as u8 + 1).collect();
    let mut scales = [0u8; 12];
    for (j, &l) in six.iter().enumerate() {
        if j < 8 {
            scales[j] = l & 0x0F;
        } else {
            scales[j - 8] |= (l & 0x0F) << 4;
        }
        scales[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
    }
    let mut b = vec![0u8; 110];
    // low bits of element 128n + 32j + l: (l + j) % 4; high bit (hmask bit 4n + j of byte l)
    // set when l is even
    for n in 0..2 {
        for l in 0..32 {
            let mut byte = 0u8;
            for j in 0..4 {
                byte |= (((l + j) % 4) as u8) << (2 * j);
                if l % 2 == 0 {
                    b[l] |= 1 << (4 * n + j);
                }
            }
            b[32 + 32 * n + l] = byte;
        }
    }
    b[96..108].copy_from_slice(&scales);
    b[108..110].copy_from_slice(&f16_bits(0.5));
    let out = deq(id("q3_K"), &b, 256);
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let e = 128 * n + 32 * j + l;
                let sc = 2 * (e / 16) as i32 + 1 - 32;
                let q = ((l + j) % 4) as i32 - if l % 2 == 0 { 0 } else { 4 };
                assert_eq!(out[e], 0.5 * sc as f32 * q as f32, "element {e}");
            }
        }
    }
}

/// Packs 8 six-bit scales and mins as ggml's Q4_K/Q5_K quantizers do.
fn pack_k4_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = sc[j];
            s[j + 4] = m[j];
        } else {
            s[j + 4] = (sc[j] & 0x0F) | ((m[j] & 0x0F) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (m[j] >> 4) << 6;
        }
    }
    s
}

#[test]
fn quant_k4_scales_unpack() {
    let sc = [1, 17, 33, 63, 0, 47, 31, 62];
    let m = [63, 2, 40, 16, 5, 60, 33, 1];
    let packed = pack_k4_scales(sc, m);
    assert_eq!(k_quants::scales_mins_k4(&packed), (sc, m));
}

#[test]
fn quant_dequantize_q4_k_and_q5_k_known_answers() {
    let sc = [1, 17, 33, 63, 0, 47, 31, 62];
    let m = [63, 2, 40, 16, 5, 60, 33, 1];
    let packed = pack_k4_scales(sc, m);
    // element 64j + l: low nibble (l + j) % 16; 64j + 32 + l: high nibble (31 - l) % 16
    let nib = |e: usize| -> u8 {
        let (j, r) = (e / 64, e % 64);
        if r < 32 {
            ((r + j) % 16) as u8
        } else {
            ((31 - (r - 32)) % 16) as u8
        }
    };
    let mut qs = vec![0u8; 128];
    for j in 0..4 {
        for l in 0..32 {
            qs[32 * j + l] = nib(64 * j + l) | (nib(64 * j + 32 + l) << 4);
        }
    }
    let mut b = f16_bits(0.5).to_vec();
    b.extend(f16_bits(0.125));
    b.extend(packed);
    b.extend(&qs);
    let out = deq(ty::Q4_K, &b, 256);
    for (e, v) in out.iter().enumerate() {
        let g = e / 32;
        let expect = 0.5 * f32::from(sc[g]) * f32::from(nib(e)) - 0.125 * f32::from(m[g]);
        assert_eq!(*v, expect, "q4_K element {e}");
    }

    // Q5_K: fifth bit set for elements whose index is a multiple of 3
    let mut qh = vec![0u8; 32];
    for e in (0..256).step_by(3) {
        let (j, r) = (e / 64, e % 64);
        let bit = if r < 32 { 2 * j } else { 2 * j + 1 };
        qh[r % 32] |= 1 << bit;
    }
    let mut b = f16_bits(0.5).to_vec();
    b.extend(f16_bits(0.125));
    b.extend(packed);
    b.extend(&qh);
    b.extend(&qs);
    let out = deq(id("q5_K"), &b, 256);
    for (e, v) in out.iter().enumerate() {
        let g = e / 32;
        let q = nib(e) + if e % 3 == 0 { 16 } else { 0 };
        let expect = 0.5 * f32::from(sc[g]) * f32::from(q) - 0.125 * f32::from(m[g]);
        assert_eq!(*v, expect, "q5_K element {e}");
    }
}

#[test]
fn quant_dequantize_q6_k_known_answer() {
    // element e has the 6-bit value (e * 7) % 64, group g scale g * 9 - 70 (signed)
    let q6 = |e: usize| ((e * 7) % 64) as u8;
    let mut b = vec![0u8; 210];
    for n in 0..2 {
        for l in 0..32 {
            let base = 128 * n + l;
            let (a0, a1, a2, a3) = (q6(base), q6(base + 32), q6(base + 64), q6(base + 96));
            b[64 * n + l] = (a0 & 0x0F) | ((a2 & 0x0F) << 4);
            b[64 * n + 32 + l] = (a1 & 0x0F) | ((a3 & 0x0F) << 4);
            b[128 + 32 * n + l] =
                (a0 >> 4) | ((a1 >> 4) << 2) | ((a2 >> 4) << 4) | ((a3 >> 4) << 6);
        }
    }
    for g in 0..16 {
        b[192 + g] = (g as i32 * 9 - 70) as i8 as u8;
    }
    b[208..210].copy_from_slice(&f16_bits(0.25));
    let out = deq(id("q6_K"), &b, 256);
    for (e, v) in out.iter().enumerate() {
        let sc = (e / 16) as f32 * 9.0 - 70.0;
        let expect = 0.25 * sc * (f32::from(q6(e)) - 32.0);
        assert_eq!(*v, expect, "element {e}");
    }
}

// ---------------------------------------------------------------------------------------
// Activation quantizers: hand-computed ggml results

/// Block of 32 with amax 127 (so d = 1 and both multipliers are exactly 1) and ties.
fn tie_block() -> Vec<f32> {
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 3.5;
    x[4] = 0.5;
    x[5] = -0.5;
    x[6] = 1.49;
    x[7] = -126.5;
    x[8] = 100.0;
    x
}

#[test]
fn quant_q8_0_matches_ggml_cpu_x86_rounding() {
    // ggml-cpu's AVX quantize_row_q8_0: d = 127/127 = 1, q = round half to even
    let y = quant(ty::Q8_0, &tie_block());
    assert_eq!(&y[..2], &[0x00, 0x3C]); // f16 1.0
    let q: Vec<i8> = y[2..].iter().map(|&b| b as i8).collect();
    assert_eq!(&q[..9], &[127, 2, -2, 4, 0, 0, 1, -126, 100]);
    assert!(q[9..].iter().all(|&v| v == 0));
}

#[test]
fn quant_q8_0_ref_rounds_half_away_from_zero() {
    let y = quant_ref(ty::Q8_0, &tie_block());
    assert_eq!(&y[..2], &[0x00, 0x3C]);
    let q: Vec<i8> = y[2..].iter().map(|&b| b as i8).collect();
    assert_eq!(&q[..9], &[127, 3, -3, 4, 1, -1, 1, -127, 100]);
}

#[test]
fn quant_q8_0_all_zero_block() {
    for y in [quant(ty::Q8_0, &[0.0; 64]), quant_ref(ty::Q8_0, &[0.0; 64])] {
        assert_eq!(y, vec![0u8; 68]);
    }
    // -0.0 too: amax is 0
    assert_eq!(quant(ty::Q8_0, &[-0.0; 32]), vec![0u8; 34]);
}

#[test]
fn quant_q8_0_multiplier_is_127_over_amax() {
    // amax = 11: the CPU multiplier 127/11 = 11.545455 puts 5.5 at 63.500004 (-> 64); the
    // reference one, 1 / f32(11/127) = 11.545454, at 63.499996 (-> 63)
    let mut x = vec![0f32; 32];
    x[0] = 11.0;
    x[1] = 5.5;
    x[2] = -5.5;
    x[3] = 0.5; // 5.77 -> 6 either way
    let y = quant(ty::Q8_0, &x);
    assert_eq!(&y[..2], &f16_bits(11.0 / 127.0));
    assert_eq!(&y[2..6], &[127, 64, (-64i8) as u8, 6]);
    let r = quant_ref(ty::Q8_0, &x);
    assert_eq!(&r[..2], &f16_bits(11.0 / 127.0));
    assert_eq!(&r[2..6], &[127, 63, (-63i8) as u8, 6]);
    // and on random data: q = round_ties_even(x * 127/amax) exactly
    let mut rng = Rng::new(7);
    let x = rng.floats(32 * 64);
    let y = quant(ty::Q8_0, &x);
    for (xb, yb) in x.chunks_exact(32).zip(y.chunks_exact(34)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        assert_eq!([yb[0], yb[1]], f16_bits(amax / 127.0));
        for (v, &q) in xb.iter().zip(&yb[2..]) {
            assert_eq!(q as i8, (v * id).round_ties_even() as i8);
        }
    }
}

#[test]
fn quant_q8_1_stores_d_times_sum() {
    let x = tie_block();
    let y = quant(id("q8_1"), &x);
    let q: Vec<i8> = y[4..].iter().map(|&b| b as i8).collect();
    assert_eq!(&q[..9], &[127, 2, -2, 4, 0, 0, 1, -126, 100]);
    let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
    assert_eq!(sum, 106);
    assert_eq!(&y[..2], &f16_bits(1.0));
    assert_eq!(&y[2..4], &f16_bits(106.0));

    let y = quant_ref(id("q8_1"), &x);
    let q: Vec<i8> = y[4..].iter().map(|&b| b as i8).collect();
    assert_eq!(&q[..9], &[127, 3, -3, 4, 1, -1, 1, -127, 100]);
    assert_eq!(&y[2..4], &f16_bits(105.0));

    assert_eq!(quant(id("q8_1"), &[0.0; 32]), vec![0u8; 36]);
}

fn q8k_parts(b: &[u8]) -> (f32, Vec<i8>, Vec<i16>) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let qs = b[4..260].iter().map(|&v| v as i8).collect();
    let bsums = b[260..292]
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect();
    (d, qs, bsums)
}

#[test]
fn quant_q8_k_matches_ggml_nearest_int() {
    // max = -127 (largest magnitude): iscale = 1, d = 1; ties go to even (nearest_int)
    let mut x = vec![0f32; 256];
    x[0] = -127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 3.5;
    x[4] = 0.5;
    x[5] = 1.5;
    x[16] = 126.5;
    x[17] = -0.5000001;
    let y = quant(id("q8_K"), &x);
    let (d, qs, bsums) = q8k_parts(&y);
    assert_eq!(d, 1.0);
    assert_eq!(&qs[..6], &[-127, 2, -2, 4, 0, 2]);
    assert_eq!(&qs[16..18], &[126, -1]);
    assert_eq!(bsums[0], -127 + 2 - 2 + 4 + 2);
    assert_eq!(bsums[1], 125);
    assert!(bsums[2..].iter().all(|&s| s == 0));

    // a positive max gives a negative scale: iscale = -127 / 127 = -1, d = -1
    x[0] = 127.0;
    let y = quant(id("q8_K"), &x);
    let (d, qs, _) = q8k_parts(&y);
    assert_eq!(d, -1.0);
    assert_eq!(&qs[..6], &[-127, -2, 2, -4, 0, -2]);

    // the first of two equal magnitudes is the max
    let mut x = vec![0f32; 256];
    x[3] = 2.0;
    x[9] = -2.0;
    let (d, qs, _) = q8k_parts(&quant(id("q8_K"), &x));
    assert_eq!(d, 1.0 / (-127.0f32 / 2.0));
    assert_eq!((qs[3], qs[9]), (-127, 127));

    // all-zero blocks, also after a non-zero one
    let mut x = vec![0f32; 512];
    x[0] = 1.0;
    let y = quant(id("q8_K"), &x);
    assert_eq!(&y[292..], &[0u8; 292][..]);
    assert_eq!(quant_ref(id("q8_K"), &x), y);
}

#[test]
fn quant_f16_and_bf16_round_to_nearest_even() {
    let ties = [
        1.0 + 2f32.powi(-11),       // halfway: down to even 1.0
        1.0 + 3.0 * 2f32.powi(-11), // halfway: up to even 1 + 2^-9
        65519.0,
        65520.0,         // rounds up to infinity
        -2f32.powi(-25), // halfway to the smallest subnormal: to -0
        f32::NAN,
    ];
    let y = quant(ty::F16, &ties);
    let h: Vec<u16> = y
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(&h[..5], &[0x3C00, 0x3C02, 0x7BFF, 0x7C00, 0x8000]);
    assert!(h[5] & 0x7C00 == 0x7C00 && h[5] & 0x03FF != 0);

    let x = [
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        f32::from_bits(0x7F80_0001), // signalling NaN: made quiet
        f32::from_bits(0xFFC1_2345),
        f32::MAX,                    // rounds to infinity
        f32::from_bits(0x0000_8000), // subnormal tie: to even (0)
    ];
    let y = quant(ty::BF16, &x);
    let h: Vec<u16> = y
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(h, vec![0x3F80, 0x3F82, 0x7FC0, 0xFFC1, 0x7F80, 0x0000]);

    // random values agree with the half crate (no NaNs)
    let mut rng = Rng::new(3);
    for _ in 0..10_000 {
        let v = f32::from_bits(rng.next_u64() as u32);
        if v.is_nan() {
            continue;
        }
        assert_eq!(float::f32_to_bf16(v), float::half_bf16(v), "{v:e}");
        let y = quant(ty::F16, &[v]);
        assert_eq!(y, f16_bits(v).to_vec());
    }
}

#[test]
fn quant_f16_to_f32_is_exact_for_every_half() {
    for h in 0..=u16::MAX {
        let want = half::f16::from_bits(h).to_f32();
        let got = f16_to_f32(h);
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#06x}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Round trips

/// Quantizes random rows and checks every dequantized element against the format's bound.
#[test]
fn quant_round_trips_within_format_bounds() {
    let mut rng = Rng::new(11);
    let n = 32 * 40;
    let x = rng.floats(n);
    for t in ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1"].map(id) {
        for y in [quant(t, &x), quant_ref(t, &x)] {
            let back = deq(t, &y, n);
            let (_, bytes) = block_layout(t).unwrap();
            for (blk, (xb, bb)) in x.chunks_exact(32).zip(back.chunks_exact(32)).enumerate() {
                let b = &y[blk * bytes..];
                let d = fp16(b[0], b[1]).abs();
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                // one quantization step where the top level is clamped (Q4_0/Q5_0), half a
                // step otherwise, plus the f16 rounding of d and m
                let step = match type_name(t) {
                    "q4_0" | "q5_0" => d,
                    _ => 0.5 * d,
                };
                let bound = step + 2e-3 * amax + 1e-6;
                for (j, (a, r)) in xb.iter().zip(bb).enumerate() {
                    assert!(
                        (a - r).abs() <= bound,
                        "type {t} block {blk} elem {j}: {a} -> {r} (bound {bound})"
                    );
                }
            }
        }
    }
    // Q8_K: half a step of |d|
    let x = rng.floats(256 * 4);
    let y = quant(id("q8_K"), &x);
    let back = deq(id("q8_K"), &y, x.len());
    for (blk, (xb, bb)) in x.chunks_exact(256).zip(back.chunks_exact(256)).enumerate() {
        let (d, _, _) = q8k_parts(&y[blk * 292..]);
        for (a, r) in xb.iter().zip(bb) {
            assert!((a - r).abs() <= 0.5 * d.abs() * 1.0001, "{a} -> {r}");
        }
    }
    // F16 / BF16 / F32
    for (t, rel) in [
        (ty::F16, 2f32.powi(-11)),
        (ty::BF16, 2f32.powi(-8)),
        (ty::F32, 0.0),
    ] {
        let back = deq(t, &quant(t, &x), x.len());
        for (a, r) in x.iter().zip(&back) {
            assert!(
                (a - r).abs() <= a.abs() * rel + 1e-7,
                "type {t}: {a} -> {r}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// K-quant quantizers against ggml's own bytes

/// Rows quantized by the real ggml (`quantize_row_q*_K_ref` of libggml-base b11434), written
/// by `scripts/conformance/quant-golden.py`: zeros, constants, tiny values around
/// `GROUP_MAX_EPS`, a huge range, outliers, rounding ties, zero groups, random rows.
const K_GOLDEN_INPUT: &[u8] = include_bytes!("../../../tests/data/k_quant_golden/input.f32");
fn k_golden() -> [(u32, &'static [u8]); 5] {
    [
        (
            id("q2_K"),
            include_bytes!("../../../tests/data/k_quant_golden/q2_k.bin"),
        ),
        (
            id("q3_K"),
            include_bytes!("../../../tests/data/k_quant_golden/q3_k.bin"),
        ),
        (
            ty::Q4_K,
            include_bytes!("../../../tests/data/k_quant_golden/q4_k.bin"),
        ),
        (
            id("q5_K"),
            include_bytes!("../../../tests/data/k_quant_golden/q5_k.bin"),
        ),
        (
            id("q6_K"),
            include_bytes!("../../../tests/data/k_quant_golden/q6_k.bin"),
        ),
    ]
}

fn k_golden_input() -> Vec<f32> {
    K_GOLDEN_INPUT
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn quant_k_quants_match_ggml_golden_bytes() {
    let x = k_golden_input();
    assert_eq!(x.len() % QK_K, 0);
    for (t, want) in k_golden() {
        let (_, bytes) = block_layout(t).unwrap();
        assert_eq!(want.len(), x.len() / QK_K * bytes, "type {t}: golden size");
        // whole input at once, and row by row (quantization is per super-block)
        for got in [quant(t, &x), quant_ref(t, &x)] {
            for (row, (g, w)) in got
                .chunks_exact(bytes)
                .zip(want.chunks_exact(bytes))
                .enumerate()
            {
                assert_eq!(g, w, "type {t}: row {row} differs from ggml");
            }
        }
        for (row, xs) in x.chunks_exact(QK_K).enumerate() {
            assert_eq!(
                quant(t, xs),
                &want[row * bytes..(row + 1) * bytes],
                "type {t} row {row}"
            );
        }
    }
}

/// IQ4_NL against ggml's `quantize_row_iq4_nl_ref` on the same rows (8 blocks each). ggml
/// leaves the indices of an all-zero block to whatever its scratch array held, so only `d`
/// (zero) is compared for those.
#[test]
fn quant_iq4_nl_matches_ggml_golden_bytes() {
    let want: &[u8] = include_bytes!("../../../tests/data/k_quant_golden/iq4_nl.bin");
    let x = k_golden_input();
    assert_eq!(want.len(), x.len() / 32 * 18);
    let mut zero_blocks = 0;
    for got in [quant(id("iq4_nl"), &x), quant_ref(id("iq4_nl"), &x)] {
        for (blk, (g, w)) in got.chunks_exact(18).zip(want.chunks_exact(18)).enumerate() {
            if w[..2] == [0, 0] {
                assert_eq!(g[..2], [0, 0], "block {blk}: d");
                zero_blocks += 1;
            } else {
                assert_eq!(g, w, "block {blk} differs from ggml");
            }
        }
    }
    assert!(zero_blocks < 2 * 40, "too few blocks compared");
    // and the values round-trip within about half the widest gap of the table (24 steps of d;
    // the least-squares refit of d after choosing the indices moves them by up to 2% of amax)
    let back = deq(id("iq4_nl"), &quant(id("iq4_nl"), &x), x.len());
    let y = quant(id("iq4_nl"), &x);
    for (blk, (xb, bb)) in x.chunks_exact(32).zip(back.chunks_exact(32)).enumerate() {
        let d = fp16(y[blk * 18], y[blk * 18 + 1]).abs();
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        // (a scale below f16's range rounds to zero: everything dequantizes to zero)
        let bound = if d == 0.0 {
            amax
        } else {
            12.0 * d + 0.02 * amax
        };
        for (a, r) in xb.iter().zip(bb) {
            assert!((a - r).abs() <= bound, "block {blk}: {a} -> {r} (d {d})");
        }
    }
}

/// The formats added after IQ4_NL against the real ggml (`scripts/conformance/quant-golden.py`):
/// `quantize_row_*_ref` on `input.f32` + `input_ext.f32` (which adds power-of-two and
/// rounding-boundary scales, subnormals, infinities and NaN), byte for byte, through both
/// [`quantize_row`] and [`quantize_row_ref`]; and `dequantize_row_*` of random blocks, bit for
/// bit.
#[test]
fn quant_new_formats_match_ggml_golden() {
    const DIR: &str = "k_quant_golden";
    macro_rules! golden {
        ($name:literal) => {
            (
                include_bytes!(concat!(
                    "../../../tests/data/",
                    "k_quant_golden/",
                    $name,
                    ".bin"
                ))
                .as_slice(),
                include_bytes!(concat!(
                    "../../../tests/data/",
                    "k_quant_golden/deq_",
                    $name,
                    ".bin"
                ))
                .as_slice(),
            )
        };
    }
    let ext: &[u8] = include_bytes!("../../../tests/data/k_quant_golden/input_ext.f32");
    let mut x = k_golden_input();
    x.extend(
        ext.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    // (type, (quantized rows, random blocks + their dequantization))
    #[allow(clippy::type_complexity)]
    let cases: [(u32, (&[u8], &[u8])); 7] = [
        (id("iq4_xs"), golden!("iq4_xs")),
        (id("mxfp4"), golden!("mxfp4")),
        (id("nvfp4"), golden!("nvfp4")),
        (id("tq1_0"), golden!("tq1_0")),
        (id("tq2_0"), golden!("tq2_0")),
        (id("q1_0"), golden!("q1_0")),
        (id("q2_0"), golden!("q2_0")),
    ];
    for (t, (want, deq_data)) in cases {
        let (block, bytes) = block_layout(t).unwrap();
        assert_eq!(want.len(), x.len() / block * bytes, "{DIR}: type {t}");
        for got in [quant(t, &x), quant_ref(t, &x)] {
            for (blk, (g, w)) in got
                .chunks_exact(bytes)
                .zip(want.chunks_exact(bytes))
                .enumerate()
            {
                assert_eq!(
                    g,
                    w,
                    "type {t} block {blk} (values {:?}..)",
                    &x[blk * block..blk * block + 4]
                );
            }
        }
        let raw_len = deq_data.len() / (bytes + 4 * block) * bytes;
        let (raw, want_f) = deq_data.split_at(raw_len);
        let n = raw_len / bytes * block;
        assert_eq!(want_f.len(), 4 * n);
        let got = deq(t, raw, n);
        for (i, (g, w)) in got.iter().zip(want_f.chunks_exact(4)).enumerate() {
            let w = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert_eq!(g.to_bits(), w.to_bits(), "type {t} element {i}: {g} vs {w}");
        }
    }
}

/// Any bytes are valid blocks of the new formats (NaN and infinite scales included): the
/// dequantizers and dot products take them without panicking, and the quantizers take any
/// floats.
#[test]
fn quant_new_formats_take_arbitrary_input() {
    let mut rng = Rng::new(29);
    for t in ["iq4_xs", "mxfp4", "nvfp4", "tq1_0", "tq2_0", "q1_0", "q2_0"].map(id) {
        for _ in 0..20 {
            let n = 1024;
            let x = rng.bytes(row_size(t, n).unwrap());
            let yt = vec_dot_type(t).unwrap();
            let y = rng.bytes(row_size(yt, n).unwrap());
            let _ = deq(t, &x, n);
            let _ = vec_dot(t, n, &x, &y).unwrap();
            let f: Vec<f32> = rng
                .bytes(4 * n)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let _ = quant(t, &f);
        }
        // lengths that are not whole blocks are errors
        let (block, bytes) = block_layout(t).unwrap();
        assert!(dequantize_row(t, &vec![0u8; 2 * bytes], &mut vec![0f32; block + 1]).is_err());
        assert!(dequantize_row(t, &vec![0u8; bytes - 1], &mut vec![0f32; block]).is_err());
        assert!(quantize_row(t, &vec![0f32; block], &mut vec![0u8; bytes - 1]).is_err());
        assert!(vec_dot(t, block, &vec![0u8; bytes], &[0u8; 8]).is_err());
    }
}

/// Quantize then dequantize the new formats on ordinary data: each element within a bound of
/// the format's step.
#[test]
fn quant_new_formats_round_trip() {
    let mut rng = Rng::new(23);
    let x = rng.floats(256 * 8);
    for t in ["iq4_xs", "mxfp4", "nvfp4", "tq2_0", "tq1_0", "q2_0", "q1_0"].map(id) {
        let back = deq(t, &quant(t, &x), x.len());
        let block = block_layout(t).unwrap().0;
        let sub = match type_name(t) {
            "nvfp4" => 16,
            "iq4_xs" => 32,
            _ => block,
        };
        for (xb, bb) in x.chunks_exact(sub).zip(back.chunks_exact(sub)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mean = xb.iter().map(|v| v.abs()).sum::<f32>() / sub as f32;
            // E2M1's widest gap is 2 of its 6 (a third of amax, halved, with the power-of-two
            // scale up to twice too large for MXFP4); IQ4 about an eighth; ternary and Q2_0
            // half a step of amax; Q1_0 keeps only the sign at the mean magnitude
            let bound = match type_name(t) {
                "mxfp4" => amax / 3.0 * 1.01,
                "nvfp4" => amax / 6.0 * 1.07,
                "iq4_xs" => amax * 0.15,
                "tq1_0" | "tq2_0" | "q2_0" => amax * 0.5 * 1.001,
                _ => amax + mean,
            };
            for (a, r) in xb.iter().zip(bb) {
                assert!(
                    (a - r).abs() <= bound,
                    "type {t}: {a} -> {r} (bound {bound})"
                );
            }
            if t == id("q1_0") {
                for (a, r) in xb.iter().zip(bb) {
                    assert_eq!(*a >= 0.0, *r >= 0.0, "Q1_0 keeps the sign of {a}");
                }
            }
        }
    }
}

/// Quantize then dequantize: the error of each element stays within a bound derived from the
/// row's range, and quantizing the dequantized row again is stable enough to stay close.
#[test]
fn quant_k_quants_round_trip() {
    let mut rng = Rng::new(77);
    let n = QK_K * 6;
    let x = rng.floats(n);
    for (t, levels) in [
        (id("q2_K"), 3.0f32),
        (id("q3_K"), 7.0),
        (ty::Q4_K, 15.0),
        (id("q5_K"), 31.0),
        (id("q6_K"), 63.0),
    ] {
        let back = deq(t, &quant(t, &x), n);
        for (blk, (xb, bb)) in x
            .chunks_exact(QK_K)
            .zip(back.chunks_exact(QK_K))
            .enumerate()
        {
            let (lo, hi) = xb
                .iter()
                .fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            // a step of the coarsest group, with slack for the 4/6-bit scales and the scale search
            let bound = (hi - lo) / levels * 1.5;
            let mut err2 = 0f64;
            for (j, (a, r)) in xb.iter().zip(bb).enumerate() {
                assert!(
                    (a - r).abs() <= bound,
                    "type {t} block {blk} elem {j}: {a} -> {r} (bound {bound})"
                );
                err2 += f64::from(a - r).powi(2);
            }
            let var: f64 = xb.iter().map(|&v| f64::from(v).powi(2)).sum();
            let rel = err2 / var;
            let max_rel = match type_name(t) {
                "q2_K" => 0.2,
                "q3_K" => 0.06,
                "q4_K" => 0.02,
                "q5_K" => 0.005,
                _ => 0.002,
            };
            assert!(
                rel < max_rel,
                "type {t} block {blk}: relative squared error {rel}"
            );
        }
        // all zeros stay zeros; odd inputs do not panic
        assert!(deq(t, &quant(t, &[0.0; QK_K]), QK_K)
            .iter()
            .all(|&v| v == 0.0));
        for v in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            -0.0,
        ] {
            let mut row = rng.floats(QK_K);
            row[3] = v;
            let _ = quant(t, &row);
            let _ = quant(t, &[v; QK_K]);
        }
        // a partial super-block is refused, a short destination too
        let mut out = vec![0u8; 1000];
        assert!(quantize_row(t, &[0.0; 100], &mut out).is_err());
        assert!(quantize_row(t, &[0.0; QK_K], &mut out[..10]).is_err());
    }
}

#[test]
fn quant_q4_0_ref_quantizer_known_block() {
    // max = -16 (largest magnitude, negative): d = 2, id = 0.5
    let mut x = vec![0f32; 32];
    x[0] = -16.0;
    x[1] = 14.0; // 7 + 8.5 = 15.5 -> 15
    x[2] = 3.0; // 1.5 + 8.5 = 10
    x[16] = -1.0; // -0.5 + 8.5 = 8
    x[17] = 15.9; // 7.95 + 8.5 = 16.45 -> 16 -> clamped to 15
    let y = quant_ref(ty::Q4_0, &x);
    assert_eq!(&y[..2], &f16_bits(2.0));
    assert_eq!(y[2], 8 << 4); // element 0: q 0; element 16: q 8
    assert_eq!(y[3], 15 | (15 << 4));
    assert_eq!(y[4], 10 | (8 << 4));
}

// ---------------------------------------------------------------------------------------
// Dot products

/// vec_dot against the f64 dot product of the dequantized rows.
#[test]
fn quant_vec_dot_matches_dequantized_dot() {
    let mut rng = Rng::new(5);
    for t in weight_types() {
        for blocks in [1usize, 3, 16] {
            let n = blocks * block_layout(t).unwrap().0;
            let x = random_weights(&mut rng, t, n);
            let yt = vec_dot_type(t).unwrap();
            let y = quant(yt, &rng.floats(n));
            let dx = deq(t, &x, n);
            let dy = deq(yt, &y, n);
            let exact: f64 = dx
                .iter()
                .zip(&dy)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let scale: f64 = dx
                .iter()
                .zip(&dy)
                .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                .sum();
            let got = f64::from(vec_dot(t, n, &x, &y).unwrap());
            // Q4_1/Q5_1 use the Q8_1 block's f16 `s = d * sum(q)` for the min term
            let rel = if matches!(type_name(t), "q4_1" | "q5_1") {
                2e-3
            } else {
                1e-5
            };
            assert!(
                (got - exact).abs() <= rel * scale + 1e-6,
                "type {t} n {n}: {got} vs {exact} (scale {scale})"
            );
        }
    }
}

/// The Q4_1/Q5_1 dot products use the stored `s`; check against ggml's formula computed by
/// hand from the blocks.
#[test]
fn quant_vec_dot_q4_1_uses_stored_s() {
    let mut rng = Rng::new(9);
    let x = quant_ref(id("q4_1"), &rng.floats(64));
    let y = quant(id("q8_1"), &rng.floats(64));
    let mut expect = 0f32;
    for (xb, yb) in x.chunks_exact(20).zip(y.chunks_exact(36)) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += i32::from(xb[4 + j] & 15) * i32::from(yb[4 + j] as i8);
            sumi += i32::from(xb[4 + j] >> 4) * i32::from(yb[20 + j] as i8);
        }
        expect += (fp16(xb[0], xb[1]) * fp16(yb[0], yb[1])) * sumi as f32
            + fp16(xb[2], xb[3]) * fp16(yb[2], yb[3]);
    }
    assert_eq!(vec_dot(id("q4_1"), 64, &x, &y).unwrap(), expect);
}

/// ggml's generic K-quant dot products (8 integer lanes, f32 lane sums) written as in
/// `ggml-cpu/quants.c`, for Q6_K: ours combines per super-block and must agree closely.
#[test]
fn quant_vec_dot_q6_k_close_to_ggml_generic_lanes() {
    let mut rng = Rng::new(21);
    let n = 256 * 8;
    let x = random_k_row(&mut rng, id("q6_K"), 8);
    let y = quant(id("q8_K"), &rng.floats(n));
    let mut sums = [0f32; 8];
    for (xb, yb) in x.chunks_exact(210).zip(y.chunks_exact(292)) {
        let mut a = [0i8; 256];
        k_quants::unpack_q6_k(xb.try_into().unwrap(), &mut a);
        let mut aux32 = [0i32; 8];
        for g in 0..32 {
            let scale = i32::from(xb[192 + g / 2] as i8);
            for l in 0..8 {
                aux32[l] += scale * i32::from(yb[4 + 8 * g + l] as i8) * i32::from(a[8 * g + l]);
            }
        }
        let d = fp16(xb[208], xb[209]) * f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let generic: f32 = sums.iter().sum();
    let ours = vec_dot(id("q6_K"), n, &x, &y).unwrap();
    assert!(
        (ours - generic).abs() <= 1e-5 * generic.abs().max(1.0),
        "{ours} vs {generic}"
    );
}

/// The AVX2 kernels give bit-identical results to the portable ones, including Q8 quants of
/// -128 (which ggml's own quantizers never produce).
#[test]
fn quant_avx2_kernels_match_portable_bit_for_bit() {
    if !simd::avx2_active() {
        eprintln!("no AVX2 on this CPU: the portable kernels are the only ones");
    }
    let mut rng = Rng::new(13);
    for round in 0..20 {
        let blocks = 1 + round % 9;
        // Q4_0 / Q8_0 with random bytes (d made finite)
        let mut x4 = rng.bytes(18 * blocks);
        let mut x8 = rng.bytes(34 * blocks);
        let mut y8 = rng.bytes(34 * blocks);
        for b in x4.chunks_exact_mut(18) {
            b[..2].copy_from_slice(&f16_bits(rng.unit()));
        }
        for b in x8.chunks_exact_mut(34).chain(y8.chunks_exact_mut(34)) {
            b[..2].copy_from_slice(&f16_bits(rng.unit()));
        }
        assert_eq!(
            simd::vec_dot_q4_0_q8_0(&x4, &y8).to_bits(),
            q4::vec_dot_q4_0_q8_0(&x4, &y8).to_bits()
        );
        assert_eq!(
            simd::vec_dot_q8_0_q8_0(&x8, &y8).to_bits(),
            q8::vec_dot_q8_0_q8_0(&x8, &y8).to_bits()
        );
        // Q4_1 / Q5_0 / Q5_1 against Q8_0 / Q8_1 with random bytes (f16 fields made finite)
        let mut x41 = rng.bytes(20 * blocks);
        let mut x50 = rng.bytes(22 * blocks);
        let mut x51 = rng.bytes(24 * blocks);
        let mut y81 = rng.bytes(36 * blocks);
        for b in x41
            .chunks_exact_mut(20)
            .chain(x51.chunks_exact_mut(24))
            .chain(y81.chunks_exact_mut(36))
        {
            b[..2].copy_from_slice(&f16_bits(rng.unit()));
            b[2..4].copy_from_slice(&f16_bits(rng.unit() * 4.0));
        }
        for b in x50.chunks_exact_mut(22) {
            b[..2].copy_from_slice(&f16_bits(rng.unit()));
        }
        assert_eq!(
            simd::vec_dot_q4_1_q8_1(&x41, &y81).to_bits(),
            q4::vec_dot_q4_1_q8_1(&x41, &y81).to_bits()
        );
        assert_eq!(
            simd::vec_dot_q5_0_q8_0(&x50, &y8).to_bits(),
            q5::vec_dot_q5_0_q8_0(&x50, &y8).to_bits()
        );
        assert_eq!(
            simd::vec_dot_q5_1_q8_1(&x51, &y81).to_bits(),
            q5::vec_dot_q5_1_q8_1(&x51, &y81).to_bits()
        );
        // F16 rows of every length around the 32-lane steps
        let len = round * 7 + (round % 3) * 32;
        let fx = quant(ty::F16, &rng.floats(len));
        let fy = quant(ty::F16, &rng.floats(len));
        assert_eq!(
            simd::vec_dot_f16(&fx, &fy).to_bits(),
            float::vec_dot_f16(&fx, &fy).to_bits(),
            "f16 length {len}"
        );
        // K-quants against random Q8_K bytes (bsums need not match the quants: both paths
        // read them the same way)
        let mut yk = rng.bytes(292 * blocks);
        for b in yk.chunks_exact_mut(292) {
            b[..4].copy_from_slice(&rng.unit().to_le_bytes());
        }
        let k4 = random_k_row(&mut rng, ty::Q4_K, blocks);
        let k5 = random_k_row(&mut rng, id("q5_K"), blocks);
        let k6 = random_k_row(&mut rng, id("q6_K"), blocks);
        assert_eq!(
            simd::vec_dot_q4_k_q8_k(&k4, &yk).to_bits(),
            k_quants::vec_dot_q4_k_q8_k(&k4, &yk).to_bits()
        );
        assert_eq!(
            simd::vec_dot_q5_k_q8_k(&k5, &yk).to_bits(),
            k_quants::vec_dot_q5_k_q8_k(&k5, &yk).to_bits()
        );
        assert_eq!(
            simd::vec_dot_q6_k_q8_k(&k6, &yk).to_bits(),
            k_quants::vec_dot_q6_k_q8_k(&k6, &yk).to_bits()
        );
    }
}

/// The AVX2-compiled instances of the portable kernels (dequantizers, quantizers, the other
/// dot products) give the same bits as the plain ones.
#[test]
fn quant_multiversioned_kernels_match_portable() {
    type Deq = fn(&[u8], &mut [f32]);
    let mut rng = Rng::new(17);
    let n = 512;
    let deqs: [(u32, Deq, Deq); 15] = [
        (ty::F32, simd::dequantize_f32, float::dequantize_f32),
        (ty::F16, simd::dequantize_f16, float::dequantize_f16),
        (ty::BF16, simd::dequantize_bf16, float::dequantize_bf16),
        (ty::Q4_0, simd::dequantize_q4_0, q4::dequantize_q4_0),
        (id("q4_1"), simd::dequantize_q4_1, q4::dequantize_q4_1),
        (id("q5_0"), simd::dequantize_q5_0, q5::dequantize_q5_0),
        (id("q5_1"), simd::dequantize_q5_1, q5::dequantize_q5_1),
        (ty::Q8_0, simd::dequantize_q8_0, q8::dequantize_q8_0),
        (id("q8_1"), simd::dequantize_q8_1, q8::dequantize_q8_1),
        (id("q8_K"), simd::dequantize_q8_k, q8::dequantize_q8_k),
        (id("q2_K"), simd::dequantize_q2_k, k_quants::dequantize_q2_k),
        (id("q3_K"), simd::dequantize_q3_k, k_quants::dequantize_q3_k),
        (ty::Q4_K, simd::dequantize_q4_k, k_quants::dequantize_q4_k),
        (id("q5_K"), simd::dequantize_q5_k, k_quants::dequantize_q5_k),
        (id("q6_K"), simd::dequantize_q6_k, k_quants::dequantize_q6_k),
    ];
    for (t, fast, portable) in deqs {
        let x = match type_name(t) {
            "q2_K" | "q3_K" | "q4_K" | "q5_K" | "q6_K" => random_k_row(&mut rng, t, n / 256),
            "q8_1" => quant(t, &rng.floats(n)),
            _ => quant_ref(t, &rng.floats(n)),
        };
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        fast(&x, &mut a);
        portable(&x, &mut b);
        let same = a.iter().zip(&b).all(|(u, v)| u.to_bits() == v.to_bits());
        assert!(same, "dequantize type {t}");
    }

    type Quant = fn(&[f32], &mut [u8]);
    let quants: [(u32, Quant, Quant); 6] = [
        (ty::F32, simd::quantize_f32, float::quantize_f32),
        (ty::F16, simd::quantize_f16, float::quantize_f16),
        (ty::BF16, simd::quantize_bf16, float::quantize_bf16),
        (ty::Q8_0, simd::quantize_q8_0, q8::quantize_q8_0),
        (id("q8_1"), simd::quantize_q8_1, q8::quantize_q8_1),
        (id("q8_K"), simd::quantize_q8_k, q8::quantize_q8_k),
    ];
    let mut src = rng.floats(n);
    src[5] = f32::NAN;
    src[300] = f32::INFINITY;
    // blocks of zeros, of signed zeros and of halves (ties), one with a NaN only, one
    // with huge and tiny values
    src[32..64].fill(0.0);
    src[64..96]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = if i % 2 == 0 { -0.0 } else { 0.0 });
    src[96..128]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = i as f32 - 15.5);
    src[128..160].fill(f32::NAN);
    src[160..192]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = if i % 3 == 0 { 3e38 } else { 1e-30 * i as f32 });
    src[192..224]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = -(i as f32) * 1e-6);
    for (t, fast, portable) in quants {
        let size = row_size(t, n).unwrap();
        let (mut a, mut b) = (vec![0u8; size], vec![0u8; size]);
        fast(&src, &mut a);
        portable(&src, &mut b);
        assert_eq!(a, b, "quantize type {t}");
    }
    // the F16 round trip in one pass: the bits of quantizing to F16 and widening back, on
    // the same edge cases (odd lengths included)
    for len in [n, n - 3, 5] {
        let mut bytes = vec![0u8; 2 * len];
        let mut want = vec![0f32; len];
        float::quantize_f16(&src[..len], &mut bytes);
        float::dequantize_f16(&bytes, &mut want);
        let (mut fast, mut portable) = (src[..len].to_vec(), src[..len].to_vec());
        simd::round_f16(&mut fast);
        float::round_f16(&mut portable);
        for got in [&fast, &portable] {
            let same = got
                .iter()
                .zip(&want)
                .all(|(u, v)| u.to_bits() == v.to_bits());
            assert!(same, "round_f16, {len} values");
        }
    }

    type Dot = fn(&[u8], &[u8]) -> f32;
    let dots: [(u32, Dot, Dot); 4] = [
        (ty::F32, simd::vec_dot_f32, float::vec_dot_f32),
        (ty::BF16, simd::vec_dot_bf16, float::vec_dot_bf16),
        (
            id("q2_K"),
            simd::vec_dot_q2_k_q8_k,
            k_quants::vec_dot_q2_k_q8_k,
        ),
        (
            id("q3_K"),
            simd::vec_dot_q3_k_q8_k,
            k_quants::vec_dot_q3_k_q8_k,
        ),
    ];
    for (t, fast, portable) in dots {
        let x = random_weights(&mut rng, t, n);
        let y = quant(vec_dot_type(t).unwrap(), &rng.floats(n));
        assert_eq!(
            fast(&x, &y).to_bits(),
            portable(&x, &y).to_bits(),
            "vec_dot type {t}"
        );
    }
}

#[test]
fn quant_float_dots() {
    let mut rng = Rng::new(23);
    for n in [1usize, 7, 64, 100, 1000] {
        let a = rng.floats(n);
        let b = rng.floats(n);
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        let scale: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (f64::from(*x) * f64::from(*y)).abs())
            .sum();
        let got = vec_dot(ty::F32, n, &quant(ty::F32, &a), &quant(ty::F32, &b)).unwrap();
        assert!(
            (f64::from(got) - exact).abs() <= 1e-6 * scale + 1e-9,
            "f32 n {n}"
        );
        for t in [ty::F16, ty::BF16] {
            let (qa, qb) = (quant(t, &a), quant(t, &b));
            let (da, db) = (deq(t, &qa, n), deq(t, &qb, n));
            let exact: f64 = da
                .iter()
                .zip(&db)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let got = vec_dot(t, n, &qa, &qb).unwrap();
            assert!(
                (f64::from(got) - exact).abs() <= 1e-6 * scale + 1e-9,
                "type {t} n {n}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Errors instead of panics

#[test]
fn quant_bad_lengths_are_errors() {
    let is_backend = |r: Result<()>| matches!(r, Err(Error::Backend(_)));
    let mut out = vec![0f32; 33];
    assert!(is_backend(dequantize_row(ty::Q4_0, &[0u8; 100], &mut out)));
    let mut out = vec![0f32; 64];
    assert!(is_backend(dequantize_row(ty::Q4_0, &[0u8; 35], &mut out)));
    assert!(is_backend(dequantize_row(
        id("q6_K"),
        &[0u8; 419],
        &mut [0f32; 512]
    )));
    assert!(dequantize_row(ty::Q4_0, &[0u8; 40], &mut out).is_ok()); // longer source is fine
    assert!(dequantize_row(ty::Q4_K, &[], &mut []).is_ok());

    let mut dst = vec![0u8; 33];
    assert!(is_backend(quantize_row(ty::Q8_0, &[0f32; 32], &mut dst)));
    assert!(is_backend(quantize_row(
        ty::Q8_0,
        &[0f32; 31],
        &mut [0u8; 100]
    )));
    assert!(is_backend(quantize_row(
        id("q8_K"),
        &[0f32; 256],
        &mut [0u8; 291]
    )));
    assert!(is_backend(quantize_row(ty::F16, &[0f32; 4], &mut [0u8; 7])));

    let x = vec![0u8; 18 * 2];
    let y = vec![0u8; 34 * 2];
    assert!(matches!(
        vec_dot(ty::Q4_0, 63, &x, &y),
        Err(Error::Backend(_))
    ));
    assert!(matches!(
        vec_dot(ty::Q4_0, 64, &x[..35], &y),
        Err(Error::Backend(_))
    ));
    assert!(matches!(
        vec_dot(ty::Q4_0, 64, &x, &y[..67]),
        Err(Error::Backend(_))
    ));
    assert!(matches!(
        vec_dot(ty::Q4_K, 256, &[0u8; 144], &[0u8; 100]),
        Err(Error::Backend(_))
    ));
    assert_eq!(vec_dot(ty::Q4_0, 64, &x, &y).unwrap(), 0.0);
    assert_eq!(vec_dot(ty::F16, 0, &[], &[]).unwrap(), 0.0);
}

#[test]
fn quant_unsupported_types_are_refused() {
    let refused = |r: Result<()>| matches!(r, Err(Error::OpRefused { .. }));
    for t in [24u32, 28, 31, 43, 1000] {
        assert!(refused(dequantize_row(t, &[0u8; 1000], &mut [0f32; 256])));
        assert!(refused(quantize_row(t, &[0f32; 256], &mut [0u8; 1000])));
        assert!(matches!(
            vec_dot(t, 256, &[0u8; 1000], &[0u8; 1000]),
            Err(Error::OpRefused { .. })
        ));
    }
    // the grid formats have no quantizer (ggml-cpu has no from_float for them)
    for t in grid_types() {
        assert!(refused(quantize_row(t, &[0f32; 256], &mut [0u8; 1000])));
        assert!(refused(quantize_row_ref(t, &[0f32; 256], &mut [0u8; 1000])));
    }
    // no dot products with activation formats as weights
    for t in ["q8_1", "q8_K"].map(id) {
        assert!(matches!(
            vec_dot(t, 256, &[0u8; 1000], &[0u8; 1000]),
            Err(Error::OpRefused { .. })
        ));
    }
}

// ---------------------------------------------------------------------------------------
// Cross-checks against ggml's loops written out as in C (pointer walking, ggml's own scale
// decoding with the kmask tricks), on random blocks.

fn c_fp16(b: &[u8], at: usize) -> f32 {
    fp16(b[at], b[at + 1])
}

/// `dequantize_row_q2_K` as written in ggml.
fn c_dequantize_q2_k(b: &[u8], y: &mut Vec<f32>) {
    let d = c_fp16(b, 80);
    let min = c_fp16(b, 82);
    let mut q = 16;
    let mut is = 0;
    for _n in 0..2 {
        let mut shift = 0;
        for _j in 0..4 {
            for half in 0..2 {
                let sc = b[is];
                is += 1;
                let dl = d * f32::from(sc & 0xF);
                let ml = min * f32::from(sc >> 4);
                for l in 0..16 {
                    y.push(dl * f32::from(((b[q + l + 16 * half] >> shift) & 3) as i8) - ml);
                }
            }
            shift += 2;
        }
        q += 32;
    }
}

/// `dequantize_row_q3_K` as written in ggml (scales through `aux` and the kmasks).
fn c_dequantize_q3_k(b: &[u8], y: &mut Vec<f32>) {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let d_all = c_fp16(b, 108);
    let word =
        |i: usize| u32::from_le_bytes([b[96 + 4 * i], b[97 + 4 * i], b[98 + 4 * i], b[99 + 4 * i]]);
    let mut aux = [word(0), word(1), word(2), 0];
    let tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4);
    aux[3] = ((aux[1] >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4);
    aux[0] = (aux[0] & KMASK2) | ((tmp & KMASK1) << 4);
    aux[1] = (aux[1] & KMASK2) | (((tmp >> 2) & KMASK1) << 4);
    let scales: Vec<i8> = aux
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .map(|v| v as i8)
        .collect();
    let mut q = 32;
    let mut m = 1u8;
    let mut is = 0;
    for _n in 0..2 {
        let mut shift = 0;
        for _j in 0..4 {
            for half in 0..2 {
                let dl = d_all * f32::from(scales[is] - 32);
                is += 1;
                for l in 0..16 {
                    let idx = l + 16 * half;
                    let low = ((b[q + idx] >> shift) & 3) as i8;
                    let high = if b[idx] & m != 0 { 0 } else { 4 };
                    y.push(dl * f32::from(low - high));
                }
            }
            shift += 2;
            m <<= 1;
        }
        q += 32;
    }
}

/// The Q4_K/Q5_K scales and mins as ggml's dot products decode them (`utmp` and kmasks).
fn c_k4_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let mut utmp = [word(0), word(1), word(2), 0];
    utmp[3] = ((utmp[2] >> 4) & KMASK2) | (((utmp[1] >> 6) & KMASK3) << 4);
    let uaux = utmp[1] & KMASK1;
    utmp[1] = (utmp[2] & KMASK2) | (((utmp[0] >> 6) & KMASK3) << 4);
    utmp[2] = uaux;
    utmp[0] &= KMASK1;
    let bytes: Vec<u8> = utmp.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    sc.copy_from_slice(&bytes[..8]);
    m.copy_from_slice(&bytes[8..]);
    (sc, m)
}

/// `dequantize_row_q4_K` / `dequantize_row_q5_K` as written in ggml.
fn c_dequantize_q45_k(b: &[u8], five: bool, y: &mut Vec<f32>) {
    let d = c_fp16(b, 0);
    let min = c_fp16(b, 2);
    let (sc, m) = c_k4_scales(&b[4..16]);
    let mut ql = if five { 48 } else { 16 };
    let (mut u1, mut u2) = (1u8, 2u8);
    for j in 0..4 {
        let (d1, m1) = (d * f32::from(sc[2 * j]), min * f32::from(m[2 * j]));
        let (d2, m2) = (d * f32::from(sc[2 * j + 1]), min * f32::from(m[2 * j + 1]));
        for l in 0..32 {
            let h = if five && b[16 + l] & u1 != 0 { 16 } else { 0 };
            y.push(d1 * f32::from((b[ql + l] & 0xF) + h) - m1);
        }
        for l in 0..32 {
            let h = if five && b[16 + l] & u2 != 0 { 16 } else { 0 };
            y.push(d2 * f32::from((b[ql + l] >> 4) + h) - m2);
        }
        ql += 32;
        u1 <<= 2;
        u2 <<= 2;
    }
}

/// `dequantize_row_q6_K` as written in ggml.
fn c_dequantize_q6_k(b: &[u8], y: &mut Vec<f32>) {
    let d = c_fp16(b, 208);
    let mut out = [0f32; 256];
    let (mut ql, mut qh, mut sc, mut yo) = (0, 128, 192, 0);
    for _n in 0..2 {
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((b[ql + l] & 0xF) | ((b[qh + l] & 3) << 4)) as i8 - 32;
            let q2 = ((b[ql + l + 32] & 0xF) | (((b[qh + l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((b[ql + l] >> 4) | (((b[qh + l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((b[ql + l + 32] >> 4) | (((b[qh + l] >> 6) & 3) << 4)) as i8 - 32;
            let s = |k: usize| f32::from(b[sc + is + k] as i8);
            out[yo + l] = d * s(0) * f32::from(q1);
            out[yo + l + 32] = d * s(2) * f32::from(q2);
            out[yo + l + 64] = d * s(4) * f32::from(q3);
            out[yo + l + 96] = d * s(6) * f32::from(q4);
        }
        yo += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
    y.extend_from_slice(&out);
}

#[test]
fn quant_k_dequantizers_match_ggml_loops_bit_for_bit() {
    let mut rng = Rng::new(29);
    let blocks = 6;
    for t in ["q2_K", "q3_K", "q4_K", "q5_K", "q6_K"].map(id) {
        let x = random_k_row(&mut rng, t, blocks);
        let (_, bytes) = block_layout(t).unwrap();
        let mut expect = Vec::new();
        for b in x.chunks_exact(bytes) {
            match type_name(t) {
                "q2_K" => c_dequantize_q2_k(b, &mut expect),
                "q3_K" => c_dequantize_q3_k(b, &mut expect),
                "q4_K" => c_dequantize_q45_k(b, false, &mut expect),
                "q5_K" => c_dequantize_q45_k(b, true, &mut expect),
                _ => c_dequantize_q6_k(b, &mut expect),
            }
        }
        let got = deq(t, &x, blocks * 256);
        let same = got
            .iter()
            .zip(&expect)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "type {t}");
    }
    // and the two Q4_K scale decodings agree on every byte pattern of random blocks
    for _ in 0..1000 {
        let s: [u8; 12] = rng.bytes(12).try_into().unwrap();
        assert_eq!(k_quants::scales_mins_k4(&s), c_k4_scales(&s));
    }
}

/// Random Q5_0 / Q5_1 / Q4_x blocks against ggml's loops (the `qh` bit extraction of the dot
/// product, `((qh & (1 << (j + 16))) >> (j + 12))`, differs in form from dequantization's).
#[test]
fn quant_q5_dot_matches_ggml_generic_loop() {
    let mut rng = Rng::new(31);
    let blocks = 5;
    let mut x = rng.bytes(22 * blocks);
    for b in x.chunks_exact_mut(22) {
        b[..2].copy_from_slice(&f16_bits(rng.unit()));
    }
    let y = quant(ty::Q8_0, &rng.floats(32 * blocks));
    let mut sumf = 0f32;
    for (xb, yb) in x.chunks_exact(22).zip(y.chunks_exact(34)) {
        let qh = u32::from_le_bytes([xb[2], xb[3], xb[4], xb[5]]);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            let xh0 = (((qh & (1 << j)) >> j) << 4) as u8;
            let xh1 = ((qh & (1 << (j + 16))) >> (j + 12)) as u8;
            let x0 = ((xb[6 + j] & 0x0F) | xh0) as i32 - 16;
            let x1 = ((xb[6 + j] >> 4) | xh1) as i32 - 16;
            s0 += x0 * i32::from(yb[2 + j] as i8);
            s1 += x1 * i32::from(yb[18 + j] as i8);
        }
        sumf += (fp16(xb[0], xb[1]) * fp16(yb[0], yb[1])) * (s0 + s1) as f32;
    }
    assert_eq!(vec_dot(id("q5_0"), 32 * blocks, &x, &y).unwrap(), sumf);
}

// ---------------------------------------------------------------------------------------
// The grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)

/// 64-bit FNV-1a, as `quant-golden.py` hashes ggml's dequantization of the grid walks.
fn fnv1a64(data: impl IntoIterator<Item = u8>) -> u64 {
    data.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// ggml's `dequantize_row_*` (libggml-base of b11434, through `quant-golden.py`): random
/// blocks bit for bit, and blocks whose grid indices walk through every entry of the grid
/// (the tables of `iq_grids.rs`) through a hash of ggml's output.
#[test]
fn quant_grid_formats_match_ggml_golden() {
    macro_rules! golden {
        ($name:literal) => {
            (
                include_bytes!(concat!(
                    "../../../tests/data/k_quant_golden/deq_",
                    $name,
                    ".bin"
                ))
                .as_slice(),
                include_bytes!(concat!(
                    "../../../tests/data/k_quant_golden/grid_",
                    $name,
                    ".bin"
                ))
                .as_slice(),
            )
        };
    }
    #[allow(clippy::type_complexity)]
    let cases: [(u32, usize, (&[u8], &[u8])); 7] = [
        (id("iq2_xxs"), 256, golden!("iq2_xxs")),
        (id("iq2_xs"), 512, golden!("iq2_xs")),
        (id("iq2_s"), 1024, golden!("iq2_s")),
        (id("iq3_xxs"), 256, golden!("iq3_xxs")),
        (id("iq3_s"), 512, golden!("iq3_s")),
        (id("iq1_s"), 2048, golden!("iq1_s")),
        (id("iq1_m"), 2048, golden!("iq1_m")),
    ];
    for (t, grid_len, (deq_data, walk)) in cases {
        let (block, bytes) = block_layout(t).unwrap();
        let raw_len = deq_data.len() / (bytes + 4 * block) * bytes;
        assert!(raw_len > 0, "type {t}");
        let (raw, want_f) = deq_data.split_at(raw_len);
        let n = raw_len / bytes * block;
        assert_eq!(want_f.len(), 4 * n, "type {t}");
        let got = deq(t, raw, n);
        for (i, (g, w)) in got.iter().zip(want_f.chunks_exact(4)).enumerate() {
            let w = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert_eq!(g.to_bits(), w.to_bits(), "type {t} element {i}: {g} vs {w}");
        }

        let (raw, digest) = walk.split_at(walk.len() - 8);
        assert_eq!(raw.len() % bytes, 0, "type {t}");
        let n = raw.len() / bytes * block;
        // every grid entry once: 8 elements per entry for the 8-wide grids, 4 for IQ3's
        let per_entry = if matches!(type_name(t), "iq3_xxs" | "iq3_s") {
            4
        } else {
            8
        };
        assert_eq!(n, grid_len * per_entry, "type {t}");
        let got = deq(t, raw, n);
        let want = u64::from_le_bytes(digest.try_into().unwrap());
        assert_eq!(
            fnv1a64(got.iter().flat_map(|v| v.to_le_bytes())),
            want,
            "type {t}: dequantization of the grid walk differs from ggml's"
        );
    }
}

/// Structure of the generated tables: the IQ2 grids hold magnitudes 8, 25 and 43, IQ3_XXS's
/// 4, 12, ..., 52, 62, IQ3_S's odd 1..15, IQ1_S's values -1, 0 and 1; no grid repeats a point;
/// the sign table gives every 7-bit pattern an even number of set bits.
#[test]
fn quant_grid_tables_are_well_formed() {
    use super::iq_grids::*;
    use std::collections::HashSet;
    fn check<T: Copy + Eq + std::hash::Hash>(
        name: &str,
        grid: &[T],
        bytes: fn(T) -> Vec<u8>,
        ok: fn(u8) -> bool,
    ) {
        let distinct: HashSet<T> = grid.iter().copied().collect();
        assert_eq!(distinct.len(), grid.len(), "{name}: repeated points");
        for &p in grid {
            assert!(bytes(p).into_iter().all(ok), "{name}: bad point");
        }
    }
    let u64b = |p: u64| p.to_le_bytes().to_vec();
    let u32b = |p: u32| p.to_le_bytes().to_vec();
    check("iq2xxs", &IQ2XXS_GRID, u64b, |v| matches!(v, 8 | 25 | 43));
    check("iq2xs", &IQ2XS_GRID, u64b, |v| matches!(v, 8 | 25 | 43));
    check("iq2s", &IQ2S_GRID, u64b, |v| matches!(v, 8 | 25 | 43));
    check("iq3xxs", &IQ3XXS_GRID, u32b, |v| {
        matches!(v, 4 | 12 | 20 | 28 | 36 | 44 | 52 | 62)
    });
    check("iq3s", &IQ3S_GRID, u32b, |v| v % 2 == 1 && v <= 15);
    check("iq1s", &IQ1S_GRID, u64b, |v| matches!(v, 0 | 1 | 0xFF));
    for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
        assert_eq!(usize::from(s & 127), i);
        assert_eq!(s.count_ones() % 2, 0, "ksigns[{i}]");
    }
}

/// Hand-built blocks: the scales, signs, index bits and deltas land where ggml puts them.
#[test]
fn quant_grid_formats_known_answers() {
    use super::iq_grids::*;
    let one = f16_bits(1.0);

    // IQ2_XXS: block 1 has grid indices 0, 1, 2, 3, sign pattern 1 (elements 0 and 7 negative)
    // for group 0, scale 3: db = (0.5 + 3) * 0.25
    let mut b = vec![0u8; 66];
    b[..2].copy_from_slice(&one);
    b[10..14].copy_from_slice(&[0, 1, 2, 3]);
    b[14..18].copy_from_slice(&(1u32 | (3 << 28)).to_le_bytes());
    let y = deq(id("iq2_xxs"), &b, 256);
    let db = 0.875f32;
    for l in 0..4 {
        let g = IQ2XXS_GRID[l].to_le_bytes();
        for j in 0..8 {
            let neg = l == 0 && (j == 0 || j == 7);
            let want = db * f32::from(g[j]) * if neg { -1.0 } else { 1.0 };
            assert_eq!(y[32 + 8 * l + j], want, "iq2_xxs l {l} j {j}");
        }
    }
    // block 0: all indices 0, scale 0: 0.125 * 8
    assert!(y[..32].iter().all(|&v| v == 1.0));

    // IQ3_S: block 3 (odd: high nibble of scales[1]), group 2, second index with qh bit 5
    let mut b = vec![0u8; 110];
    b[..2].copy_from_slice(&one);
    b[2 + 24 + 4] = 7; // qs[8*3 + 2*2]
    b[2 + 24 + 5] = 9; // qs[8*3 + 2*2 + 1]
    b[66 + 3] = 1 << 5; // qh[3]: high bit of the second index of group 2
    b[74 + 12 + 2] = 0b0001_0000; // signs[4*3 + 2]: element 4 of group 2 negative
    b[106 + 1] = 5 << 4; // scales[1] >> 4 = 5: db = 11
    let y = deq(id("iq3_s"), &b, 256);
    let (g1, g2) = (IQ3S_GRID[7].to_le_bytes(), IQ3S_GRID[256 + 9].to_le_bytes());
    for j in 0..4 {
        assert_eq!(y[96 + 16 + j], 11.0 * f32::from(g1[j]));
        let s = if j == 0 { -1.0 } else { 1.0 };
        assert_eq!(y[96 + 16 + 4 + j], 11.0 * f32::from(g2[j]) * s);
    }

    // IQ1_S: block 2, group 1 with index 5 | 6 << 8, scale 2 (dl = 5), negative delta
    let mut b = vec![0u8; 50];
    b[..2].copy_from_slice(&one);
    b[2 + 8 + 1] = 5;
    let qh: u16 = (6 << 3) | (2 << 12) | 0x8000;
    b[34 + 4..34 + 6].copy_from_slice(&qh.to_le_bytes());
    let y = deq(id("iq1_s"), &b, 256);
    let g = IQ1S_GRID[5 | (6 << 8)].to_le_bytes();
    for j in 0..8 {
        assert_eq!(y[64 + 8 + j], 5.0 * (f32::from(g[j] as i8) - 0.125));
    }
    // group 0 of block 2: index 0 (all -1), same scale and delta
    assert!(y[64..72].iter().all(|&v| v == 5.0 * (-1.0 - 0.125)));

    // IQ1_M: d = 1.0 (f16 0x3C00 spread over the scale words' top nibbles), block 1 group 3:
    // index 4 | 2 << 8 with a negative delta, scale (scales[0] >> 9) & 7 = 3 (dl = 7)
    let mut b = vec![0u8; 56];
    let mut sc = [0u16; 4];
    for (k, s) in sc.iter_mut().enumerate() {
        *s = ((0x3C00u16 >> (4 * k)) & 15) << 12;
    }
    sc[0] |= 3 << 9;
    for (k, s) in sc.iter().enumerate() {
        b[48 + 2 * k..50 + 2 * k].copy_from_slice(&s.to_le_bytes());
    }
    b[4 + 3] = 4;
    b[32 + 3] = (2 | 8) << 4; // qh[2*1 + 1], high nibble: index bits and delta sign
    let y = deq(id("iq1_m"), &b, 256);
    let g = IQ1S_GRID[4 | (2 << 8)].to_le_bytes();
    for j in 0..8 {
        assert_eq!(y[32 + 24 + j], 7.0 * (f32::from(g[j] as i8) - 0.125));
    }
    // group 0 of block 0: index 0, scale 0 (dl = 1), positive delta
    assert!(y[..8].iter().all(|&v| v == -1.0 + 0.125));
}

/// Any bytes are valid blocks of the grid formats (NaN and infinite scales included): the
/// dequantizers and dot products take them without panicking; partial blocks are errors.
#[test]
fn quant_grid_formats_take_arbitrary_input() {
    let mut rng = Rng::new(37);
    for t in grid_types() {
        for _ in 0..20 {
            let n = 1024;
            let x = rng.bytes(row_size(t, n).unwrap());
            let y = rng.bytes(row_size(id("q8_K"), n).unwrap());
            let _ = deq(t, &x, n);
            let _ = vec_dot(t, n, &x, &y).unwrap();
        }
        let (block, bytes) = block_layout(t).unwrap();
        assert!(dequantize_row(t, &vec![0u8; 2 * bytes], &mut vec![0f32; block + 1]).is_err());
        assert!(dequantize_row(t, &vec![0u8; bytes - 1], &mut vec![0f32; block]).is_err());
        assert!(vec_dot(t, block, &vec![0u8; bytes], &[0u8; 8]).is_err());
        assert!(vec_dot(t, block, &vec![0u8; bytes - 1], &[0u8; 292]).is_err());
    }
}

#[test]
fn every_type_with_a_vec_dot_type_has_a_row_dot_kernel() {
    // MUL_MAT picks its kernel from `row_dot_kernel`: a format registered elsewhere but
    // missing there would be refused at compute time.
    for type_id in 0..64u32 {
        if vec_dot_type(type_id).is_some() && supports(type_id) {
            assert!(
                row_dot_kernel(type_id).is_some(),
                "type {type_id} has a vec_dot_type but no dot kernel"
            );
        }
    }
}

/// `exp_in_place` gives `f32::exp`'s bits (vectorized or not), over a sweep of the floats
/// of every exponent and sign, and in short slices (the tail).
#[test]
fn exp_in_place_matches_f32_exp() {
    let mut x: Vec<f32> = (0..=u32::MAX)
        .step_by(4093)
        .map(f32::from_bits)
        .chain([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            88.0,
            -88.0,
        ])
        .collect();
    let want: Vec<u32> = x.iter().map(|v| v.exp().to_bits()).collect();
    super::exp_in_place(&mut x);
    for (got, want) in x.iter().zip(&want) {
        assert_eq!(got.to_bits(), *want);
    }
    // (whether the vectorized path ran: `--nocapture`)
    println!("exp vectorized: {}", simd::exp_vectorized());
    let mut short = [1.5f32, -2.25, 10.0];
    super::exp_in_place(&mut short);
    assert_eq!(
        short.map(f32::to_bits),
        [1.5f32, -2.25, 10.0].map(|v| v.exp().to_bits())
    );
}

/// Every float: `cargo test --release -p backend-cpu exp_everywhere -- --ignored`.
#[test]
#[ignore]
fn exp_in_place_matches_f32_exp_everywhere() {
    let mut chunk = vec![0f32; 1 << 20];
    for start in (0..=u32::MAX).step_by(1 << 20) {
        for (i, v) in chunk.iter_mut().enumerate() {
            *v = f32::from_bits(start + i as u32);
        }
        super::exp_in_place(&mut chunk);
        for (i, v) in chunk.iter().enumerate() {
            let x = f32::from_bits(start + i as u32);
            assert_eq!(v.to_bits(), x.exp().to_bits(), "{x:e}");
        }
    }
}

/// `columns_to_rows` against the transposition done one value at a time, for every group size
/// the kernels use and widths around the 16-row vector blocks.
#[test]
fn columns_to_rows_transposes_the_kernel_results() {
    fn check<const N: usize>() {
        for width in [0, 1, 5, 15, 16, 17, 31, 32, 33, 48, 63, 64, 100, 256, 257] {
            let group: Vec<[f32; N]> = (0..width)
                .map(|i| std::array::from_fn(|j| (i * 1000 + j) as f32 + 0.5))
                .collect();
            // a longer scratch: only the first N * width values are the rows
            let mut out = vec![-1.0f32; N * width + 7];
            columns_to_rows(&group, &mut out);
            for j in 0..N {
                for (i, g) in group.iter().enumerate() {
                    assert_eq!(
                        out[j * width + i],
                        g[j],
                        "N {N}, width {width}, row {j}, {i}"
                    );
                }
            }
            assert!(out[N * width..].iter().all(|&v| v == -1.0));
        }
    }
    check::<1>();
    check::<3>();
    check::<4>();
    check::<16>();
}
