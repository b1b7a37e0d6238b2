//! MUL_MAT and MUL_MAT_ID.
//!
//! `dst[i0, i1, i2, i3] = Σ_k w[k, i0, i2 / r2, i3 / r3] · x[k, i1, i2, i3]` with
//! `r2 = ne12 / ne02`, `r3 = ne13 / ne03` (ggml's broadcasting of the weights over dims 2, 3).
//!
//! As ggml-cpu does (`ggml_compute_forward_mul_mat`), the activations are first converted to
//! the weights' `vec_dot_type` once per node (`quant::quantize_row`: F32 stays F32, F16 / BF16
//! round to F16 / BF16, quantized weights take Q8_0, Q8_1 or Q8_K), and every output element is
//! one `quant::vec_dot` of a weight row with a converted activation row over the whole `k` —
//! the products ggml forms, summed in f32. Float weights whose rows are strided (a transposed
//! view) cannot be read as packed rows; they are widened to f32 per tile and take the f32
//! [`dot`] with the activations rounded to the weights' precision instead.
//!
//! Work is split into tiles of destination rows (activation rows) by destination columns
//! (weight rows, about 128 KiB of them per tile, so they stay in cache while the activation
//! rows pass). The tiling never splits a dot product, so the result does not depend on the
//! thread count.
//!
//! Q4_0 and Q8_0 weights take the register-blocked tile kernels instead (`quant::dot_rows`,
//! like llamafile's tinyBLAS in ggml-cpu): the activations are quantized to Q8_0 as above and
//! laid out for the kernels (`quant::Q8Rows`), and each call computes three activation rows
//! (four where the AVX-512 kernel has the registers for them: `quant::dot_rows_wide`)
//! against all the weight rows of a tile (about 256 KiB of them), four weight rows at a
//! time. Every output element is still one dot product over the whole `k` with one fixed
//! summation order (`quant::tiles`), whatever the grouping, so results do not depend on the
//! tile shapes or the thread count either; `quant::vec_dot` gives the same bits. F16 weights
//! (the attention products) take two weight rows per call of `quant::dot_f16_x2`, again
//! with the bits of `quant::vec_dot`; with AVX2 (or AVX-512 F) both F16 and F32 weights take
//! register-blocked kernels instead (`quant::dot_float_rows`: four weight rows by three
//! activation rows per call, like tinyBLAS's F32 tiles, on the wide tiles of the Q4_0 / Q8_0
//! kernels; with a single activation row, as in generation, one weight row after the other,
//! over a few long column ranges rather than cache-sized tiles), and Q4_K
//! weights take `quant::dot_q4_k_rows` (each weight block's scales and quants decoded once
//! for eight activation rows, sixteen with AVX-512 VNNI, in the wider tiles of the Q4_0 /
//! Q8_0 kernels), all again with the bits of `quant::vec_dot`. On CPUs where that is faster
//! (`quant::widen_f16_tiles`: AMD's), a tile of F16 weights that six activation rows or more
//! pass over is widened to f32 once and goes through the F32 kernel (the same bits: only the
//! loads differ), rather than every group of three converting it again.
//!
//! MUL_MAT_ID (`ggml_compute_forward_mul_mat_id`): `dst[:, e, t] = w[:, :, ids[e, t]] ·
//! x[:, e % ne11, t]`; every expert id is checked before anything is written. Parts are column
//! ranges over all rows, grouped by expert inside a part so each expert's weights are widened
//! once per part.

use proto_core::ggml::type_info;
use proto_core::ggml::types::id as ty;
use proto_core::{Error, Result};

use crate::compute::memory::{Dst, DstPart};
use crate::compute::quant;
use crate::compute::scratch as spare;
use crate::compute::view::Layout;
use crate::compute::view::{encode, internal, round_bf16, round_f16, Scalar, SrcView};

use super::{dot, reduce_lanes, widen_all, widen_all_then, Node, LANES};

/// Bytes of widened weights a tile aims for (fits in L2 next to the activations).
const TILE_WEIGHT_BYTES: usize = 128 << 10;

/// Bytes of weights a tile of the Q4_0 / Q8_0 tile kernels aims for.
const TILE_KERNEL_BYTES: usize = 256 << 10;

/// Activation rows per tile.
const TILE_ROWS: usize = 64;

/// Activation rows per call of the Q4_0 / Q8_0 tile kernels: with their four weight rows,
/// twelve accumulators, which with the operands fill the sixteen AVX2 vector registers.
const KERNEL_ROWS: usize = 3;

