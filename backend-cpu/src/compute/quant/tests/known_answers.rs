//! Known answers of the dequantizers and activation quantizers, and round trips.

use super::*;

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
