//! Q4_0 and Q8_0 weights times Q8_0 activations, several weight rows by several activation
//! rows at a time (register blocking, as llamafile's tinyBLAS does for ggml-cpu).
//!
//! Every output element has one definition, whichever kernel (portable, AVX2, AVX-VNNI,
//! AVX-512 VNNI) and whichever tile shape computes it:
//!
//! * per block `b` the exact integer sums of eight lanes, lane `l` summing the products of
//!   elements `4l..4l+4` (`(q - 8) * y` for Q4_0, `x * y` for Q8_0);
//! * eight f32 accumulators, `acc[l] = fma(dx_b * dy_b, lane_l as f32, acc[l])` in block order
//!   (`dx_b * dy_b` rounded to f32 once, the lane exact in f32);
//! * the result `((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))`.
//!
//! This is the combination ggml's AVX2 code uses (`ggml_vec_dot_q8_0_q8_0` and tinyBLAS keep
//! eight f32 lanes scaled by `dx * dy` per block and sum them at the end), so the results stay
//! as close to ggml-cpu as the previous per-block scalar sum, and they do not depend on the
//! tile shape or on the thread count.
//!
//! The kernels read the activations as [`Q8Rows`]: the quants, the scales widened to f32 and
//! per lane a bias (`-8 * sum(y)` for Q4_0 weights, `-128 * sum(y)` for Q8_0 weights) that
//! turns an unsigned-by-signed byte product sum into the signed one (module `simd`).

use proto_core::{Error, Result};

use super::q4::Q4_0_BYTES;
use super::q8::Q8_0_BYTES;
use proto_core::ggml::types::id as ty;

use super::{fp16, QK32};
use crate::compute::scratch::{self, Scratch};

/// Lanes of a block's integer sums (elements `4l..4l+4` in lane `l`).
pub(super) const BLOCK_LANES: usize = 8;

/// The weight formats of the tile kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q0 {
    /// `block_q4_0`.
    Q4_0,
    /// `block_q8_0`.
    Q8_0,
}

impl Q0 {
    /// The tile-kernel format of weights of `type_id`, if they have one.
    pub fn of(type_id: u32) -> Option<Q0> {
        match type_id {
            ty::Q4_0 => Some(Q0::Q4_0),
            ty::Q8_0 => Some(Q0::Q8_0),
            _ => None,
        }
    }

    /// Bytes per block of the weights.
    pub(super) fn block_bytes(self) -> usize {
        match self {
            Q0::Q4_0 => Q4_0_BYTES,
            Q0::Q8_0 => Q8_0_BYTES,
        }
    }

    /// The offset the unsigned weight bytes of the SIMD kernels carry (`q` for Q4_0,
    /// `x + 128` for Q8_0).
    fn offset(self) -> i32 {
        match self {
            Q0::Q4_0 => 8,
            Q0::Q8_0 => 128,
        }
    }
}

/// Bytes of a block of [`Q8Rows`]: the 32 quants, [`BLOCK_LANES`] i32 biases
/// (`-offset * sum(y)` over each lane's four quants) and the scale as f32, repeated eight times
/// (so that a kernel multiplies by it with one vector load), all little-endian.
pub(super) const ROW_BLOCK_BYTES: usize = QK32 + 4 * BLOCK_LANES + 4 * BLOCK_LANES;
/// Offset of the biases in a block of [`Q8Rows`].
pub(super) const ROW_BIAS: usize = QK32;
/// Offset of the scales in a block of [`Q8Rows`].
pub(super) const ROW_SCALE: usize = QK32 + 4 * BLOCK_LANES;

/// Q8_0 activation rows laid out for the tile kernels of one weight format: per block
/// [`ROW_BLOCK_BYTES`] bytes, so that a kernel reads one stream per row.
pub struct Q8Rows {
    kind: Q0,
    /// Blocks per row.
    blocks: usize,
    bytes: Scratch<u8>,
    /// No quant is -128 (always so for quantized activations).
    signable: bool,
}

/// One row of [`Q8Rows`]: `blocks` blocks of [`ROW_BLOCK_BYTES`].
#[derive(Clone, Copy)]
pub struct Q8Row<'a> {
    pub(super) blocks: usize,
    pub(super) bytes: &'a [u8],
    /// No quant of the rows is -128, so a kernel may put a weight's sign onto one (the
    /// AVX2 trick of ggml-cpu, exact then).
    pub(super) signable: bool,
}

/// Lays out consecutive Q8_0 blocks of `src` as [`ROW_BLOCK_BYTES`] blocks in `dst`, the
/// biases for weights whose quants are offset by `offset`; whether no quant is -128. Written
/// as fixed-size array steps so that it vectorizes.
#[inline(always)]
pub(super) fn q8_0_to_row_blocks(offset: i32, src: &[u8], dst: &mut [u8]) -> bool {
    let mut minus128 = 0u8;
    for (b, o) in src
        .chunks_exact(Q8_0_BYTES)
        .zip(dst.chunks_exact_mut(ROW_BLOCK_BYTES))
    {
        let (Some(&[lo, hi]), Some(q), Some(o)) = (
            b.first_chunk::<2>(),
            b.get(2..).and_then(|q| q.first_chunk::<QK32>()),
            o.first_chunk_mut::<ROW_BLOCK_BYTES>(),
        ) else {
            break;
        };
        o[..QK32].copy_from_slice(q);
        let bias: [i32; BLOCK_LANES] = std::array::from_fn(|l| {
            let sum: i32 = q[4 * l..4 * l + 4]
                .iter()
                .map(|&v| i32::from(v as i8))
                .sum();
            -offset * sum
        });
        minus128 |= q.iter().fold(0, |m, &v| m | u8::from(v == 0x80));
        for (d, b) in o[ROW_BIAS..ROW_SCALE].chunks_exact_mut(4).zip(bias) {
            d.copy_from_slice(&b.to_le_bytes());
        }
        let d = fp16(lo, hi).to_le_bytes();
        for s in o[ROW_SCALE..].chunks_exact_mut(4) {
            s.copy_from_slice(&d);
        }
    }
    minus128 == 0
}