/// Activation rows per call of the Q4_K row kernel: each weight block's scales and quants
/// are decoded once per call, so more rows share that work (the activation rows go one after
/// the other, so they cost no registers). With AVX-512 VNNI 16 instead
/// (`quant::dot_q4_k_rows_wide`: one activation row per i32 lane).
const Q4K_ROWS: usize = 8;

/// Activation rows that must share a weight matrix before [`grouped_part`] widens a tile of
/// F16 weights to f32 once for them (see [`GroupKernel::widened`]): two groups of the float
/// kernel, below which converting the tile costs about what it saves.
const WIDEN_MIN_ROWS: usize = 2 * KERNEL_ROWS;

/// The activations, converted once per node.
enum Prepared {
    /// f32 values (rounded through F16/BF16 for such weights), `k` per row: for weights that
    /// are widened to f32 per tile.
    Float(spare::Scratch<f32>),
    /// Rows in the weights' `vec_dot_type`, `stride` bytes each: for `quant::vec_dot` on the
    /// weights' own bytes (quantized weights, and float weights with few activation rows).
    Bytes {
        stride: usize,
        bytes: spare::Scratch<u8>,
    },
    /// Q8_0 rows laid out for the tile kernels of Q4_0 / Q8_0 weights (MUL_MAT).
    Tiles(quant::Q8Rows),
    /// For F16 / F32 weights with a register-blocked kernel (`quant::dot_float_rows`,
    /// MUL_MAT): the rows converted as for `Bytes` (rounded to F16 for
    /// F16 weights), then widened back to f32 (exactly), `k` per row.
    F16(spare::Scratch<f32>),
    /// For F32 weights with a register-blocked kernel: the F32 activation rows where they
    /// are, when each is a run of aligned f32s (the conversion would be a copy).
    InPlace,
}

impl Prepared {
    /// Converts every row of `x` (in the order of `x.layout.row_index`), for `widen`ed float
    /// weights of type `weight_type` or for `quant::vec_dot` with them; for the tile kernels
    /// if `tiles` names their weight format, or for `quant::dot_float_rows`
    /// if `f16_tiles` (F16 / F32 weights).
    fn new(
        node: &Node<'_>,
        weight_type: u32,
        widen: bool,
        (tiles, f16_tiles): (Option<quant::Q0>, bool),
        x: &SrcView<'_>,
    ) -> Result<Prepared> {
        let k = x.layout.ne[0];
        let rows = x.layout.rows();
        let chunk = node.pool.chunk(rows, k * 4);
        if widen {
            let mut values = widen_all(node, x)?;
            match Scalar::float(weight_type) {
                Some(Scalar::F16) => values.iter_mut().for_each(|v| *v = round_f16(*v)),
                Some(Scalar::Bf16) => values.iter_mut().for_each(|v| *v = round_bf16(*v)),
                _ => {}
            }
            return Ok(Prepared::Float(values));
        }
        let vdt = quant::vec_dot_type(weight_type)
            .ok_or_else(|| internal("weights without a vec_dot_type"))?;
        let info = type_info(vdt).ok_or(Error::InvalidType { type_id: vdt })?;
        let stride = k / info.block_size as usize * info.type_size as usize;
        if f16_tiles && vdt == ty::F32 && in_place_f32_rows(x) {
            return Ok(Prepared::InPlace);
        }
        if f16_tiles {
            // each row rounded to `vdt` (F16, or F32: as it is) right after its conversion
            let round: fn(&mut [f32]) = match vdt {
                ty::F16 => quant::round_to_f16,
                ty::F32 => |_| {},
                _ => return Err(internal("float row kernel with a quantized vec_dot_type")),
            };
            return widen_all_then(node, x, round).map(Prepared::F16);
        }
        let mut bytes = spare::zeroed::<u8>(rows * stride);
        let items: Vec<(usize, &mut [u8])> = bytes
            .chunks_mut((chunk * stride).max(1))
            .enumerate()
            .map(|(i, c)| (i * chunk, c))
            .collect();
        // F32 rows are quantized in place, without a copy, where they are aligned f32s (and
        // the bytes are the values: little-endian)
        let direct = in_place_f32_rows(x);
        node.pool.run(items, &|(first, out): (usize, &mut [u8])| {
            let mut row = vec![0.0f32; k];
            for (n, dst) in out.chunks_mut(stride.max(1)).enumerate() {
                let idx = x.layout.row_index(first + n);
                let values = match direct {
                    true => bytemuck::try_cast_slice::<u8, f32>(x.row(idx)).ok(),
                    false => None,
                };
                let values = match values {
                    Some(values) => values,
                    None => {
                        x.load_f32(idx, &mut row)?;
                        &row
                    }
                };
                quant::quantize_row(vdt, values, dst)?;
            }
            Ok(())
        })?;
        if let Some(kind) = tiles {
            return Ok(Prepared::Tiles(quant::Q8Rows::from_q8_0(kind, k, &bytes)?));
        }
        Ok(Prepared::Bytes { stride, bytes })
    }
}

