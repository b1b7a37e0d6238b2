//! The math of the element-wise maps (UNARY sub-ops, SQR, SQRT, LOG, SIN, COS, SCALE, CLAMP,
//! LEAKY_RELU) and of the GLU gates, as ggml-cpu computes them (`vec.h`, `unary-ops.cpp`,
//! `ops.cpp`).
//!
//! GELU and quick GELU: ggml-cpu builds with `GGML_GELU_FP16` and `GGML_GELU_QUICK_FP16`, so even
//! its F32 path rounds the input to f16 and looks the result up in a 64 Ki-entry table of
//! `f16(gelu(x))` (GELU additionally returns 0 below -10 and `x` above 10 without the table).
//! [`gelu`] and [`gelu_quick`] reproduce exactly that, with the same tables.

use std::sync::OnceLock;

use crate::compute::plan::MapOp;
use crate::compute::view::{f16_to_f32, f32_to_f16};

use super::{c_max, c_min};

const GELU_COEF_A: f32 = 0.044715;
const GELU_QUICK_COEF: f32 = -1.702;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const SQRT_2_INV: f32 = std::f32::consts::FRAC_1_SQRT_2;

/// ggml's `ggml_gelu_f32`: the tanh approximation, in f32.
pub(crate) fn gelu_exact(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// ggml's `ggml_gelu_quick_f32`.
pub(crate) fn gelu_quick_exact(x: f32) -> f32 {
    x * (1.0 / (1.0 + (GELU_QUICK_COEF * x).exp()))
}

fn table(f: fn(f32) -> f32) -> Box<[u16]> {
    (0..=u16::MAX)
        .map(|bits| f32_to_f16(f(f16_to_f32(bits))))
        .collect()
}

/// ggml-cpu's F32 GELU (`ggml_vec_gelu_f32` with `GGML_GELU_FP16`).
#[inline]
pub(crate) fn gelu(x: f32) -> f32 {
    static TABLE: OnceLock<Box<[u16]>> = OnceLock::new();
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let table = TABLE.get_or_init(|| table(gelu_exact));
        f16_to_f32(table[usize::from(f32_to_f16(x))])
    }
}

/// ggml-cpu's F32 quick GELU (`ggml_vec_gelu_quick_f32` with `GGML_GELU_QUICK_FP16`).
#[inline]
pub(crate) fn gelu_quick(x: f32) -> f32 {
    static TABLE: OnceLock<Box<[u16]>> = OnceLock::new();
    let table = TABLE.get_or_init(|| table(gelu_quick_exact));
    f16_to_f32(table[usize::from(f32_to_f16(x))])
}

/// `x / (1 + e^-x)`.
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU with the error function (`0.5 x (1 + erf(x / sqrt 2))`).
#[inline]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * SQRT_2_INV))
}

/// The error function to f32 precision (computed in f64: a Taylor series near 0, the continued
/// fraction of `erfc` further out). Rust's std has no `erf`.
pub(crate) fn erf(x: f32) -> f32 {
    let x = f64::from(x);
    if x.is_nan() {
        return f32::NAN;
    }
    let a = x.abs();
    let r = if a >= 6.0 {
        1.0
    } else if a < 2.5 {
        // erf(a) = 2/sqrt(pi) * sum (-1)^n a^(2n+1) / (n! (2n+1))
        let a2 = a * a;
        let mut term = a;
        let mut sum = a;
        let mut n = 0.0f64;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -a2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(a) = exp(-a^2)/sqrt(pi) / (a + (1/2)/(a + 1/(a + (3/2)/(a + ...)))),
        // evaluated from the tail.
        let mut k = a;
        for n in (1..=80).rev() {
            k = a + (f64::from(n) / 2.0) / k;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * k)
    };
    (if x < 0.0 { -r } else { r }) as f32
}