impl Q8Rows {
    /// Rows of `k` elements from `bytes`, consecutive Q8_0 rows (`k` a multiple of 32), for
    /// weights of format `kind`.
    pub fn from_q8_0(kind: Q0, k: usize, bytes: &[u8]) -> Result<Q8Rows> {
        if k == 0 || !k.is_multiple_of(QK32) {
            return Err(Error::Backend(format!(
                "tile kernels: rows of {k} elements are not whole blocks"
            )));
        }
        let n = bytes.len() / Q8_0_BYTES;
        let mut out = scratch::zeroed::<u8>(n * ROW_BLOCK_BYTES);
        let signable = super::simd::q8_0_to_row_blocks(kind.offset(), bytes, &mut out);
        Ok(Q8Rows {
            kind,
            blocks: k / QK32,
            bytes: out,
            signable,
        })
    }

    /// The weight format the rows were laid out for.
    pub fn kind(&self) -> Q0 {
        self.kind
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.bytes.len() / (self.blocks * ROW_BLOCK_BYTES)
    }

    /// Row `r`; `None` past the end.
    pub fn row(&self, r: usize) -> Option<Q8Row<'_>> {
        let size = self.blocks * ROW_BLOCK_BYTES;
        Some(Q8Row {
            blocks: self.blocks,
            bytes: self.bytes.get(r * size..(r + 1) * size)?,
            signable: self.signable,
        })
    }
}

impl Q8Row<'_> {
    /// Block `b`'s bytes.
    fn block(&self, b: usize) -> &[u8] {
        &self.bytes[b * ROW_BLOCK_BYTES..(b + 1) * ROW_BLOCK_BYTES]
    }
}

/// `out[i][j]` = the dot product of weight row `w[i]` (format `rows.kind()`, at least one
/// row of `rows` long) with activation row `y[j]`.
pub fn dot_tile<const RM: usize, const RN: usize>(
    kind: Q0,
    w: &[&[u8]; RM],
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]; RM],
) -> Result<()> {
    let Some(first) = y.first() else {
        return Ok(());
    };
    let blocks = first.blocks;
    let ok_y = y
        .iter()
        .all(|r| r.blocks == blocks && r.bytes.len() == blocks * ROW_BLOCK_BYTES);
    let ok_w = w.iter().all(|r| r.len() >= blocks * kind.block_bytes());
    if !ok_y || !ok_w {
        return Err(Error::Backend(
            "tile kernels: rows of different lengths".into(),
        ));
    }
    super::simd::dot_tile(kind, w, y, out);
    Ok(())
}

/// Weight rows at a fixed stride in one byte slice: row `i` is the `len` bytes at
/// `i * stride` (a tile of a weight matrix: no per-row slice to build).
#[derive(Clone, Copy, Debug)]
pub struct StridedRows<'a> {
    bytes: &'a [u8],
    stride: usize,
    len: usize,
    count: usize,
}

impl<'a> StridedRows<'a> {
    /// `count` rows of `len` bytes, `stride` bytes apart from the start of `bytes`; fails
    /// unless all of them lie in `bytes`.
    pub fn new(bytes: &'a [u8], stride: usize, len: usize, count: usize) -> Result<Self> {
        let end = match count.checked_sub(1) {
            None => Some(0),
            Some(last) => last.checked_mul(stride).and_then(|s| s.checked_add(len)),
        };
        if end.is_none_or(|end| end > bytes.len()) {
            return Err(Error::Backend(
                "tile kernels: weight rows outside their tensor".into(),
            ));
        }
        Ok(StridedRows {
            bytes,
            stride,
            len,
            count,
        })
    }

    /// Number of rows.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes per row.
    pub fn row_len(&self) -> usize {
        self.len
    }

    /// Row `i` (`i < count`; checked by the slice index).
    #[inline(always)]
    pub fn row(&self, i: usize) -> &'a [u8] {
        &self.bytes[i * self.stride..i * self.stride + self.len]
    }
}

/// `out[n][j]` = the dot product of weight row `w.row(n)` (format `kind`) with activation row
/// `y[j]`: [`dot_tile`] over groups of four rows a quarter of `w` apart (rows `q`,
/// `q + c/4`, `q + 2c/4`, `q + 3c/4` of `c`; so that each of the four reads its own pages,
/// as the hardware prefetchers follow one stream per page, not several interleaved ones),
/// then the rest one by one, with the checks and the kernel choice made once. The grouping
/// does not change any result.
pub fn dot_rows<const RN: usize>(
    kind: Q0,
    w: StridedRows<'_>,
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]],
) -> Result<()> {
    let Some(first) = y.first() else {
        return Ok(());
    };
    let blocks = first.blocks;
    let ok_y = y
        .iter()
        .all(|r| r.blocks == blocks && r.bytes.len() == blocks * ROW_BLOCK_BYTES);
    let ok_w = w.len >= blocks * kind.block_bytes();
    if !ok_y || !ok_w || out.len() != w.count {
        return Err(Error::Backend(
            "tile kernels: rows of different lengths".into(),
        ));
    }
    super::simd::dot_rows(kind, w, y, out);
    Ok(())
}

