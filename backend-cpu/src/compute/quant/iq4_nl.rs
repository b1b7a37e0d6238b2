//! IQ4_NL: 32 weights per block, 4-bit indices into a fixed non-linear table.
//!
//! ```text
//! block_iq4_nl (18 bytes): d: f16 | qs: [u8; 16]     w = d * KVALUES[q]
//! ```
//! Element `j < 16` is the low nibble of `qs[j]`, element `j + 16` its high nibble (as Q4_0).
//! Activations for the dot product are Q8_0 (ggml-cpu's `vec_dot_type`).
//!
//! Follows ggml b11434: `dequantize_row_iq4_nl` and `quantize_row_iq4_nl_ref`
//! (`ggml-quants.c`; also ggml-cpu's `from_float`), bit-exact, and
//! `ggml_vec_dot_iq4_nl_q8_0_generic` (`ggml-cpu/quants.c`): exact integer block sums, scaled
//! per block and summed in f32 in block order.

use super::q8::Q8_0_BYTES;
use super::{fp16, fp16_bytes, QK32};

/// Bytes of a `block_iq4_nl`.
pub(super) const IQ4_NL_BYTES: usize = 18;

/// ggml's `kvalues_iq4nl`.
pub(super) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml's `GROUP_MAX_EPS`.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

const HALF: usize = QK32 / 2;

/// `dequantize_row_iq4_nl`: `d * KVALUES[q]`.
pub(super) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src
        .chunks_exact(IQ4_NL_BYTES)
        .zip(dst.chunks_exact_mut(QK32))
    {
        let d = fp16(b[0], b[1]);
        for j in 0..HALF {
            let q = b[2 + j];
            out[j] = d * f32::from(KVALUES[usize::from(q & 0x0F)]);
            out[j + HALF] = d * f32::from(KVALUES[usize::from(q >> 4)]);
        }
    }
}

/// ggml's `best_index_int8` over [`KVALUES`]: the index of the table value nearest to `x`
/// (the upper one on ties; the last one for NaN).
pub(super) fn best_index(x: f32) -> usize {
    let n = KVALUES.len();
    let val = |i: usize| f32::from(KVALUES[i]);
    if x <= val(0) {
        return 0;
    }
    if x >= val(n - 1) {
        return n - 1;
    }
    let (mut ml, mut mu) = (0usize, n - 1);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - val(mu - 1) < val(mu) - x {
        mu - 1
    } else {
        mu
    }
}

/// `quantize_row_iq4_nl_ref` (`quantize_row_iq4_nl_impl` with one 32-element block per
/// super-block, no quant weights and `ntry = -1`): `d = max / -127`, indices nearest to
/// `x / d`, then `d` refitted as the `x^2`-weighted least-squares scale of those indices.
///
/// An all-zero block (largest magnitude below `GROUP_MAX_EPS`) gets `d = 0` and, in ggml,
/// whatever indices its uninitialized scratch array held (the previous block's, within one
/// call); here the previous block's within one call as well, and zeros for the first block.
/// Those indices are multiplied by `d = 0`, so the values are the same either way.
pub(super) fn quantize_iq4_nl_ref(src: &[f32], dst: &mut [u8]) {
    let mut l = [0u8; QK32];
    for (x, b) in src
        .chunks_exact(QK32)
        .zip(dst.chunks_exact_mut(IQ4_NL_BYTES))
    {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        let scale = if amax < GROUP_MAX_EPS {
            0.0
        } else {
            let d = max / f32::from(KVALUES[0]);
            let id = 1.0 / d;
            let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
            for (lj, &v) in l.iter_mut().zip(x) {
                let idx = best_index(id * v);
                *lj = idx as u8;
                let q = f32::from(KVALUES[idx]);
                let w = v * v;
                sumqx += w * q * v;
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 {
                sumqx / sumq2
            } else {
                0.0
            }
        };
        b[..2].copy_from_slice(&fp16_bytes(scale));
        for j in 0..HALF {
            b[2 + j] = (l[j] & 0x0F) | (l[j + HALF] << 4);
        }
    }
}

/// `ggml_vec_dot_iq4_nl_q8_0_generic`.
pub(super) fn vec_dot_iq4_nl_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.chunks_exact(IQ4_NL_BYTES).zip(y.chunks_exact(Q8_0_BYTES)) {
        let d = fp16(by[0], by[1]) * fp16(bx[0], bx[1]);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for j in 0..HALF {
            let q = bx[2 + j];
            let y1 = i32::from(by[2 + j] as i8);
            let y2 = i32::from(by[2 + j + HALF] as i8);
            sumi1 += y1 * i32::from(KVALUES[usize::from(q & 0x0F)]);
            sumi2 += y2 * i32::from(KVALUES[usize::from(q >> 4)]);
        }
        sumf += d * (sumi1 + sumi2) as f32;
    }
    sumf
}
