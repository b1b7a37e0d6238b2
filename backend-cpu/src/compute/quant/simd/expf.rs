//! A vectorized `expf` with glibc's bits (its table and polynomial), used only where the
//! platform's `expf` is glibc's.

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use super::avx512f::has_avx512f;

/// glibc's `__exp2f_data.tab` (`EXP2F_TABLE_BITS` = 5): `2^(i/32)` with `i << 47`
/// taken out of its bits.
const EXP2F_TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// glibc's `expf` constants: `32 / ln 2`, the rounding shift `0x1.8p52` and the cubic's
/// coefficients (`__exp2f_data.invln2_scaled`, `shift`, `poly_scaled`).
const EXPF_INVLN2N: u64 = 0x40471547652b82fe;

const EXPF_SHIFT: u64 = 0x4338000000000000;

const EXPF_C: [u64; 3] = [0x3ebc6af84b912394, 0x3f2ebfce50fac4f3, 0x3f962e42ff0c52d6];

/// 0: not probed yet, 1: no, 2: yes.
static EXPF: AtomicU8 = AtomicU8::new(0);

/// Whether [`exp_glibc`] runs here and gives `f32::exp`'s bits: AVX-512 F, and the same
/// results on a sweep of about 260 000 floats of every exponent and sign (so a platform
/// whose `expf` is another algorithm never takes it). Probed once.
pub(super) fn glibc_expf_ok() -> bool {
    match EXPF.load(Ordering::Relaxed) {
        0 => {
            let yes = has_avx512f() && {
                let mut x: Vec<f32> = (0..=u32::MAX)
                    .step_by(16411)
                    .map(f32::from_bits)
                    .chain([0.0, -0.0, 88.0, -88.0, 87.99, -87.99, 1e-30, -1e-30])
                    .collect();
                let want: Vec<u32> = x.iter().map(|v| v.exp().to_bits()).collect();
                // SAFETY: AVX-512 F (and AVX2, FMA with it) checked just above.
                unsafe { exp_glibc(&mut x) };
                x.iter().map(|v| v.to_bits()).eq(want)
            };
            EXPF.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        state => state == 2,
    }
}

/// glibc's `expf` (`sysdeps/ieee754/flt-32/e_expf.c` as its FMA build compiles it) on
/// eight floats at a time: `kd = fma(N/ln2, x, shift)`, `r = fma(N/ln2, x, -(kd -
/// shift))`, `s` from the table and `kd`'s bits, `((fma(z, r^2, fma(C2, r, 1))) * s`
/// with `z = fma(C0, r, C1)`, rounded to f32. Lanes outside its fast path (`|x| >= 88`,
/// infinities, NaNs) and the tail go through `f32::exp`.
///
/// # Safety
/// AVX-512 F, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn exp_glibc(v: &mut [f32]) {
    let tab = |i: usize| _mm512_loadu_si512(EXP2F_TAB[i..i + 8].as_ptr().cast());
    let (t0, t1, t2, t3) = (tab(0), tab(8), tab(16), tab(24));
    let inv = _mm512_set1_pd(f64::from_bits(EXPF_INVLN2N));
    let shift = _mm512_set1_pd(f64::from_bits(EXPF_SHIFT));
    let c = EXPF_C.map(|b| _mm512_set1_pd(f64::from_bits(b)));
    let one = _mm512_set1_pd(1.0);
    let mut chunks = v.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let p = chunk.as_mut_ptr();
        // SAFETY: eight values at `p`.
        let xf = _mm256_loadu_ps(p);
        let abstop = _mm256_and_si256(
            _mm256_srli_epi32::<20>(_mm256_castps_si256(xf)),
            _mm256_set1_epi32(0x7ff),
        );
        let slow = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(
            abstop,
            _mm256_set1_epi32(0x42a),
        )));
        let xd = _mm512_cvtps_pd(xf);
        let kd = _mm512_fmadd_pd(inv, xd, shift);
        let ki = _mm512_castpd_si512(kd);
        let kd = _mm512_sub_pd(kd, shift);
        let r = _mm512_fmsub_pd(inv, xd, kd);
        let lo = _mm512_permutex2var_epi64(t0, ki, t1);
        let hi = _mm512_permutex2var_epi64(t2, ki, t3);
        let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
        let t = _mm512_mask_blend_epi64(upper, lo, hi);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let z = _mm512_fmadd_pd(r, c[0], c[1]);
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(r, c[2], one);
        let y = _mm512_mul_pd(_mm512_fmadd_pd(z, r2, y), s);
        let mut x = [0f32; 8];
        _mm256_storeu_ps(x.as_mut_ptr(), xf);
        _mm256_storeu_ps(p, _mm512_cvtpd_ps(y));
        if slow != 0 {
            for (i, (o, x)) in chunk.iter_mut().zip(x).enumerate() {
                if slow & (1 << i) != 0 {
                    *o = x.exp();
                }
            }
        }
    }
    chunks
        .into_remainder()
        .iter_mut()
        .for_each(|x| *x = x.exp());
}
