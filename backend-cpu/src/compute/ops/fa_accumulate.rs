//! FLASH_ATTN_EXT's value accumulators, rounded exactly as ggml-cpu's one-query-row path rounds
//! them (`ggml_compute_forward_flash_attn_ext_f16_one_chunk` with `ggml_vec_mad_f16`,
//! `ggml_vec_scale_f16` and `ggml_vec_mad_f32`), so that greedy generation through this server
//! picks the same tokens as llama.cpp's own CPU backend.
//!
//! For F16 V, ggml keeps the running sum `Σ v_c · w_c` in F16: every step is
//! `acc = f16(fma(v, w, acc))` (one fused multiply-add in f32, then a round to F16), and a new
//! maximum rescales it as `acc = f16(acc · ms)`. For other V types the sum stays in f32, again
//! with fused multiply-adds. ggml-cpu is built with FMA (`-mfma`, and its SIMD loops use FMA
//! intrinsics), so these are fused here too.
//!
//! This module is allowed `unsafe` for one reason: the AVX2 + FMA + F16C versions of the four
//! loops, picked at run time when the CPU has those features (a portable `mul_add` otherwise is
//! a library call per element). Both versions give identical results.

use crate::compute::view::{f16_to_f32, f32_to_f16};

/// `acc[i] = f16(fma(v[i], w, acc[i]))` over F16 bits; `v` is F16 little-endian bytes.
pub(super) fn mad_f16(acc: &mut [u16], v: &[u8], w: f32) {
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
        unsafe { x86::mad_f16(acc, v, w) };
        return;
    }
    for (a, x) in acc.iter_mut().zip(v.chunks_exact(2)) {
        let x = f16_to_f32(u16::from_le_bytes([x[0], x[1]]));
        *a = f32_to_f16(x.mul_add(w, f16_to_f32(*a)));
    }
}

/// `acc[i] = f16(acc[i] · s)` over F16 bits.
pub(super) fn scale_f16(acc: &mut [u16], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
        unsafe { x86::scale_f16(acc, s) };
        return;
    }
    for a in acc.iter_mut() {
        *a = f32_to_f16(f16_to_f32(*a) * s);
    }
}

/// `acc[i] = fma(v[i], w, acc[i])`.
pub(super) fn mad_f32(acc: &mut [f32], v: &[f32], w: f32) {
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
        unsafe { x86::mad_f32(acc, v, w) };
        return;
    }
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = x.mul_add(w, *a);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    use crate::compute::view::{f16_to_f32, f32_to_f16};

    /// Whether the CPU has AVX2, FMA and F16C (never AVX-512 or AMX: not needed here).
    pub(super) fn available() -> bool {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn mad_f16(acc: &mut [u16], v: &[u8], w: f32) {
        let n = acc.len().min(v.len() / 2);
        let body = n - n % 8;
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i < body {
            // SAFETY: `i + 8 <= n`, so 8 values (16 bytes) at `i` of `acc` and at byte `2 i` of
            // `v` are in bounds; unaligned loads and stores.
            unsafe {
                let a = _mm256_cvtph_ps(_mm_loadu_si128(acc.as_ptr().add(i).cast()));
                let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(2 * i).cast()));
                let r = _mm256_fmadd_ps(x, wv, a);
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r);
                _mm_storeu_si128(acc.as_mut_ptr().add(i).cast(), h);
            }
            i += 8;
        }
        for j in body..n {
            let x = f16_to_f32(u16::from_le_bytes([v[2 * j], v[2 * j + 1]]));
            acc[j] = f32_to_f16(x.mul_add(w, f16_to_f32(acc[j])));
        }
    }

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scale_f16(acc: &mut [u16], s: f32) {
        let n = acc.len();
        let body = n - n % 8;
        let sv = _mm256_set1_ps(s);
        let mut i = 0;
        while i < body {
            // SAFETY: `i + 8 <= n`: 8 values (16 bytes) at `i` of `acc` are in bounds;
            // unaligned load and store.
            unsafe {
                let a = _mm256_cvtph_ps(_mm_loadu_si128(acc.as_ptr().add(i).cast()));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(a, sv));
                _mm_storeu_si128(acc.as_mut_ptr().add(i).cast(), h);
            }
            i += 8;
        }
        for a in &mut acc[body..] {
            *a = f32_to_f16(f16_to_f32(*a) * s);
        }
    }

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn mad_f32(acc: &mut [f32], v: &[f32], w: f32) {
        let n = acc.len().min(v.len());
        let body = n - n % 8;
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i < body {
            // SAFETY: `i + 8 <= n` for both slices; unaligned loads and stores of 32 bytes.
            unsafe {
                let a = _mm256_loadu_ps(acc.as_ptr().add(i));
                let x = _mm256_loadu_ps(v.as_ptr().add(i));
                _mm256_storeu_ps(acc.as_mut_ptr().add(i), _mm256_fmadd_ps(x, wv, a));
            }
            i += 8;
        }
        for j in body..n {
            acc[j] = v[j].mul_add(w, acc[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn portable_mad_f16(acc: &mut [u16], v: &[u16], w: f32) {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a = f32_to_f16(f16_to_f32(x).mul_add(w, f16_to_f32(*a)));
        }
    }

    fn bytes(v: &[u16]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn simd_and_portable_accumulators_agree_bit_for_bit() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        };
        for n in [1usize, 7, 8, 13, 64, 100, 128] {
            let v: Vec<u16> = (0..n).map(|_| f32_to_f16(next())).collect();
            let start: Vec<u16> = (0..n).map(|_| f32_to_f16(next())).collect();
            for w in [0.0f32, 1.0, 0.3333, -1.7, 1e-3] {
                let (mut a, mut b) = (start.clone(), start.clone());
                mad_f16(&mut a, &bytes(&v), w);
                portable_mad_f16(&mut b, &v, w);
                assert_eq!(a, b, "n {n} w {w}");
                let vf: Vec<f32> = v.iter().map(|&x| f16_to_f32(x)).collect();
                let mut c: Vec<f32> = start.iter().map(|&x| f16_to_f32(x)).collect();
                let mut d = c.clone();
                mad_f32(&mut c, &vf, w);
                d.iter_mut()
                    .zip(&vf)
                    .for_each(|(d, &x)| *d = x.mul_add(w, *d));
                assert_eq!(c, d, "n {n} w {w}");
                let mut e = start.clone();
                scale_f16(&mut e, w);
                let want: Vec<u16> = start
                    .iter()
                    .map(|&x| f32_to_f16(f16_to_f32(x) * w))
                    .collect();
                assert_eq!(e, want, "n {n} w {w}");
            }
        }
    }

    #[test]
    fn f16_accumulation_rounds_every_step() {
        // 2048 + 1 is not an f16: each step rounds back to 2048 (ties to even), as ggml's F16
        // accumulator does, where an f32 sum would reach 2058.
        let mut acc = [f32_to_f16(2048.0)];
        for _ in 0..10 {
            mad_f16(&mut acc, &f32_to_f16(1.0).to_le_bytes(), 1.0);
        }
        assert_eq!(f16_to_f32(acc[0]), 2048.0);
        scale_f16(&mut acc, 0.5);
        assert_eq!(f16_to_f32(acc[0]), 1024.0);
    }
}