/// Whether [`dot_rows`] is better called with four activation rows than three on this CPU
/// (its AVX-512 kernel has the registers for four; the AVX2 ones do not).
pub fn dot_rows_wide() -> bool {
    super::simd::has_avx512_vnni()
}

/// Whether MUL_MAT widens a tile of F16 weights to f32 once for the activation rows that pass
/// over it and runs the F32 kernel on it, rather than run the F16 kernel, which widens each
/// weight vector as it loads it (the same bits either way). Measured per CPU vendor, 256 x 256
/// weights by 64 rows (`float_gemm` of `benches/tiles.rs`) and llama-bench's tiny F16 pp64:
/// on AMD EPYC (AVX-512) widening took the tile from 145 to 123 us; on Intel Xeon (AVX-512)
/// the F16 kernel takes 89 us against the F32 one's 108 before any widening, and pp64 ran
/// 1.16-1.24x faster without it.
pub fn widen_f16_tiles() -> bool {
    match WIDEN_F16_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => super::simd::amd_cores(),
    }
}

/// A test's choice for [`widen_f16_tiles`]: 0 the CPU's, 1 never, 2 always (the same bits
/// either way, so other tests running meanwhile are not affected).
static WIDEN_F16_OVERRIDE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Forces [`widen_f16_tiles`] (`Some`) or gives the choice back to the CPU (`None`).
#[cfg(test)]
pub(crate) fn force_widen_f16_tiles(widen: Option<bool>) {
    let value = match widen {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    };
    WIDEN_F16_OVERRIDE.store(value, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`dot_q4_k_rows`] is better called with 16 activation rows than 8 on this CPU
/// (its AVX-512 VNNI kernel computes one activation row per i32 lane of a zmm).
pub fn dot_q4_k_rows_wide() -> bool {
    super::simd::q4_k_rows_per_call() == 16
}

/// Runs `tile` on the groups of [`dot_rows`] (four rows a quarter apart, then the rest one
/// by one), each with its weight rows and the outputs it fills.
#[inline(always)]
pub(super) fn for_each_group<const RN: usize>(
    w: StridedRows<'_>,
    out: &mut [[f32; RN]],
    mut tile4: impl FnMut(&[&[u8]; 4], &mut [[f32; RN]; 4]),
    mut tile1: impl FnMut(&[u8], &mut [f32; RN]),
) {
    let quarter = w.count / 4;
    for q in 0..quarter {
        let rows: [&[u8]; 4] = std::array::from_fn(|i| w.row(q + i * quarter));
        let mut o = [[0f32; RN]; 4];
        tile4(&rows, &mut o);
        for (i, o) in o.into_iter().enumerate() {
            out[q + i * quarter] = o;
        }
    }
    for (n, o) in out.iter_mut().enumerate().take(w.count).skip(4 * quarter) {
        tile1(w.row(n), o);
    }
}

/// F16 rows `x[0]`, `x[1]` times F16 row `y` (all of one length): the two results of
/// [`super::vec_dot`], computed together.
pub fn dot_f16_x2(x: &[&[u8]; 2], y: &[u8]) -> Result<[f32; 2]> {
    if x.iter().any(|r| r.len() != y.len()) || !y.len().is_multiple_of(2) {
        return Err(Error::Backend("F16 rows of different lengths".into()));
    }
    Ok(super::simd::vec_dot_f16_x2(x, y))
}

/// The float weight formats of [`dot_float_rows`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatRows {
    /// F16 weights (`float::vec_dot_f16`).
    F16,
    /// F32 weights, little-endian (`float::vec_dot_f32`).
    F32,
}

impl FloatRows {
    /// Bytes per weight element.
    pub fn bytes(self) -> usize {
        match self {
            FloatRows::F16 => 2,
            FloatRows::F32 => 4,
        }
    }

    /// The portable dot product of one weight row `x` with activation values `y` (the bits of
    /// `vec_dot` with such weights).
    #[inline(always)]
    pub(super) fn portable(self, x: &[u8], y: &[f32]) -> f32 {
        match self {
            FloatRows::F16 => super::float::vec_dot_f16_widened(x, y),
            FloatRows::F32 => super::float::vec_dot_f32_widened(x, y),
        }
    }
}

/// `out[n][j]` = the dot product ([`super::vec_dot`] with weights of format `kind`) of
/// weight row `w.row(n)` (F16, or F32 little-endian bytes) with activation row `y[j]`, given
/// as f32 values (for F16 weights the exact widenings of F16 values; the caller widens each
/// activation row once rather than once per weight row). Weight rows go four at a time
/// through a register-blocked kernel where the CPU has one (AVX-512 or AVX2), which keeps
/// `vec_dot`'s 32 lanes, FMAs and reduction per output, so every result has
/// `vec_dot`'s bits whatever the grouping (that of [`dot_rows`]).
pub fn dot_float_rows<const RN: usize>(
    kind: FloatRows,
    w: StridedRows<'_>,
    y: &[&[f32]; RN],
    out: &mut [[f32; RN]],
) -> Result<()> {
    let n = y.first().map_or(0, |r| r.len());
    if y.iter().any(|r| r.len() != n) || w.len != kind.bytes() * n || out.len() != w.count {
        return Err(Error::Backend(format!(
            "{kind:?} rows of different lengths"
        )));
    }
    super::simd::dot_float_rows(kind, w, y, out);
    Ok(())
}

