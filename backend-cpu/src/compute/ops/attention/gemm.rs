//! The small f32 matrix product of the tiled attention path: `C += A · B`, every element of
//! `C` a chain of fused multiply-adds over the inner index in order (`c = fma(a_ik, b_kj, c)`
//! for k = 0, 1, ...), as ggml-cpu's `simd_gemm` computes it. The order is fixed, so every
//! version below gives the same bits; they differ only in speed.
//!
//! This module is allowed `unsafe` for the AVX2 and AVX-512 micro-kernels and for calling the
//! `target_feature` versions after checking the CPU has those features. (A portable `mul_add`
//! without FMA in the target is a library call per element.)

/// `c[i·n + j] += Σ_k a[i·k_len + k] · b[k·n + j]` for `i < m`, `j < n`, `k < k_len`, each sum
/// a chain of fused multiply-adds in order of `k`, starting from the value in `c`.
///
/// # Panics
/// If a slice is shorter than its dimensions say (a bug of the caller: the tiles are sized
/// from the same dimensions).
pub(super) fn gemm_acc(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k_len: usize, n: usize) {
    assert!(c.len() >= m * n && a.len() >= m * k_len && b.len() >= k_len * n);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above); the lengths were checked.
            unsafe { x86::gemm_avx512(c, a, b, m, k_len, n) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            unsafe { x86::gemm_avx2(c, a, b, m, k_len, n) };
            return;
        }
    }
    gemm_portable(c, a, b, m, k_len, n);
}

