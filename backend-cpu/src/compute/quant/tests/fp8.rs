//! F8_E4M3 against ggml's formulas (`ggml/src/ggml-impl.h`, b12032+1): every byte decoded, the
//! encoder at its edge cases and rounding boundaries, against a brute-force nearest-value
//! reference, and every byte round-tripped.

use super::*;

/// ggml's decoding formula, written independently: `M · 2^-9` for `E = 0`, else
/// `(1 + M/8) · 2^(E-7)`; `0x7F` / `0xFF` NaN.
fn reference_decode(b: u8) -> f64 {
    let (e, m) = (i32::from((b >> 3) & 0xF), f64::from(b & 7));
    if b & 0x7F == 0x7F {
        return f64::NAN;
    }
    let v = if e == 0 {
        m * 2f64.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// The encoder's specification: NaN -> 0x7F; sign kept (zero included); magnitudes >= 448
/// (and infinities) -> 0x7E; otherwise the nearest of the 127 finite codes, ties to the even
/// code (the code's low bit is the mantissa's).
fn reference_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = f64::from(x.abs());
    if a >= 448.0 {
        return sign | 0x7E;
    }
    let mut best = 0u8;
    for code in 1..=0x7Eu8 {
        let (d, db) = (
            (reference_decode(code) - a).abs(),
            (reference_decode(best) - a).abs(),
        );
        if d < db || (d == db && code & 1 == 0 && best & 1 == 1) {
            best = code;
        }
    }
    sign | best
}

#[test]
fn fp8_every_byte_decodes_as_ggml() {
    let mut row = [0f32; 256];
    let bytes: Vec<u8> = (0..=255u8).collect();
    dequantize_row(ty::F8_E4M3, &bytes, &mut row).unwrap();
    for b in 0..=255u8 {
        let got = f8_e4m3_to_f32(b);
        assert_eq!(got.to_bits(), row[b as usize].to_bits(), "{b:#04x}");
        let want = reference_decode(b);
        if want.is_nan() {
            // ggml's `NAN`: the positive quiet NaN, for both encodings
            assert_eq!(got.to_bits(), f32::NAN.to_bits(), "{b:#04x}");
        } else {
            assert_eq!(f64::from(got), want, "{b:#04x}");
            assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "{b:#04x}");
        }
    }
    assert_eq!(f8_e4m3_to_f32(0x7E), 448.0);
    assert_eq!(f8_e4m3_to_f32(0xFE), -448.0);
    assert_eq!(f8_e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(f8_e4m3_to_f32(0x08), 2f32.powi(-6));
    assert_eq!(f8_e4m3_to_f32(0x38), 1.0);
    assert_eq!(f8_e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
}

#[test]
fn fp8_every_byte_round_trips() {
    for b in 0..=255u8 {
        let back = f32_to_f8_e4m3(f8_e4m3_to_f32(b));
        let want = if b & 0x7F == 0x7F { 0x7F } else { b };
        assert_eq!(back, want, "{b:#04x}");
    }
}

#[test]
fn fp8_encoder_edge_cases() {
    let cases: &[(f32, u8)] = &[
        (0.0, 0x00),
        (-0.0, 0x80),
        (f32::NAN, 0x7F),
        (-f32::NAN, 0x7F),
        (f32::INFINITY, 0x7E),
        (f32::NEG_INFINITY, 0xFE),
        (448.0, 0x7E),
        (-448.0, 0xFE),
        // 464 is halfway between 448 and the (absent) 480: saturates
        (464.0, 0x7E),
        (1e30, 0x7E),
        (f32::MAX, 0x7E),
        // halfway between 416 (0x7D) and 448 (0x7E): ties to even, 0x7E
        (432.0, 0x7E),
        (431.99997, 0x7D),
        // halfway between 1.0 (0x38) and 1.125 (0x39): even 0x38; 1.1875 between 0x39 and
        // 0x3A: even 0x3A
        (1.0625, 0x38),
        (1.0625001, 0x39),
        (1.1875, 0x3A),
        (1.1874999, 0x39),
        // 1.9375 rounds up into the next binade (mantissa 8 -> exponent + 1)
        (1.9375, 0x40),
        (1.9374999, 0x3F),
        // subnormals: M / 512
        (2f32.powi(-9), 0x01),
        (-2f32.powi(-9), 0x81),
        (1.5 * 2f32.powi(-9), 0x02), // tie between 1 and 2: even
        (2.5 * 2f32.powi(-9), 0x02), // tie between 2 and 3: even
        (0.5 * 2f32.powi(-9), 0x00), // tie between 0 and 1: even, zero
        (0.50001 * 2f32.powi(-9), 0x01),
        (-0.25 * 2f32.powi(-9), 0x80), // underflow keeps the sign
        (f32::from_bits(1), 0x00),
        (-f32::from_bits(1), 0x80),
        (7.5 * 2f32.powi(-9), 0x08), // rounds up to the smallest normal
        (7.4999 * 2f32.powi(-9), 0x07),
        (2f32.powi(-6), 0x08),
        (0.015624999, 0x08),
    ];
    for &(x, want) in cases {
        assert_eq!(f32_to_f8_e4m3(x), want, "{x:e} ({:#010x})", x.to_bits());
        assert_eq!(reference_encode(x), want, "reference, {x:e}");
    }
}

#[test]
fn fp8_encoder_matches_the_reference_around_every_boundary() {
    // every midpoint between neighbouring codes, and the f32s on either side of it
    let mut values = Vec::new();
    for code in 0..0x7Eu8 {
        let (lo, hi) = (f8_e4m3_to_f32(code), f8_e4m3_to_f32(code + 1));
        let mid = (lo + hi) / 2.0;
        for v in [
            lo,
            hi,
            mid,
            f32::from_bits(mid.to_bits() - 1),
            f32::from_bits(mid.to_bits() + 1),
        ] {
            values.push(v);
            values.push(-v);
        }
    }
    // and a sweep over every magnitude from the f32 subnormals to beyond 448
    let mut bits = 1u32;
    while bits < 0x4400_0000 {
        values.push(f32::from_bits(bits));
        values.push(-f32::from_bits(bits));
        bits += 0x3FF1;
    }
    let mut bytes = vec![0u8; values.len()];
    quantize_row(ty::F8_E4M3, &values, &mut bytes).unwrap();
    let mut bytes_ref = vec![0u8; values.len()];
    quantize_row_ref(ty::F8_E4M3, &values, &mut bytes_ref).unwrap();
    for ((&x, &b), &r) in values.iter().zip(&bytes).zip(&bytes_ref) {
        assert_eq!(b, reference_encode(x), "{x:e} ({:#010x})", x.to_bits());
        assert_eq!(b, r);
    }
}

#[test]
fn fp8_dot_with_f32_activations() {
    let mut rng = Rng::new(0xF8);
    for n in [1usize, 7, 31, 32, 33, 100, 257] {
        let w: Vec<u8> = (0..n).map(|_| (rng.next_u64() as u8) & 0xF7).collect();
        let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let y_bytes: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = vec_dot(ty::F8_E4M3, n, &w, &y_bytes).unwrap();
        let want: f64 = w
            .iter()
            .zip(&y)
            .map(|(&b, &v)| reference_decode(b) * f64::from(v))
            .sum();
        let scale: f64 = w
            .iter()
            .zip(&y)
            .map(|(&b, &v)| (reference_decode(b) * f64::from(v)).abs())
            .sum();
        assert!(
            (f64::from(got) - want).abs() <= 1e-5 * scale.max(1.0),
            "n = {n}: {got} vs {want}"
        );
    }
    // a NaN weight poisons the sum, as in ggml
    let y_bytes: Vec<u8> = [1f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert!(vec_dot(ty::F8_E4M3, 4, &[0x38, 0x7F, 0x38, 0x38], &y_bytes)
        .unwrap()
        .is_nan());
}