/// The row kernels' results as destination rows: `out[j * width + i] = group[i][j]` for
/// `width = group.len()` and `j < N` (`out` holds `N * width` values). With three activation
/// rows (the float kernels') and AVX-512, sixteen weight rows' results at a time are permuted
/// in registers (the gather of one value at a time took 2-3 % of F32 prompt processing).
///
/// # Panics
/// If `out` is shorter than `N * width`.
pub fn columns_to_rows<const N: usize>(group: &[[f32; N]], out: &mut [f32]) {
    let width = group.len();
    let out = &mut out[..N * width];
    let done = super::simd::columns_to_rows(group, out);
    for (j, row) in out.chunks_exact_mut(width.max(1)).enumerate() {
        for (d, o) in row[done..].iter_mut().zip(&group[done..]) {
            *d = o[j];
        }
    }
}

/// Whether [`dot_float_rows`] has a register-blocked kernel on this CPU for rows of `n`
/// elements (else it computes one product at a time, no faster than [`dot_f16_x2`]).
pub fn dot_float_rows_fast(n: usize) -> bool {
    super::simd::dot_float_rows_fast(n)
}

/// `out[n][j]` = the Q4_K dot product ([`super::vec_dot`] with Q4_K weights) of weight row
/// `w.row(n)` with Q8_K activation row `y[j]`: each weight block's scales and quants decoded
/// once for all the activation rows (AVX2 where the CPU has it), with `vec_dot`'s exact
/// integer sums and f32 steps, so every result has `vec_dot`'s bits.
pub fn dot_q4_k_rows<const RN: usize>(
    w: StridedRows<'_>,
    y: &[&[u8]; RN],
    out: &mut [[f32; RN]],
) -> Result<()> {
    use super::{k_quants::Q4_K_BYTES, q8::Q8_K_BYTES};
    let blocks = w.len / Q4_K_BYTES;
    if !w.len.is_multiple_of(Q4_K_BYTES)
        || y.iter().any(|r| r.len() != blocks * Q8_K_BYTES)
        || out.len() != w.count
    {
        return Err(Error::Backend("Q4_K rows of different lengths".into()));
    }
    super::simd::dot_q4_k_rows(w, y, out);
    Ok(())
}

/// The eight exact lane sums of weight block `xb` (format `kind`) with 32 quants `yq`.
#[inline(always)]
fn block_lanes(kind: Q0, xb: &[u8], yq: &[u8]) -> [i32; BLOCK_LANES] {
    let mut lanes = [0i32; BLOCK_LANES];
    for (e, &y) in yq.iter().enumerate().take(QK32) {
        let x = match kind {
            Q0::Q4_0 => {
                let byte = xb[2 + e % 16];
                i32::from(if e < 16 { byte & 0x0F } else { byte >> 4 }) - 8
            }
            Q0::Q8_0 => i32::from(xb[2 + e] as i8),
        };
        lanes[e / 4] += x * i32::from(y as i8);
    }
    lanes
}

/// `acc[l] = fma(d, lanes[l], acc[l])`.
#[inline(always)]
fn accumulate(acc: &mut [f32; BLOCK_LANES], d: f32, lanes: [i32; BLOCK_LANES]) {
    for (a, s) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(s as f32, *a);
    }
}