/// The reference loops (also what the AVX2 + FMA version compiles).
#[inline(always)]
fn gemm_portable(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k_len: usize, n: usize) {
    for (c_row, a_row) in c.chunks_exact_mut(n).zip(a.chunks_exact(k_len)).take(m) {
        for (&s, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
            for (cv, &bv) in c_row.iter_mut().zip(b_row) {
                *cv = s.mul_add(bv, *cv);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Columns of `C` one block of [`block_avx2`] covers (two 8-lane registers).
    const COLS_AVX2: usize = 16;

    /// [`super::gemm_acc`] in blocks of 4 rows × 16 columns of `C` held in 8 registers over
    /// the whole inner dimension (C is loaded and stored once per block, not once per inner
    /// step); the columns past the last whole block by [`super::gemm_portable`]'s loop,
    /// compiled with FMA.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `c`, `a` and `b` must hold `m·n`, `m·k_len` and
    /// `k_len·n` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gemm_avx2(
        c: &mut [f32],
        a: &[f32],
        b: &[f32],
        m: usize,
        k_len: usize,
        n: usize,
    ) {
        let whole = n - n % COLS_AVX2;
        for j in (0..whole).step_by(COLS_AVX2) {
            let mut i = 0;
            while i + 4 <= m {
                // SAFETY: rows i..i + 4 <= m, columns j..j + 16 <= n, within the lengths the
                // caller guarantees.
                unsafe { block_avx2::<4>(c, a, b, i, j, k_len, n) };
                i += 4;
            }
            while i < m {
                // SAFETY: as above, one row.
                unsafe { block_avx2::<1>(c, a, b, i, j, k_len, n) };
                i += 1;
            }
        }
        if whole < n {
            for (c_row, a_row) in c.chunks_exact_mut(n).zip(a.chunks_exact(k_len)).take(m) {
                for (&s, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
                    for (cv, &bv) in c_row[whole..].iter_mut().zip(&b_row[whole..]) {
                        *cv = s.mul_add(bv, *cv);
                    }
                }
            }
        }
    }

    /// Rows `i..i + ROWS`, columns `j..j + 16` of `C`: loaded, updated over the whole inner
    /// dimension, stored back.
    ///
    /// # Safety
    /// AVX2 and FMA; the rows and columns must lie within the matrices.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_avx2<const ROWS: usize>(
        c: &mut [f32],
        a: &[f32],
        b: &[f32],
        i: usize,
        j: usize,
        k_len: usize,
        n: usize,
    ) {
        let c_ptr = c.as_mut_ptr();
        let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
        for (row, acc_row) in acc.iter_mut().enumerate() {
            for (r, reg) in acc_row.iter_mut().enumerate() {
                // SAFETY: columns j + 8r..j + 8r + 8 <= n of row i + row < m.
                *reg = unsafe { _mm256_loadu_ps(c_ptr.add((i + row) * n + j + 8 * r)) };
            }
        }
        let (a_ptr, b_ptr) = (a.as_ptr(), b.as_ptr());
        for kk in 0..k_len {
            // SAFETY: row kk < k_len of B, columns j..j + 16 <= n.
            let bv: [__m256; 2] =
                std::array::from_fn(|r| unsafe { _mm256_loadu_ps(b_ptr.add(kk * n + j + 8 * r)) });
            for (row, acc_row) in acc.iter_mut().enumerate() {
                // SAFETY: element kk < k_len of row i + row < m of A.
                let s = _mm256_broadcast_ss(unsafe { &*a_ptr.add((i + row) * k_len + kk) });
                for (reg, &bv) in acc_row.iter_mut().zip(&bv) {
                    *reg = _mm256_fmadd_ps(s, bv, *reg);
                }
            }
        }
        for (row, acc_row) in acc.iter().enumerate() {
            for (r, &reg) in acc_row.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm256_storeu_ps(c_ptr.add((i + row) * n + j + 8 * r), reg) };
            }
        }
    }

    /// Columns of `C` one block of [`block`] covers (four 16-lane registers).
    const COLS: usize = 64;

    /// [`super::gemm_acc`] in blocks of 4 rows × 64 columns of `C` held in 16 registers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `c`, `a` and `b` must hold `m·n`, `m·k_len` and `k_len·n`
    /// values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gemm_avx512(
        c: &mut [f32],
        a: &[f32],
        b: &[f32],
        m: usize,
        k_len: usize,
        n: usize,
    ) {
        let mut j = 0;
        while j < n {
            let cols = (n - j).min(COLS);
            let mut i = 0;
            while i + 4 <= m {
                // SAFETY: rows i..i + 4 < m and columns j..j + cols <= n, within the lengths
                // the caller guarantees.
                unsafe { block::<4>(c, a, b, i, j, cols, k_len, n) };
                i += 4;
            }
            while i < m {
                // SAFETY: as above, one row.
                unsafe { block::<1>(c, a, b, i, j, cols, k_len, n) };
                i += 1;
            }
            j += COLS;
        }
    }

    /// Rows `i..i + ROWS`, columns `j..j + cols` (`cols <= 64`) of `C`: loaded, updated over
    /// the whole inner dimension, stored back. Lanes past `cols` are masked off (never read or
    /// written).
    ///
    /// # Safety
    /// AVX-512F; the rows and columns must lie within the matrices.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<const ROWS: usize>(
        c: &mut [f32],
        a: &[f32],
        b: &[f32],
        i: usize,
        j: usize,
        cols: usize,
        k_len: usize,
        n: usize,
    ) {
        let masks: [__mmask16; 4] = std::array::from_fn(|r| {
            let lanes = cols.saturating_sub(16 * r).min(16);
            ((1u32 << lanes) - 1) as __mmask16
        });
        let c_ptr = c.as_mut_ptr();
        let mut acc = [[_mm512_setzero_ps(); 4]; ROWS];
        for (row, acc_row) in acc.iter_mut().enumerate() {
            for (r, reg) in acc_row.iter_mut().enumerate() {
                // SAFETY: masked lanes lie within row `i + row`, columns < j + cols <= n.
                *reg = unsafe {
                    _mm512_maskz_loadu_ps(masks[r], c_ptr.add((i + row) * n + j + 16 * r))
                };
            }
        }
        let b_ptr = b.as_ptr();
        for kk in 0..k_len {
            let bv: [__m512; 4] = std::array::from_fn(|r| {
                // SAFETY: row kk < k_len of B, columns < j + cols <= n (masked lanes only).
                unsafe { _mm512_maskz_loadu_ps(masks[r], b_ptr.add(kk * n + j + 16 * r)) }
            });
            for (row, acc_row) in acc.iter_mut().enumerate() {
                let s = _mm512_set1_ps(a[(i + row) * k_len + kk]);
                for (reg, &bv) in acc_row.iter_mut().zip(&bv) {
                    *reg = _mm512_fmadd_ps(s, bv, *reg);
                }
            }
        }
        for (row, acc_row) in acc.iter().enumerate() {
            for (r, &reg) in acc_row.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe {
                    _mm512_mask_storeu_ps(c_ptr.add((i + row) * n + j + 16 * r), masks[r], reg)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).max(1);
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_version_gives_the_reference_bits() {
        // shapes with row and column tails (m % 4, n % 16, n > 64)
        for (m, k, n, seed) in [
            (1, 1, 1, 1),
            (3, 40, 64, 2),
            (64, 128, 64, 3),
            (7, 64, 80, 4),
            (5, 3, 37, 5),
            (2, 64, 16, 6),
        ] {
            let (a, b, c0) = (
                values(m * k, seed),
                values(k * n, seed + 9),
                values(m * n, seed + 7),
            );
            let mut want = c0.clone();
            for i in 0..m {
                for j in 0..n {
                    for kk in 0..k {
                        want[i * n + j] = a[i * k + kk].mul_add(b[kk * n + j], want[i * n + j]);
                    }
                }
            }
            let mut got = c0.clone();
            gemm_acc(&mut got, &a, &b, m, k, n);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "dispatched {m}x{k}x{n}"
            );
            let mut portable = c0.clone();
            gemm_portable(&mut portable, &a, &b, m, k, n);
            assert_eq!(portable, want, "portable {m}x{k}x{n}");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                let mut avx2 = c0.clone();
                // SAFETY: the CPU has AVX2 and FMA (checked just above).
                unsafe { x86::gemm_avx2(&mut avx2, &a, &b, m, k, n) };
                assert_eq!(avx2, want, "avx2 {m}x{k}x{n}");
            }
        }
    }
}
