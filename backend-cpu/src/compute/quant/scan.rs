//! Row scans of SOFT_MAX: the maximum of a row and the runs of masked (-inf) entries. These
//! are the portable versions, shaped like the AVX2 ones in module `simd` (sixteen lanes), which
//! give the same results.

/// C's `MAX(a, b)` (`a > b ? a : b`), as ggml's `ggml_vec_max_f32` takes it (a NaN `b` wins,
/// a NaN `a` loses).
#[inline(always)]
pub(super) fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Entries per step of the row scans ([`row_max`], [`first_where_masked`]): one AVX-512
/// vector, two AVX2 ones.
const SCAN_LANES: usize = 16;

/// The index of the first entry of `w` that is -inf (`masked`) or is not (`!masked`), else
/// `w.len()`. [`SCAN_LANES`] entries per step as one bit mask (in `simd`, two vector compares
/// and move-masks), where `position` would test one entry per step: most of a row is masked
/// (the KV cache's unused cells, the causal mask).
pub(super) fn first_where_masked(w: &[f32], masked: bool) -> usize {
    let (chunks, tail) = w.as_chunks::<SCAN_LANES>();
    for (n, chunk) in chunks.iter().enumerate() {
        let mut hits = 0u32;
        for (i, &v) in chunk.iter().enumerate() {
            hits |= u32::from((v == f32::NEG_INFINITY) == masked) << i;
        }
        if hits != 0 {
            return n * SCAN_LANES + hits.trailing_zeros() as usize;
        }
    }
    let done = chunks.len() * SCAN_LANES;
    done + tail
        .iter()
        .position(|&v| (v == f32::NEG_INFINITY) == masked)
        .unwrap_or(tail.len())
}

/// `fold(-inf, c_max)` over `w` in order, as ggml's `ggml_vec_max_f32` scans. Without NaNs
/// the result is the largest value whatever the order (up to the sign of a zero maximum,
/// which no later step can tell: `x - 0` and `x + 0` are equal for every `x` but zeros, and
/// `exp(±0)` is 1), so it is taken in [`SCAN_LANES`] lanes (in `simd`, two vectors), with
/// the NaN test in the same pass; a row with a NaN is scanned again in order, where a NaN is
/// kept only when nothing after it compares.
pub(super) fn row_max(w: &[f32]) -> f32 {
    let (chunks, tail) = w.as_chunks::<SCAN_LANES>();
    let mut lanes = [f32::NEG_INFINITY; SCAN_LANES];
    let mut nan = [false; SCAN_LANES];
    for chunk in chunks {
        for ((m, n), &v) in lanes.iter_mut().zip(nan.iter_mut()).zip(chunk) {
            *m = c_max(*m, v);
            *n |= v.is_nan();
        }
    }
    if nan.contains(&true) || tail.iter().any(|v| v.is_nan()) {
        return w.iter().fold(f32::NEG_INFINITY, |m, &v| c_max(m, v));
    }
    let max = lanes.into_iter().fold(f32::NEG_INFINITY, c_max);
    tail.iter().fold(max, |m, &v| c_max(m, v))
}

#[cfg(test)]
mod tests {
    /// The portable scans and the dispatched ones (AVX2 where the CPU has it) agree, bit for
    /// bit, on rows of every length up to 70 with masked runs, zeros of both signs, infinities
    /// and NaNs at every position.
    #[test]
    fn portable_and_dispatched_scans_agree() {
        let inf = f32::INFINITY;
        let specials = [-inf, inf, 0.0, -0.0, f32::NAN];
        let mut seed = 7u32;
        for len in 0..70usize {
            for special in 0..=specials.len() {
                let row: Vec<f32> = (0..len)
                    .map(|i| {
                        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        match seed >> 29 {
                            0..=2 => -inf,
                            3 if special < specials.len() => specials[special],
                            _ => (seed >> 8) as f32 / 1e6 - 8.0 + i as f32 * 0.01,
                        }
                    })
                    .collect();
                assert_eq!(
                    super::row_max(&row).to_bits(),
                    super::super::simd::row_max(&row).to_bits(),
                    "{row:?}"
                );
                for start in 0..len.min(20) {
                    for masked in [false, true] {
                        assert_eq!(
                            super::first_where_masked(&row[start..], masked),
                            super::super::simd::first_where_masked(&row[start..], masked),
                            "{row:?} {start} {masked}"
                        );
                    }
                }
            }
        }
    }
}