impl MapOp {
    /// `y[i] = op(x[i])` over a row.
    pub(crate) fn apply(self, x: &[f32], y: &mut [f32]) {
        let pairs = y.iter_mut().zip(x);
        match self {
            MapOp::Abs => pairs.for_each(|(y, &x)| *y = x.abs()),
            MapOp::Sgn => pairs.for_each(|(y, &x)| {
                *y = if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }),
            MapOp::Neg => pairs.for_each(|(y, &x)| *y = -x),
            MapOp::Step => pairs.for_each(|(y, &x)| *y = if x > 0.0 { 1.0 } else { 0.0 }),
            MapOp::Tanh => pairs.for_each(|(y, &x)| *y = x.tanh()),
            MapOp::Elu => pairs.for_each(|(y, &x)| *y = if x > 0.0 { x } else { x.exp_m1() }),
            MapOp::Relu => pairs.for_each(|(y, &x)| *y = if x > 0.0 { x } else { 0.0 }),
            MapOp::Sigmoid => pairs.for_each(|(y, &x)| *y = 1.0 / (1.0 + (-x).exp())),
            MapOp::Gelu => pairs.for_each(|(y, &x)| *y = gelu(x)),
            MapOp::GeluQuick => pairs.for_each(|(y, &x)| *y = gelu_quick(x)),
            MapOp::Silu => pairs.for_each(|(y, &x)| *y = silu(x)),
            MapOp::HardSwish => {
                pairs.for_each(|(y, &x)| *y = x * 1.0f32.min(0.0f32.max((x + 3.0) / 6.0)))
            }
            MapOp::HardSigmoid => {
                pairs.for_each(|(y, &x)| *y = 1.0f32.min(0.0f32.max((x + 3.0) / 6.0)))
            }
            MapOp::Exp => pairs.for_each(|(y, &x)| *y = x.exp()),
            // ggml: expf(x) - 1, not expm1f
            MapOp::Expm1 => pairs.for_each(|(y, &x)| *y = x.exp() - 1.0),
            MapOp::Softplus => {
                pairs.for_each(|(y, &x)| *y = if x > 20.0 { x } else { (1.0 + x.exp()).ln() })
            }
            MapOp::GeluErf => pairs.for_each(|(y, &x)| *y = gelu_erf(x)),
            MapOp::Xielu {
                alpha_n,
                alpha_p,
                beta,
                eps,
            } => pairs.for_each(|(y, &x)| {
                *y = if x > 0.0 {
                    alpha_p * x * x + beta * x
                } else {
                    (x.min(eps).exp_m1() - x) * alpha_n + beta * x
                }
            }),
            MapOp::Floor => pairs.for_each(|(y, &x)| *y = x.floor()),
            MapOp::Ceil => pairs.for_each(|(y, &x)| *y = x.ceil()),
            MapOp::Round => pairs.for_each(|(y, &x)| *y = x.round()),
            MapOp::Trunc => pairs.for_each(|(y, &x)| *y = x.trunc()),
            MapOp::Sqr => pairs.for_each(|(y, &x)| *y = x * x),
            MapOp::Sqrt => pairs.for_each(|(y, &x)| *y = x.sqrt()),
            MapOp::Log => pairs.for_each(|(y, &x)| *y = x.ln()),
            MapOp::Sin => pairs.for_each(|(y, &x)| *y = x.sin()),
            MapOp::Cos => pairs.for_each(|(y, &x)| *y = x.cos()),
            MapOp::Scale { s, b } => {
                if b == 0.0 {
                    pairs.for_each(|(y, &x)| *y = x * s)
                } else {
                    pairs.for_each(|(y, &x)| *y = x * s + b)
                }
            }
            // ggml: MAX(MIN(x, max), min) with C's macros (a NaN input gives `max`)
            MapOp::Clamp { min, max } => pairs.for_each(|(y, &x)| *y = c_max(c_min(x, max), min)),
            MapOp::LeakyRelu { slope } => pairs.for_each(|(y, &x)| {
                *y = (if x > 0.0 { x } else { 0.0 }) + slope * (if x < 0.0 { x } else { 0.0 })
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_is_accurate() {
        // reference values of erf
        let cases = [
            (0.0f64, 0.0f64),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.4, 0.999_311_486_103_354_9),
            (2.6, 0.999_763_965_583_073_4),
            (3.0, 0.999_977_909_503_001_4),
            (4.0, 0.999_999_984_582_742_1),
        ];
        for (x, want) in cases {
            for sign in [1.0, -1.0] {
                let got = erf((sign * x) as f32);
                let want = (sign * want) as f32;
                assert!(
                    (got - want).abs() <= f32::EPSILON * 2.0,
                    "erf({x}) = {got}, want {want}"
                );
            }
        }
        assert_eq!(erf(7.0), 1.0);
        assert!(erf(f32::NAN).is_nan());
    }

    #[test]
    fn gelu_follows_ggml_table_semantics() {
        assert_eq!(gelu(-11.0), 0.0);
        assert_eq!(gelu(12.5), 12.5);
        for x in [-3.0f32, -0.5, 0.0, 0.3, 1.0, 2.7, 9.9] {
            let want = f16_to_f32(f32_to_f16(gelu_exact(f16_to_f32(f32_to_f16(x)))));
            assert_eq!(gelu(x), want);
            assert!((gelu(x) - gelu_exact(x)).abs() <= 2e-3 * (1.0 + x.abs()));
        }
        assert!((gelu_quick(1.0) - gelu_quick_exact(1.0)).abs() < 2e-3);
    }

    #[test]
    fn clamp_has_c_macro_semantics() {
        let mut y = [0.0f32; 4];
        MapOp::Clamp {
            min: -1.0,
            max: 1.0,
        }
        .apply(&[f32::NAN, -5.0, 0.5, 7.0], &mut y);
        assert_eq!(y, [1.0, -1.0, 0.5, 1.0]);
    }
}
