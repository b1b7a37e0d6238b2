//! f32 ↔ bf16 conversions, bit-exact with ggml's CPU conversion (used by the BF16 wire of the
//! pairwise all-reduce, PROTOCOL.md §6.4).
//!
//! bf16 is the upper half of an f32. Narrowing rounds to nearest, ties to even, on the 16
//! dropped bits; NaNs are not rounded (rounding could carry a NaN into infinity) but truncated
//! with the quiet bit forced on, so a signalling NaN arrives as a quiet one.

/// Narrows an f32 to bf16 bits: round to nearest even; NaN → `(bits >> 16) | 0x40` (quiet).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        // Any NaN: keep sign and payload top, force the quiet bit.
        return ((bits >> 16) | 0x40) as u16;
    }
    // Add half an ulp of the result, minus one unless the kept lowest bit is odd, so that exact
    // ties round to even. No NaN gets here, so `bits ≤ 0xff80_0000` and the sum fits in u32;
    // `wrapping_add` only documents that no overflow check is needed.
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// Widens bf16 bits to the f32 they denote (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

#[cfg(test)]
mod tests {
    use super::{bf16_to_f32, f32_to_bf16};
    use proptest::prelude::*;

    /// The conversion written as a plain integer reference (round half to even on the low
    /// 16 bits), to cross-check the bit trick.
    fn reference(x: f32) -> u16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return ((bits >> 16) | 0x40) as u16;
        }
        let hi = bits >> 16;
        let lo = bits & 0xffff;
        let up = lo > 0x8000 || (lo == 0x8000 && hi & 1 == 1);
        (hi + u32::from(up)) as u16
    }

    #[test]
    fn edge_cases_are_bit_exact() {
        let cases: &[(u32, u16)] = &[
            (0x0000_0000, 0x0000), // +0
            (0x8000_0000, 0x8000), // -0.0 keeps its sign
            (0x3f80_0000, 0x3f80), // 1.0
            (0xbf80_0000, 0xbf80), // -1.0
            (0x7f80_0000, 0x7f80), // +inf
            (0xff80_0000, 0xff80), // -inf
            (0x7fc0_0000, 0x7fc0), // quiet NaN
            (0x7f80_0001, 0x7fc0), // signalling NaN, low payload → quiet
            (0x7fa0_0000, 0x7fe0), // signalling NaN, high payload → quiet
            (0xff80_0001, 0xffc0), // negative signalling NaN
            (0xffff_ffff, 0xffff), // all-ones NaN stays
            (0x3f80_8000, 0x3f80), // tie, even kept bit: down
            (0x3f81_8000, 0x3f82), // tie, odd kept bit: up
            (0x3f80_8001, 0x3f81), // above tie: up
            (0x3f80_7fff, 0x3f80), // below tie: down
            (0xbf81_8000, 0xbf82), // negative tie, odd: away from zero
            (0x7f7f_ffff, 0x7f80), // f32::MAX rounds to +inf
            (0xff7f_ffff, 0xff80), // f32::MIN rounds to -inf
            (0x7f7f_7fff, 0x7f7f), // largest finite that stays finite
            (0x0000_0001, 0x0000), // smallest subnormal → +0
            (0x0000_8000, 0x0000), // subnormal tie, even: down
            (0x0001_8000, 0x0002), // subnormal tie, odd: up
            (0x007f_ffff, 0x0080), // largest subnormal → smallest normal
        ];
        for &(input, want) in cases {
            let got = f32_to_bf16(f32::from_bits(input));
            assert_eq!(
                got, want,
                "f32 bits {input:#010x}: got {got:#06x}, want {want:#06x}"
            );
            assert_eq!(got, reference(f32::from_bits(input)));
        }
    }

    #[test]
    fn widening_is_exact() {
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(bf16_to_f32(0x7f80), f32::INFINITY);
        assert_eq!(bf16_to_f32(0xff80), f32::NEG_INFINITY);
        assert!(bf16_to_f32(0x7fc0).is_nan());
        assert_eq!(bf16_to_f32(0xc040), -3.0);
    }

    #[test]
    fn every_bf16_round_trips() {
        for h in 0..=u16::MAX {
            let f = bf16_to_f32(h);
            let back = f32_to_bf16(f);
            if f.is_nan() {
                // NaNs come back quiet, otherwise unchanged.
                assert_eq!(back, h | 0x40);
            } else {
                assert_eq!(back, h);
            }
        }
    }

    proptest! {
        #[test]
        fn matches_integer_reference(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            prop_assert_eq!(f32_to_bf16(x), reference(x));
        }

        #[test]
        fn rounding_error_is_at_most_half_an_ulp(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            prop_assume!(x.is_finite());
            let y = bf16_to_f32(f32_to_bf16(x));
            prop_assume!(y.is_finite());
            // Half a bf16 ulp at x's binade is 2^(exponent − 8) in units of f32 ulps: 0x8000
            // in the low bits. Compare in the integer (monotone) domain of same-sign floats.
            let diff = (i64::from(x.to_bits() & 0x7fff_ffff) - i64::from(y.to_bits() & 0x7fff_ffff)).abs();
            prop_assert!(diff <= 0x8000);
        }
    }
}
