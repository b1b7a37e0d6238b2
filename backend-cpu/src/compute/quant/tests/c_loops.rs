//! Cross-checks against ggml's loops written out as in C.

use super::*;

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