/// Whether every row of `x` is a run of aligned little-endian f32s in its buffer, so the
/// float row kernels and the activation quantizer can read the rows where they are.
fn in_place_f32_rows(x: &SrcView<'_>) -> bool {
    let l = &x.layout;
    let align = std::mem::align_of::<f32>();
    cfg!(target_endian = "little")
        && l.type_id == ty::F32
        && l.dense_rows()
        && (x.bytes.as_ptr() as usize).is_multiple_of(align)
        && l.nb[1..].iter().all(|nb| nb.is_multiple_of(align))
}

/// The weights as a kernel reads them.
struct Weights<'a> {
    view: SrcView<'a>,
    /// Whether weight rows are widened to f32 per tile (float weights with enough activation
    /// rows), rather than read by `quant::vec_dot` in place.
    widen: bool,
    k: usize,
}

impl<'a> Weights<'a> {
    /// How the weights of `view` are read. `quant::vec_dot` works on the weights' own packed
    /// bytes (in code compiled for AVX2 where the CPU has it, and so faster than widening to
    /// f32 here, measured); only float weights with strided rows are widened.
    fn new(view: SrcView<'a>) -> Weights<'a> {
        let float = Scalar::float(view.layout.type_id).is_some();
        Weights {
            view,
            widen: float && !view.layout.dense_rows(),
            k: view.layout.ne[0],
        }
    }

    /// Weight rows `first..first + count` of matrix `(i2, i3)` as the tile kernels take them
    /// (one slice, one stride: no slice per row to build).
    fn tile_rows(
        &self,
        first: usize,
        count: usize,
        (i2, i3): (usize, usize),
    ) -> Result<quant::StridedRows<'a>> {
        let l = &self.view.layout;
        let start = l.row_offset([first, i2, i3]);
        let bytes = self
            .view
            .bytes
            .get(start..)
            .ok_or_else(|| internal("MUL_MAT weight rows out of range"))?;
        quant::StridedRows::new(bytes, l.nb[1], l.row_bytes(), count)
    }

    /// Widens weight rows `cols` of matrix `(i2, i3)` into `tile`, `k` values per row.
    fn widen(
        &self,
        cols: std::ops::Range<usize>,
        i2: usize,
        i3: usize,
        tile: &mut [f32],
    ) -> Result<()> {
        for (c, out) in cols.zip(tile.chunks_mut(self.k)) {
            self.view.load_f32([c, i2, i3], out)?;
        }
        Ok(())
    }

    /// Dot products of weight rows `cols` of matrix `(i2, i3)` with activation row `row` into
    /// `out`; `tile` holds the widened float weights of those rows.
    fn dots(
        &self,
        prepared: &Prepared,
        row: usize,
        cols: std::ops::Range<usize>,
        (i2, i3): (usize, usize),
        tile: &[f32],
        out: &mut [f32],
    ) -> Result<()> {
        let k = self.k;
        match prepared {
            Prepared::Float(values) => {
                let y = &values[row * k..(row + 1) * k];
                let mut quads = out.chunks_exact_mut(4);
                let mut rows = tile.chunks_exact(4 * k);
                for (o, w) in (&mut quads).zip(&mut rows) {
                    o.copy_from_slice(&dot4(w, y));
                }
                for (o, w) in quads
                    .into_remainder()
                    .iter_mut()
                    .zip(rows.remainder().chunks(k))
                {
                    *o = dot(w, y);
                }
            }
            Prepared::Bytes { stride, bytes } => {
                let y = &bytes[row * stride..(row + 1) * stride];
                let type_id = self.view.layout.type_id;
                // the checks of `quant::vec_dot` once for the row (every weight row has the
                // same length), then its kernel per output element
                let Some(first) = cols.clone().next() else {
                    return Ok(());
                };
                quant::vec_dot(type_id, k, self.view.row([first, i2, i3]), y)?;
                // the checked `quant::vec_dot` per element for types without a bare kernel
                let kernel = quant::row_dot_kernel(type_id);
                let dot = |x: &[u8]| match kernel {
                    Some(kernel) => Ok(kernel(x, y)),
                    None => quant::vec_dot(type_id, k, x, y),
                };
                let end = cols.end;
                let mut outs = out.iter_mut().zip(cols);
                if type_id == ty::F16 {
                    // two weight rows at a time (they share the work on `y`)
                    while let (Some((o0, c0)), Some((o1, c1))) = (outs.next(), outs.next()) {
                        let rows = [self.view.row([c0, i2, i3]), self.view.row([c1, i2, i3])];
                        [*o0, *o1] = quant::dot_f16_x2(&rows, y)?;
                    }
                    // (an odd last row was taken by the first `next` and left unwritten)
                    if out.len() % 2 == 1 {
                        let c = end - 1;
                        if let Some(o) = out.last_mut() {
                            *o = dot(self.view.row([c, i2, i3]))?;
                        }
                    }
                } else {
                    for (o, c) in outs {
                        *o = dot(self.view.row([c, i2, i3]))?;
                    }
                }
            }
            Prepared::Tiles(_) | Prepared::F16(_) | Prepared::InPlace => {
                return Err(internal("MUL_MAT tile rows outside the tile loops"))
            }
        }
        Ok(())
    }
}

