//! Dot products against dequantized dot products, and errors instead of panics.

use super::*;

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
    for t in [24u32, 28, 31, 44, 1000] {
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