/// The final sum of the eight accumulators (the order of an AVX horizontal sum: halves,
/// then pairs, then the two).
#[inline(always)]
pub(super) fn hsum8(a: [f32; BLOCK_LANES]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// Portable [`dot_tile`] (lengths checked by the caller).
pub(super) fn dot_tile_portable<const RM: usize, const RN: usize>(
    kind: Q0,
    w: &[&[u8]; RM],
    y: &[Q8Row<'_>; RN],
    out: &mut [[f32; RN]; RM],
) {
    let bb = kind.block_bytes();
    for (wi, oi) in w.iter().zip(out.iter_mut()) {
        for (yj, o) in y.iter().zip(oi.iter_mut()) {
            let mut acc = [0f32; BLOCK_LANES];
            for b in 0..yj.blocks {
                let xb = &wi[b * bb..(b + 1) * bb];
                let yb = yj.block(b);
                let s = &yb[ROW_SCALE..ROW_SCALE + 4];
                let dy = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                let lanes = block_lanes(kind, xb, &yb[..QK32]);
                accumulate(&mut acc, fp16(xb[0], xb[1]) * dy, lanes);
            }
            *o = hsum8(acc);
        }
    }
}

/// Portable dot product of a weight row `x` (format `kind`) with a Q8_0 row `y`, whole blocks.
#[inline(always)]
pub(super) fn vec_dot_portable(kind: Q0, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; BLOCK_LANES];
    for (xb, yb) in x
        .chunks_exact(kind.block_bytes())
        .zip(y.chunks_exact(Q8_0_BYTES))
    {
        let lanes = block_lanes(kind, xb, &yb[2..]);
        accumulate(&mut acc, fp16(xb[0], xb[1]) * fp16(yb[0], yb[1]), lanes);
    }
    hsum8(acc)
}

#[cfg(test)]
mod tests {
    use super::super::{fp16_bytes, simd};
    use super::*;

    /// xorshift64*: reproducible bytes without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        /// Random blocks of `bytes` bytes whose first two bytes are a finite f16 scale.
        fn blocks(&mut self, n: usize, bytes: usize) -> Vec<u8> {
            let mut v: Vec<u8> = (0..n * bytes).map(|_| self.next() as u8).collect();
            for b in v.chunks_exact_mut(bytes) {
                let scale = (self.next() % 2001) as f32 / 1000.0 - 1.0;
                b[..2].copy_from_slice(&fp16_bytes(scale));
            }
            v
        }
    }

    /// Every implementation of an `RM x RN` tile equals the portable and the dispatched
    /// `vec_dot` of each pair, bit for bit (random quants, -128 included in the weights,
    /// and in the activations unless `quantized_y`: activations as quantizing makes them,
    /// which the kernels multiply another way).
    fn check<const RM: usize, const RN: usize>(
        rng: &mut Rng,
        kind: Q0,
        blocks: usize,
        quantized_y: bool,
    ) {
        let w: Vec<Vec<u8>> = (0..RM)
            .map(|_| {
                let mut r = rng.blocks(blocks, kind.block_bytes());
                if kind == Q0::Q8_0 {
                    r[2] = 0x80;
                }
                r
            })
            .collect();
        let mut y8 = rng.blocks(blocks * RN, Q8_0_BYTES);
        for b in y8.chunks_exact_mut(Q8_0_BYTES) {
            for q in &mut b[2..] {
                if quantized_y && *q == 0x80 {
                    *q = 0x81;
                }
            }
            if !quantized_y {
                b[3] = 0x80;
            }
        }
        let rows = Q8Rows::from_q8_0(kind, blocks * QK32, &y8).unwrap();
        assert_eq!(rows.rows(), RN);
        assert_eq!(rows.signable, quantized_y);
        let wr: [&[u8]; RM] = std::array::from_fn(|i| &w[i][..]);
        let yr: [Q8Row<'_>; RN] = std::array::from_fn(|j| rows.row(j).unwrap());
        let ybytes = |j: usize| &y8[j * blocks * Q8_0_BYTES..(j + 1) * blocks * Q8_0_BYTES];
        for (name, out) in simd::dot_tile_all(kind, &wr, &yr) {
            for (i, (o, x)) in out.iter().zip(wr).enumerate() {
                for (j, o) in o.iter().enumerate() {
                    let portable = vec_dot_portable(kind, x, ybytes(j));
                    let dispatched = match kind {
                        Q0::Q4_0 => simd::vec_dot_q4_0_q8_0(x, ybytes(j)),
                        Q0::Q8_0 => simd::vec_dot_q8_0_q8_0(x, ybytes(j)),
                    };
                    assert_eq!(portable.to_bits(), dispatched.to_bits(), "{kind:?} vec_dot");
                    assert_eq!(
                        o.to_bits(),
                        portable.to_bits(),
                        "{kind:?} {name} {RM}x{RN} ({i}, {j}), {blocks} blocks"
                    );
                }
            }
        }
        let mut out = [[0f32; RN]; RM];
        dot_tile(kind, &wr, &yr, &mut out).unwrap();
        for (o, x) in out.iter().zip(wr) {
            for (j, o) in o.iter().enumerate() {
                assert_eq!(o.to_bits(), vec_dot_portable(kind, x, ybytes(j)).to_bits());
            }
        }
    }

    #[test]
    fn tile_kernels_match_vec_dot_bit_for_bit() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for kind in [Q0::Q4_0, Q0::Q8_0] {
            for (blocks, quantized_y) in [1, 2, 3, 7, 24]
                .into_iter()
                .flat_map(|b| [(b, false), (b, true)])
            {
                check::<4, 4>(&mut rng, kind, blocks, quantized_y);
                check::<4, 3>(&mut rng, kind, blocks, quantized_y);
                check::<1, 4>(&mut rng, kind, blocks, quantized_y);
                check::<4, 1>(&mut rng, kind, blocks, quantized_y);
                check::<1, 3>(&mut rng, kind, blocks, quantized_y);
                check::<1, 1>(&mut rng, kind, blocks, quantized_y);
            }
        }
    }

    /// `dot_rows` (groups of four a quarter apart, then single rows) gives each row's
    /// `vec_dot`.
    #[test]
    fn dot_rows_matches_vec_dot_for_every_grouping() {
        let mut rng = Rng(11);
        for kind in [Q0::Q4_0, Q0::Q8_0] {
            let blocks = 5;
            let w: Vec<Vec<u8>> = (0..7)
                .map(|_| rng.blocks(blocks, kind.block_bytes()))
                .collect();
            let y8 = rng.blocks(blocks * 3, Q8_0_BYTES);
            let rows = Q8Rows::from_q8_0(kind, blocks * QK32, &y8).unwrap();
            let wr: Vec<&[u8]> = w.iter().map(|r| &r[..]).collect();
            // the rows one stride apart in one slice, with a gap after each
            let rb = blocks * kind.block_bytes();
            let stride = rb + 5;
            let mut flat = vec![0u8; 6 * stride + rb];
            for (n, r) in w.iter().enumerate() {
                flat[n * stride..n * stride + rb].copy_from_slice(r);
            }
            let sw = StridedRows::new(&flat, stride, rb, 7).unwrap();
            assert!(StridedRows::new(&flat[1..], stride, rb, 7).is_err());
            let y: [Q8Row<'_>; 3] = std::array::from_fn(|j| rows.row(j).unwrap());
            let mut out = vec![[0f32; 3]; 7];
            dot_rows(kind, sw, &y, &mut out).unwrap();
            let mut one = vec![[0f32; 1]; 7];
            dot_rows(kind, sw, &[y[2]], &mut one).unwrap();
            let mut four = vec![[0f32; 4]; 7];
            dot_rows(kind, sw, &[y[1], y[0], y[2], y[1]], &mut four).unwrap();
            for (n, x) in wr.iter().enumerate() {
                for (j, o) in out[n].iter().enumerate() {
                    let yb = &y8[j * blocks * Q8_0_BYTES..(j + 1) * blocks * Q8_0_BYTES];
                    assert_eq!(o.to_bits(), vec_dot_portable(kind, x, yb).to_bits());
                }
                assert_eq!(one[n][0].to_bits(), out[n][2].to_bits());
                let four_bits = four[n].map(f32::to_bits);
                let want = [out[n][1], out[n][0], out[n][2], out[n][1]].map(f32::to_bits);
                assert_eq!(four_bits, want);
            }
            assert!(dot_rows(kind, sw, &y, &mut out[..6]).is_err());
        }
    }

    /// The AVX2 F16 dot product reduces in registers when there is no tail: still the
    /// portable bits.
    #[test]
    fn f16_dot_without_tail_matches_portable() {
        let mut rng = Rng(5);
        for len in [32usize, 64, 96, 256] {
            let mut row = || -> Vec<u8> {
                (0..len)
                    .flat_map(|_| {
                        let v = (rng.next() % 20001) as f32 / 1000.0 - 10.0;
                        half::f16::from_f32(v).to_bits().to_le_bytes()
                    })
                    .collect()
            };
            let (x, y) = (row(), row());
            assert_eq!(
                simd::vec_dot_f16(&x, &y).to_bits(),
                super::super::float::vec_dot_f16(&x, &y).to_bits(),
                "{len}"
            );
        }
    }

    /// The paired F16 dot product gives each row's own bits, tail or not.
    #[test]
    fn f16_pairs_match_single_rows() {
        let mut rng = Rng(9);
        for len in [0usize, 7, 32, 64, 100, 256] {
            let mut row = || -> Vec<u8> {
                (0..len)
                    .flat_map(|_| {
                        let v = (rng.next() % 20001) as f32 / 1000.0 - 10.0;
                        half::f16::from_f32(v).to_bits().to_le_bytes()
                    })
                    .collect()
            };
            let (a, b, y) = (row(), row(), row());
            let pair = dot_f16_x2(&[&a, &b], &y).unwrap();
            let float = super::super::float::vec_dot_f16;
            assert_eq!(pair[0].to_bits(), float(&a, &y).to_bits(), "{len}");
            assert_eq!(pair[1].to_bits(), float(&b, &y).to_bits(), "{len}");
        }
        assert!(dot_f16_x2(&[&[0u8; 4], &[0u8; 2]], &[0u8; 4]).is_err());
    }

    /// The bits of a kernel's results, for comparisons.
    fn bits<const RN: usize>(out: &[[f32; RN]]) -> Vec<[u32; RN]> {
        out.iter().map(|o| o.map(f32::to_bits)).collect()
    }

    /// `dot_float_rows` with one, two and six activation rows (the kernels' other register
    /// blockings) gives the bits of `out`, its results with the three rows `yr`; so does the
    /// AVX2 kernel called directly (where the dispatch takes the AVX-512 one) with one, three
    /// and six rows of `len` values.
    fn check_blockings(
        kind: FloatRows,
        sw: StridedRows<'_>,
        yr: [&[f32]; 3],
        out: &[[f32; 3]],
        len: usize,
    ) {
        let rows = out.len();
        let mut one = vec![[0f32; 1]; rows];
        dot_float_rows(kind, sw, &[yr[1]], &mut one).unwrap();
        let mut two = vec![[0f32; 2]; rows];
        dot_float_rows(kind, sw, &[yr[2], yr[0]], &mut two).unwrap();
        let yr6: [&[f32]; 6] = std::array::from_fn(|j| yr[(j + 1) % 3]);
        let mut six = vec![[0f32; 6]; rows];
        dot_float_rows(kind, sw, &yr6, &mut six).unwrap();
        for (n, o) in out.iter().enumerate() {
            assert_eq!(one[n][0].to_bits(), o[1].to_bits(), "{len} ({n})");
            assert_eq!(two[n].map(f32::to_bits), [o[2], o[0]].map(f32::to_bits));
            let want6: [u32; 6] = std::array::from_fn(|j| o[(j + 1) % 3].to_bits());
            assert_eq!(six[n].map(f32::to_bits), want6, "{len} ({n})");
        }
        let mut ymm = vec![[0f32; 3]; rows];
        if !simd::dot_float_rows_avx2(kind, sw, &yr, &mut ymm) {
            assert!(!len.is_multiple_of(32) || !simd::avx2_active());
            return;
        }
        let mut ymm1 = vec![[0f32; 1]; rows];
        let mut ymm6 = vec![[0f32; 6]; rows];
        assert!(simd::dot_float_rows_avx2(kind, sw, &[yr[1]], &mut ymm1));
        assert!(simd::dot_float_rows_avx2(kind, sw, &yr6, &mut ymm6));
        assert_eq!(bits(&ymm), bits(out), "{len}");
        assert_eq!(bits(&ymm1), bits(&one), "{len}");
        assert_eq!(bits(&ymm6), bits(&six), "{len}");
    }

    /// The register-blocked F16 rows give each pair's `vec_dot` bits (portable and
    /// dispatched), for every grouping of the weight rows, with and without a tail.
    #[test]
    fn f16_rows_match_vec_dot() {
        let mut rng = Rng(13);
        for len in [32usize, 64, 96, 256, 7, 100] {
            let mut row = || -> Vec<u8> {
                (0..len)
                    .flat_map(|_| {
                        let v = (rng.next() % 20001) as f32 / 1000.0 - 10.0;
                        half::f16::from_f32(v).to_bits().to_le_bytes()
                    })
                    .collect()
            };
            let w: Vec<Vec<u8>> = (0..7).map(|_| row()).collect();
            let y: Vec<Vec<u8>> = (0..3).map(|_| row()).collect();
            let widened: Vec<Vec<f32>> = y
                .iter()
                .map(|b| {
                    b.chunks_exact(2)
                        .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
                        .collect()
                })
                .collect();
            let wr: Vec<&[u8]> = w.iter().map(|r| &r[..]).collect();
            let flat: Vec<u8> = w.concat();
            let sw = StridedRows::new(&flat, 2 * len, 2 * len, 7).unwrap();
            let yr: [&[f32]; 3] = std::array::from_fn(|j| &widened[j][..]);
            let mut out = vec![[0f32; 3]; 7];
            dot_float_rows(FloatRows::F16, sw, &yr, &mut out).unwrap();
            check_blockings(FloatRows::F16, sw, yr, &out, len);
            let float = super::super::float::vec_dot_f16;
            for (n, x) in wr.iter().enumerate() {
                for (j, o) in out[n].iter().enumerate() {
                    let want = float(x, &y[j]);
                    assert_eq!(o.to_bits(), want.to_bits(), "{len} ({n}, {j})");
                    assert_eq!(simd::vec_dot_f16(x, &y[j]).to_bits(), want.to_bits());
                    assert_eq!(FloatRows::F16.portable(x, yr[j]).to_bits(), want.to_bits());
                }
            }
            assert!(dot_float_rows(FloatRows::F16, sw, &yr, &mut out[..6]).is_err());
        }
    }

    /// The F32 row kernel gives `vec_dot`'s bits (portable and dispatched) for every grouping
    /// of the weight rows, with one, two, three and six activation rows, with and without a
    /// tail.
    #[test]
    fn f32_rows_match_vec_dot() {
        let mut rng = Rng(17);
        for len in [32usize, 64, 96, 256, 7, 100] {
            let mut row = || -> Vec<f32> {
                (0..len)
                    .map(|_| (rng.next() % 20001) as f32 / 997.0 - 10.0)
                    .collect()
            };
            let w: Vec<Vec<f32>> = (0..7).map(|_| row()).collect();
            let y: Vec<Vec<f32>> = (0..3).map(|_| row()).collect();
            let wb: Vec<Vec<u8>> = w
                .iter()
                .map(|r| r.iter().flat_map(|v| v.to_le_bytes()).collect())
                .collect();
            let yb: Vec<Vec<u8>> = y
                .iter()
                .map(|r| r.iter().flat_map(|v| v.to_le_bytes()).collect())
                .collect();
            let flat: Vec<u8> = wb.concat();
            let sw = StridedRows::new(&flat, 4 * len, 4 * len, 7).unwrap();
            let yr: [&[f32]; 3] = std::array::from_fn(|j| &y[j][..]);
            let mut out = vec![[0f32; 3]; 7];
            dot_float_rows(FloatRows::F32, sw, &yr, &mut out).unwrap();
            check_blockings(FloatRows::F32, sw, yr, &out, len);
            for (n, x) in wb.iter().enumerate() {
                for (j, o) in out[n].iter().enumerate() {
                    let want = super::super::float::vec_dot_f32(x, &yb[j]);
                    assert_eq!(o.to_bits(), want.to_bits(), "{len} ({n}, {j})");
                    assert_eq!(simd::vec_dot_f32(x, &yb[j]).to_bits(), want.to_bits());
                    assert_eq!(FloatRows::F32.portable(x, yr[j]).to_bits(), want.to_bits());
                }
            }
            assert!(dot_float_rows(FloatRows::F32, sw, &yr, &mut out[..6]).is_err());
        }
    }

    /// The Q4_K row kernel gives `vec_dot`'s bits (portable and dispatched) for one, three
    /// and sixteen activation rows (the AVX-512 VNNI kernel's), over one and several
    /// super-blocks.
    #[test]
    fn q4_k_rows_match_vec_dot() {
        use super::super::{id, k_quants, quantize_row};
        let mut rng = Rng(23);
        for blocks in [1usize, 2, 3] {
            let len = 256 * blocks;
            let mut row = |t: u32, bytes: usize| -> Vec<u8> {
                let v: Vec<f32> = (0..len)
                    .map(|_| (rng.next() % 20001) as f32 / 1000.0 - 10.0)
                    .collect();
                let mut out = vec![0u8; bytes * blocks];
                quantize_row(t, &v, &mut out).unwrap();
                out
            };
            let w: Vec<Vec<u8>> = (0..5).map(|_| row(ty::Q4_K, 144)).collect();
            let y: Vec<Vec<u8>> = (0..3).map(|_| row(id("q8_K"), 292)).collect();
            let flat: Vec<u8> = w.concat();
            let sw = StridedRows::new(&flat, 144 * blocks, 144 * blocks, 5).unwrap();
            let yr: [&[u8]; 3] = std::array::from_fn(|j| &y[j][..]);
            let mut out = vec![[0f32; 3]; 5];
            dot_q4_k_rows(sw, &yr, &mut out).unwrap();
            let mut one = vec![[0f32; 1]; 5];
            dot_q4_k_rows(sw, &[yr[2]], &mut one).unwrap();
            let all = simd::dot_q4_k_rows_all(sw, &yr);
            for (name, got) in simd::dot_q4_k_rows_all(sw, &[yr[2]]) {
                for (n, g) in got.iter().enumerate() {
                    assert_eq!(
                        g[0].to_bits(),
                        out[n][2].to_bits(),
                        "{name} {blocks} row {n}"
                    );
                }
            }
            for (name, got) in &all {
                for (n, (g, o)) in got.iter().zip(&out).enumerate() {
                    let (g, o) = (g.map(f32::to_bits), o.map(f32::to_bits));
                    assert_eq!(g, o, "{name} {blocks} row {n}");
                }
            }
            for (n, x) in w.iter().enumerate() {
                for (j, o) in out[n].iter().enumerate() {
                    let want = k_quants::vec_dot_q4_k_q8_k(x, &y[j]);
                    assert_eq!(o.to_bits(), want.to_bits(), "{blocks} ({n}, {j})");
                    assert_eq!(simd::vec_dot_q4_k_q8_k(x, &y[j]).to_bits(), want.to_bits());
                }
                assert_eq!(one[n][0].to_bits(), out[n][2].to_bits());
            }
            assert!(dot_q4_k_rows(sw, &yr, &mut out[..4]).is_err());
            assert!(dot_q4_k_rows(sw, &[&y[0][1..]], &mut one).is_err());
            // sixteen activation rows (extreme quants too), seven weight rows (a group of
            // four and three single rows)
            let mut w: Vec<Vec<u8>> = (0..7).map(|_| row(ty::Q4_K, 144)).collect();
            let mut y: Vec<Vec<u8>> = (0..16).map(|_| row(id("q8_K"), 292)).collect();
            for b in 0..blocks {
                w[6][144 * b + 16..144 * b + 144].fill(0xFF);
                y[15][292 * b + 4..292 * b + 260].fill(0x80);
                y[14][292 * b + 4..292 * b + 260].fill(0x7F);
            }
            let flat: Vec<u8> = w.concat();
            let sw = StridedRows::new(&flat, 144 * blocks, 144 * blocks, 7).unwrap();
            let yr: [&[u8]; 16] = std::array::from_fn(|j| &y[j][..]);
            let mut out = vec![[0f32; 16]; 7];
            dot_q4_k_rows(sw, &yr, &mut out).unwrap();
            let all = simd::dot_q4_k_rows_all(sw, &yr);
            for (n, x) in w.iter().enumerate() {
                for (j, yj) in y.iter().enumerate() {
                    let want = k_quants::vec_dot_q4_k_q8_k(x, yj).to_bits();
                    assert_eq!(out[n][j].to_bits(), want, "16 rows {blocks} ({n}, {j})");
                    for (name, got) in &all {
                        assert_eq!(got[n][j].to_bits(), want, "{name} {blocks} ({n}, {j})");
                    }
                }
            }
            // one activation row (the extreme ones too) against the same seven weight rows
            for j in [0, 14, 15] {
                for (name, got) in simd::dot_q4_k_rows_all(sw, &[yr[j]]) {
                    for (n, g) in got.iter().enumerate() {
                        let want = out[n][j].to_bits();
                        assert_eq!(g[0].to_bits(), want, "{name} 1 row {blocks} ({n}, {j})");
                    }
                }
            }
        }
    }

    /// The lane definition is the plain dot product when nothing rounds.
    #[test]
    fn tile_kernels_compute_the_dot_product() {
        let mut rng = Rng(7);
        for kind in [Q0::Q4_0, Q0::Q8_0] {
            let mut x = rng.blocks(4, kind.block_bytes());
            let mut y = rng.blocks(4, Q8_0_BYTES);
            for b in x.chunks_exact_mut(kind.block_bytes()) {
                b[..2].copy_from_slice(&fp16_bytes(0.5));
            }
            for b in y.chunks_exact_mut(Q8_0_BYTES) {
                b[..2].copy_from_slice(&fp16_bytes(0.25));
            }
            let mut want = 0i64;
            for (xb, yb) in x
                .chunks_exact(kind.block_bytes())
                .zip(y.chunks_exact(Q8_0_BYTES))
            {
                let lanes = block_lanes(kind, xb, &yb[2..]);
                want += lanes.iter().map(|&l| i64::from(l)).sum::<i64>();
            }
            let got = vec_dot_portable(kind, &x, &y);
            assert_eq!(got, want as f32 * 0.125);
        }
    }

    #[test]
    fn short_rows_are_refused() {
        let y = Rng(3).blocks(2, Q8_0_BYTES);
        let rows = Q8Rows::from_q8_0(Q0::Q4_0, 64, &y).unwrap();
        let w = [0u8; Q4_0_BYTES];
        let mut out = [[0f32; 1]; 1];
        assert!(dot_tile(Q0::Q4_0, &[&w[..]], &[rows.row(0).unwrap()], &mut out).is_err());
        assert!(Q8Rows::from_q8_0(Q0::Q4_0, 33, &y).is_err());
    }
}