/// Four dot products of consecutive `k`-rows of `w` with `y`, sharing the loads of `y` (the
/// compiler vectorizes the inner loop). Each result is summed exactly as [`dot`] sums, so
/// the grouping does not change any value.
fn dot4(w: &[f32], y: &[f32]) -> [f32; 4] {
    let k = y.len();
    let (w0, rest) = w.split_at(k);
    let (w1, rest) = rest.split_at(k);
    let (w2, w3) = rest.split_at(k);
    let w3 = &w3[..k];
    let mut acc = [[0.0f32; LANES]; 4];
    let chunks = y
        .chunks_exact(LANES)
        .zip(w0.chunks_exact(LANES))
        .zip(w1.chunks_exact(LANES))
        .zip(w2.chunks_exact(LANES))
        .zip(w3.chunks_exact(LANES));
    for ((((yc, c0), c1), c2), c3) in chunks {
        for i in 0..LANES {
            acc[0][i] += c0[i] * yc[i];
            acc[1][i] += c1[i] * yc[i];
            acc[2][i] += c2[i] * yc[i];
            acc[3][i] += c3[i] * yc[i];
        }
    }
    let full = k / LANES * LANES;
    let mut out = [0.0f32; 4];
    for ((o, a), r) in out.iter_mut().zip(&acc).zip([w0, w1, w2, w3]) {
        let tail: f32 = r[full..].iter().zip(&y[full..]).map(|(x, y)| x * y).sum();
        *o = reduce_lanes(*a) + tail;
    }
    out
}

/// Per-thread buffers of the tile loops.
#[derive(Default)]
struct Scratch {
    /// Widened float weights, `k` per weight row of the tile.
    tile: Vec<f32>,
    /// One output row segment.
    out: Vec<f32>,
    /// The same, encoded.
    bytes: Vec<u8>,
    /// Tile and row kernels ([`grouped_part`]): a group's results, per weight row one value
    /// per activation row of the group.
    group: Vec<f32>,
}

impl Scratch {
    /// Sizes the buffers for tiles `width` weight rows wide (`k` widened values each).
    fn size(&mut self, width: usize, k: usize) {
        self.tile.resize(width * k, 0.0);
        self.out.resize(width, 0.0);
        self.bytes.resize(width * 4, 0);
    }

    /// The calling thread's buffers, kept from one MUL_MAT node to the next: a decode step's
    /// output projection alone wants a result buffer of the whole vocabulary per group row,
    /// which allocating and zeroing per node cost about 1 % of a generated token.
    fn kept() -> KeptScratch {
        KeptScratch(KEPT_SCRATCH.take())
    }

    fn capacity_bytes(&self) -> usize {
        4 * (self.tile.capacity() + self.out.capacity() + self.group.capacity())
            + self.bytes.capacity()
    }
}

/// [`Scratch::kept`]'s buffers, given back to the thread on drop.
struct KeptScratch(Scratch);

impl std::ops::Deref for KeptScratch {
    type Target = Scratch;
    fn deref(&self) -> &Scratch {
        &self.0
    }
}

impl std::ops::DerefMut for KeptScratch {
    fn deref_mut(&mut self) -> &mut Scratch {
        &mut self.0
    }
}

impl Drop for KeptScratch {
    fn drop(&mut self) {
        let scratch = std::mem::take(&mut self.0);
        // a huge node's buffers are freed rather than held for the thread's lifetime
        if scratch.capacity_bytes() <= KEPT_SCRATCH_BYTES {
            KEPT_SCRATCH.set(scratch);
        }
    }
}

