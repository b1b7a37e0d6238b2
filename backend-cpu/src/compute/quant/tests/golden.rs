//! The K-quant and IQ4 quantizers against ggml's own bytes.

use super::*;

// ---------------------------------------------------------------------------------------
// K-quant quantizers against ggml's own bytes

/// Rows quantized by the real ggml (`quantize_row_q*_K_ref` of libggml-base b11434), written
/// by `scripts/conformance/quant-golden.py`: zeros, constants, tiny values around
/// `GROUP_MAX_EPS`, a huge range, outliers, rounding ties, zero groups, random rows.
const K_GOLDEN_INPUT: &[u8] = include_bytes!("../../../../tests/data/k_quant_golden/input.f32");
fn k_golden() -> [(u32, &'static [u8]); 5] {
    [
        (
            id("q2_K"),
            include_bytes!("../../../../tests/data/k_quant_golden/q2_k.bin"),
        ),
        (
            id("q3_K"),
            include_bytes!("../../../../tests/data/k_quant_golden/q3_k.bin"),
        ),
        (
            ty::Q4_K,
            include_bytes!("../../../../tests/data/k_quant_golden/q4_k.bin"),
        ),
        (
            id("q5_K"),
            include_bytes!("../../../../tests/data/k_quant_golden/q5_k.bin"),
        ),
        (
            id("q6_K"),
            include_bytes!("../../../../tests/data/k_quant_golden/q6_k.bin"),
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
    let want: &[u8] = include_bytes!("../../../../tests/data/k_quant_golden/iq4_nl.bin");
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
                    "../../../../tests/data/",
                    "k_quant_golden/",
                    $name,
                    ".bin"
                ))
                .as_slice(),
                include_bytes!(concat!(
                    "../../../../tests/data/",
                    "k_quant_golden/deq_",
                    $name,
                    ".bin"
                ))
                .as_slice(),
            )
        };
    }
    let ext: &[u8] = include_bytes!("../../../../tests/data/k_quant_golden/input_ext.f32");
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