/// The most [`KeptScratch`] keeps per thread.
const KEPT_SCRATCH_BYTES: usize = 64 << 20;

thread_local! {
    static KEPT_SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// Weight rows per tile: about [`TILE_WEIGHT_BYTES`] of weights (widened to f32, or as
/// stored), so a tile stays in L2 while its activation rows pass over it.
fn col_chunk(weights: &Weights<'_>) -> usize {
    let row = if weights.widen {
        4 * weights.k
    } else {
        weights.view.layout.row_bytes()
    };
    (TILE_WEIGHT_BYTES / row.max(1)).clamp(4, 64)
}

/// Weight rows per tile for the Q4_0 / Q8_0 tile kernels: about [`TILE_KERNEL_BYTES`] of
/// weights (they stay in L2 while the activation rows pass; wider tiles mean fewer, longer
/// writes of the results), but with several threads at least four tiles per thread across
/// the `n` columns.
fn tile_col_chunk(weights: &Weights<'_>, n: usize, threads: usize) -> usize {
    let by_cache = (TILE_KERNEL_BYTES / weights.view.layout.row_bytes().max(1)).clamp(4, 256);
    if threads > 1 {
        by_cache.min(n.div_ceil(4 * threads).max(16))
    } else {
        by_cache
    }
}

/// Writes zeros everywhere (a product over an empty `k`).
fn zeros(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let layout = *dst.layout();
    let zero = vec![0u8; layout.row_bytes()];
    let parts = dst.split_rows(layout.rows());
    node.pool.run(parts, &|mut part: DstPart<'_>| {
        for r in part.rows() {
            part.write(r, 0, &zero)?;
        }
        Ok(())
    })
}

pub(super) fn mul_mat(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (w, x) = (node.view(0)?, node.view(1)?);
    let layout = *dst.layout();
    if layout.type_id != ty::F32 {
        return Err(internal("MUL_MAT into a non-F32 destination"));
    }
    let k = w.layout.ne[0];
    if k == 0 {
        return zeros(node, dst);
    }
    let weights = Weights::new(w);
    let tiles = quant::Q0::of(w.layout.type_id).filter(|_| !weights.widen);
    // F16, F32 and Q4_K weights: the register-blocked row kernels where the CPU has them
    let row_kernel = RowKernel::of(w.layout.type_id, k).filter(|_| !weights.widen);
    let f16_tiles = matches!(row_kernel, Some(RowKernel::Float(_)));
    let prepared = Prepared::new(
        node,
        w.layout.type_id,
        weights.widen,
        (tiles, f16_tiles),
        &x,
    )?;
    let (r2, r3) = (
        x.layout.ne[2] / w.layout.ne[2],
        x.layout.ne[3] / w.layout.ne[3],
    );
    let cols = if tiles.is_some() {
        tile_col_chunk(&weights, layout.ne[0], node.pool.threads())
    } else if matches!(row_kernel, Some(RowKernel::Q4K)) {
        // the Q4_K row kernels rearrange the activation rows once per call, so wider tiles
        // share that over more weight rows (but never narrower than the default tiles)
        tile_col_chunk(&weights, layout.ne[0], node.pool.threads()).max(col_chunk(&weights))
    } else if layout.rows() == 1 && matches!(row_kernel, Some(RowKernel::Float(_))) {
        // one activation row (generation): the float row kernel streams the weights in one
        // pass, so a few long parts per thread rather than many cache-sized tiles
        col_chunk(&weights).max(layout.ne[0].div_ceil(4 * node.pool.threads()))
    } else if matches!(row_kernel, Some(RowKernel::Float(_))) {
        // the float tile kernels: wide tiles as for Q4_0 / Q8_0 (fewer, longer result writes;
        // `quant::tiles` measures them no slower than L1-sized tiles)
        tile_col_chunk(&weights, layout.ne[0], node.pool.threads())
    } else {
        col_chunk(&weights)
    };
    let parts = dst.split_grid(TILE_ROWS, cols);
    node.pool
        .run_with(parts, Scratch::kept, |kept, mut part: DstPart<'_>| {
            let scratch: &mut Scratch = kept;
            let cols = part.cols();
            let s = (r2, r3);
            if let Prepared::Tiles(rows) = &prepared {
                // the tile-kernel activation row of destination row `r`
                let activation = |r: usize| {
                    let row = x.layout.row_number(layout.row_index(r));
                    rows.row(row)
                        .ok_or_else(|| internal("MUL_MAT activation row out of range"))
                };
                let (kind, part) = (rows.kind(), &mut part);
                return match quant::dot_rows_wide() {
                    true => grouped_part::<_, 4>(
                        &weights,
                        &kind,
                        &activation,
                        s,
                        &layout,
                        scratch,
                        part,
                    ),
                    false => grouped_part::<_, KERNEL_ROWS>(
                        &weights,
                        &kind,
                        &activation,
                        s,
                        &layout,
                        scratch,
                        part,
                    ),
                };
            }
            if let Some(kernel) = row_kernel {
                // the prepared activation row of destination row `r`
                let activation = |r: usize| -> Result<&[u8]> {
                    let row = x.layout.row_number(layout.row_index(r));
                    let found = match &prepared {
                        Prepared::F16(values) => values
                            .get(row * k..(row + 1) * k)
                            .map(bytemuck::cast_slice::<f32, u8>),
                        Prepared::InPlace => Some(x.row(layout.row_index(r))),
                        Prepared::Bytes { stride, bytes } => {
                            bytes.get(row * stride..(row + 1) * stride)
                        }
                        _ => None,
                    };
                    found.ok_or_else(|| internal("MUL_MAT activation row out of range"))
                };
                let part = &mut part;
                return match kernel {
                    RowKernel::Q4K if quant::dot_q4_k_rows_wide() => grouped_part::<_, 16>(
                        &weights,
                        &kernel,
                        &activation,
                        s,
                        &layout,
                        scratch,
                        part,
                    ),
                    RowKernel::Q4K => grouped_part::<_, Q4K_ROWS>(
                        &weights,
                        &kernel,
                        &activation,
                        s,
                        &layout,
                        scratch,
                        part,
                    ),
                    RowKernel::Float(_) => grouped_part::<_, KERNEL_ROWS>(
                        &weights,
                        &kernel,
                        &activation,
                        s,
                        &layout,
                        scratch,
                        part,
                    ),
                };
            }
            scratch.size(cols.len(), if weights.widen { k } else { 0 });
            let mut widened: Option<(usize, usize)> = None;
            for r in part.rows() {
                let [i1, i2, i3] = layout.row_index(r);
                let matrix = (i2 / r2, i3 / r3);
                if weights.widen && widened != Some(matrix) {
                    weights.widen(cols.clone(), matrix.0, matrix.1, &mut scratch.tile)?;
                    widened = Some(matrix);
                }
                let row = x.layout.row_number([i1, i2, i3]);
                weights.dots(
                    &prepared,
                    row,
                    cols.clone(),
                    matrix,
                    &scratch.tile,
                    &mut scratch.out,
                )?;
                encode(Scalar::F32, &scratch.out, &mut scratch.bytes);
                part.write(r, cols.start, &scratch.bytes)?;
            }
            Ok(())
        })
}

/// The weight formats with a register-blocked row kernel in [`grouped_part`] (besides the
/// Q4_0 / Q8_0 tile kernels).
#[derive(Clone, Copy, PartialEq)]
enum RowKernel {
    /// `quant::dot_float_rows` on F16 or F32 weights ([`Prepared::F16`] activations).
    Float(quant::FloatRows),
    /// `quant::dot_q4_k_rows` (Q8_K rows of [`Prepared::Bytes`]).
    Q4K,
}

impl RowKernel {
    /// The kernel for weights of `type_id` read in place with rows of `k` values, if any.
    fn of(type_id: u32, k: usize) -> Option<RowKernel> {
        match type_id {
            ty::F16 if quant::dot_float_rows_fast(k) => {
                Some(RowKernel::Float(quant::FloatRows::F16))
            }
            ty::F32 if quant::dot_float_rows_fast(k) => {
                Some(RowKernel::Float(quant::FloatRows::F32))
            }
            ty::Q4_K => Some(RowKernel::Q4K),
            _ => None,
        }
    }
}

/// A kernel of [`grouped_part`]: `out[n][j]` = weight row `n` of `w` times activation row
/// `y[j]`, for `RN` activation rows of type `Y` at a time.
trait GroupKernel<Y>: Sized {
    fn run<const RN: usize>(
        &self,
        w: quant::StridedRows<'_>,
        y: &[Y; RN],
        out: &mut [[f32; RN]],
    ) -> Result<()>;

    /// The kernel to run on a tile of these weights widened to f32 (`k` values a row), where
    /// [`grouped_part`] widens a tile once for its activation rows rather than have every
    /// group convert it again: F16 weights, whose kernel widens each weight vector in the
    /// loop (the F32 kernel on the exact widenings gives the same bits: only the loads
    /// differ). None for the rest.
    fn widened(&self) -> Option<Self> {
        None
    }
}

/// The Q4_0 / Q8_0 tile kernels on the rows of `quant::Q8Rows`.
impl GroupKernel<quant::Q8Row<'_>> for quant::Q0 {
    fn run<const RN: usize>(
        &self,
        w: quant::StridedRows<'_>,
        y: &[quant::Q8Row<'_>; RN],
        out: &mut [[f32; RN]],
    ) -> Result<()> {
        quant::dot_rows(*self, w, y, out)
    }
}

/// The row kernels on activation rows as bytes: those of f32 values for the float kernels,
/// Q8_K rows for Q4_K.
impl<'y> GroupKernel<&'y [u8]> for RowKernel {
    fn run<const RN: usize>(
        &self,
        w: quant::StridedRows<'_>,
        y: &[&'y [u8]; RN],
        out: &mut [[f32; RN]],
    ) -> Result<()> {
        let floats = |r: &'y [u8]| -> Result<&'y [f32]> {
            bytemuck::try_cast_slice(r).map_err(|_| internal("MUL_MAT activations misaligned"))
        };
        match *self {
            RowKernel::Float(kind) => {
                let mut v: [&[f32]; RN] = [&[]; RN];
                for (v, r) in v.iter_mut().zip(y) {
                    *v = floats(r)?;
                }
                quant::dot_float_rows(kind, w, &v, out)
            }
            RowKernel::Q4K => quant::dot_q4_k_rows(w, y, out),
        }
    }

    fn widened(&self) -> Option<RowKernel> {
        match self {
            RowKernel::Float(quant::FloatRows::F16) if quant::widen_f16_tiles() => {
                Some(RowKernel::Float(quant::FloatRows::F32))
            }
            _ => None,
        }
    }
}

/// A MUL_MAT tile with a [`GroupKernel`] (the Q4_0 / Q8_0 tile kernels, three activation
/// rows at a time or four where `quant::dot_rows_wide`: 6% less CPU time in pp64 with the
/// AVX-512 kernel; or a [`RowKernel`]): destination rows in groups of `N` that share their
/// weight matrix (the rest one by one), each group against all the tile's weight rows in
/// one call of the kernel; `activation(r)` is the prepared activation row of destination
/// row `r`.
fn grouped_part<'w, Y: Copy, const N: usize>(
    weights: &Weights<'w>,
    kernel: &impl GroupKernel<Y>,
    activation: &dyn Fn(usize) -> Result<Y>,
    (r2, r3): (usize, usize),
    layout: &Layout,
    scratch: &mut Scratch,
    part: &mut DstPart<'_>,
) -> Result<()> {
    let cols = part.cols();
    let width = cols.len();
    // grown only (every value used is written first), so a buffer kept from a wider node
    // is not zeroed again
    for buf in [&mut scratch.out, &mut scratch.group] {
        if buf.len() < N * width {
            buf.resize(N * width, 0.0);
        }
    }
    let mut w: Option<((usize, usize), quant::StridedRows<'w>)> = None;
    // the kernel on widened weights, and the matrix whose tile `tile` holds widened (a
    // buffer kept by the thread from node to node: no allocation and zero fill per node)
    let wide_kernel = kernel.widened();
    let mut widened: Option<(usize, usize)> = None;
    let mut tile = match wide_kernel {
        Some(_) => WIDENED_TILE.take(),
        None => Vec::new(),
    };
    let k = weights.k;
    let dst_rows = part.rows();
    let mut r = dst_rows.start;
    while r < dst_rows.end {
        let [_, i2, i3] = layout.row_index(r);
        let matrix = (i2 / r2, i3 / r3);
        let rows = match w {
            Some((m, rows)) if m == matrix => rows,
            _ => {
                let rows = weights.tile_rows(cols.start, width, matrix)?;
                w = Some((matrix, rows));
                rows
            }
        };
        let shares = |count: usize| {
            (0..count).all(|n| {
                r + n < dst_rows.end && {
                    let [_, j2, j3] = layout.row_index(r + n);
                    (j2 / r2, j3 / r3) == matrix
                }
            })
        };
        let same = shares(N);
        // widened once where at least two groups of activation rows pass over the tile
        if wide_kernel.is_some() && widened != Some(matrix) && shares(WIDEN_MIN_ROWS) {
            tile.resize(width * k, 0.0);
            for (i, out) in tile[..width * k].chunks_exact_mut(k).enumerate() {
                quant::dequantize_row(ty::F16, rows.row(i), out)?;
            }
            widened = Some(matrix);
        }
        let wide = match &wide_kernel {
            Some(wide) if widened == Some(matrix) => {
                let bytes = bytemuck::cast_slice::<f32, u8>(&tile[..width * k]);
                Some((wide, quant::StridedRows::new(bytes, 4 * k, 4 * k, width)?))
            }
            _ => None,
        };
        let n = if same {
            let mut y = [activation(r)?; N];
            for (j, y) in y.iter_mut().enumerate().skip(1) {
                *y = activation(r + j)?;
            }
            let (outn, _) = scratch.group[..N * width].as_chunks_mut::<N>();
            match wide {
                Some((wide, tile)) => wide.run(tile, &y, outn)?,
                None => kernel.run(rows, &y, outn)?,
            }
            quant::columns_to_rows(outn, &mut scratch.out);
            N
        } else {
            let (out1, _) = scratch.group[..width].as_chunks_mut::<1>();
            match wide {
                Some((wide, tile)) => wide.run(tile, &[activation(r)?], out1)?,
                None => kernel.run(rows, &[activation(r)?], out1)?,
            }
            quant::columns_to_rows(out1, &mut scratch.out);
            1
        };
        for j in 0..n {
            let row = &scratch.out[j * width..(j + 1) * width];
            if cfg!(target_endian = "little") {
                // F32 little-endian is the values' own bytes
                part.write(r + j, cols.start, bytemuck::cast_slice(row))?;
            } else {
                scratch.bytes.resize(width * 4, 0);
                encode(Scalar::F32, row, &mut scratch.bytes);
                part.write(r + j, cols.start, &scratch.bytes)?;
            }
        }
        r += n;
    }
    if wide_kernel.is_some() {
        WIDENED_TILE.set(tile);
    }
    Ok(())
}

thread_local! {
    /// [`grouped_part`]'s widened F16 tile, kept by each thread that runs MUL_MAT parts from
    /// one node to the next (f32 tiles of at most about twice [`TILE_KERNEL_BYTES`] for rows
    /// of up to 64 Ki values).
    static WIDENED_TILE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

pub(super) fn mul_mat_id(node: &Node<'_>, mut dst: Dst<'_>) -> Result<()> {
    let (w, x, ids) = (node.view(0)?, node.view(1)?, node.view(2)?);
    let layout = *dst.layout();
    if layout.type_id != ty::F32 {
        return Err(internal("MUL_MAT_ID into a non-F32 destination"));
    }
    let n_experts = w.layout.ne[2];
    // dst rows are (slot, token); each names an expert, all checked before any write
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); n_experts];
    for r in 0..layout.rows() {
        let [slot, token, _] = layout.row_index(r);
        let id = ids.index_at([slot, token, 0, 0]);
        let expert =
            usize::try_from(id)
                .ok()
                .filter(|&e| e < n_experts)
                .ok_or(Error::OutOfBounds(
                    "MUL_MAT_ID expert id outside the experts",
                ))?;
        by_expert[expert].push(r);
    }
    let k = w.layout.ne[0];
    if k == 0 {
        return zeros(node, dst);
    }
    let weights = Weights::new(w);
    let prepared = Prepared::new(node, w.layout.type_id, weights.widen, (None, false), &x)?;
    let ne11 = x.layout.ne[1];
    let cols = col_chunk(&weights);
    let parts = dst.split_grid(layout.rows(), cols);
    node.pool
        .run_with(parts, Scratch::kept, |kept, mut part: DstPart<'_>| {
            let scratch: &mut Scratch = kept;
            let cols = part.cols();
            let rows = part.rows();
            scratch.size(cols.len(), if weights.widen { k } else { 0 });
            for (expert, users) in by_expert.iter().enumerate() {
                let mut widened = false;
                for &r in users.iter().filter(|r| rows.contains(r)) {
                    if weights.widen && !widened {
                        weights.widen(cols.clone(), expert, 0, &mut scratch.tile)?;
                        widened = true;
                    }
                    let [slot, token, _] = layout.row_index(r);
                    let row = x.layout.row_number([slot % ne11, token, 0]);
                    weights.dots(
                        &prepared,
                        row,
                        cols.clone(),
                        (expert, 0),
                        &scratch.tile,
                        &mut scratch.out,
                    )?;
                    encode(Scalar::F32, &scratch.out, &mut scratch.bytes);
                    part.write(r, cols.start, &scratch.bytes)?;
                }
            }
            Ok(())
        })
}
