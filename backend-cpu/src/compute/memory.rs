//! Raw access to the locked buffers' bytes: the only `unsafe` code of the compute engine.
//!
//! # Model
//! [`super::run`] write-locks every buffer the graph's computed nodes touch (ascending
//! [`BufferId`], the pool's locking order) and hands the exclusive byte slices to an [`Arena`]
//! for the whole graph. The arena turns each slice into a base pointer and length, and then
//! serves one node at a time ([`Arena::node`] borrows it mutably):
//!
//! * the node's **destination** becomes a [`Dst`]: a pointer, never a reference. Kernels split
//!   it into [`DstPart`]s — disjoint tiles of (row, column) indices, one per work item — and
//!   write whole element runs through [`DstPart::write`], which checks the indices against the
//!   tile and the layout;
//! * each **source** whose byte range is disjoint from the destination's becomes a plain
//!   `&[u8]` of exactly its extent ([`Src::Bytes`]); a source that *is* the destination (same
//!   bytes, type, shape and strides: ggml's in-place ops) becomes [`Src::Dst`] and is read back
//!   through the part that owns the row; any other overlap is refused.
//!
//! # Why this is sound
//! 1. The arena holds the exclusive borrows of the buffers for its lifetime `'g`, so nothing
//!    outside it reads or writes those bytes meanwhile; every pointer here derives from them.
//! 2. Every layout is checked here, not only in the plan: the byte range that its indices can
//!    reach (`extent`, overflow-checked) must fit in the tensor's size and the tensor inside its
//!    buffer. Index arithmetic on in-range indices therefore never leaves the buffer.
//! 3. During a node, the only bytes written are the destination's; source slices exist only for
//!    ranges disjoint from them, and they die with the [`NodeMemory`] borrow, before the next
//!    node (which may write them) starts.
//! 4. Threads write disjoint bytes: the parts of one split cover disjoint index tiles, and the
//!    destination layout is checked to be injective (no two elements share a byte) before it
//!    is split into more than one part. A part reads only its own tile.
//!
//! Nothing here panics on bad input: every check returns an [`Error`].

#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::Range;
use std::ptr;

use proto_core::backend::BufferId;
use proto_core::wire::MAX_SRC;
use proto_core::{Error, Result};

use super::view::Layout;

/// One locked buffer.
#[derive(Debug, Clone, Copy)]
struct Region {
    id: BufferId,
    base: *mut u8,
    len: usize,
}

/// The locked buffers of one graph (see the module documentation).
#[derive(Debug)]
pub(crate) struct Arena<'g> {
    regions: Vec<Region>,
    _exclusive: PhantomData<&'g mut [u8]>,
}

impl<'g> Arena<'g> {
    /// An arena over exclusively borrowed buffers.
    pub(crate) fn new(buffers: impl IntoIterator<Item = (BufferId, &'g mut [u8])>) -> Arena<'g> {
        let mut regions: Vec<Region> = buffers
            .into_iter()
            .map(|(id, bytes)| Region {
                id,
                base: bytes.as_mut_ptr(),
                len: bytes.len(),
            })
            .collect();
        regions.sort_by_key(|r| r.id);
        Arena {
            regions,
            _exclusive: PhantomData,
        }
    }

    /// The size of a locked buffer.
    pub(crate) fn buffer_len(&self, id: BufferId) -> Option<usize> {
        self.region(id).map(|r| r.len)
    }

    fn region(&self, id: BufferId) -> Option<Region> {
        self.regions
            .binary_search_by_key(&id, |r| r.id)
            .ok()
            .map(|i| self.regions[i])
    }

    /// The memory of one node: `dst` to write, `srcs` to read (slot by slot; `None` where the
    /// node reads nothing). Fails if a layout leaves its tensor or buffer, or if a source
    /// overlaps the destination without being exactly it.
    pub(crate) fn node<'a>(
        &'a mut self,
        dst: &Layout,
        srcs: &[Option<Layout>],
    ) -> Result<NodeMemory<'a>> {
        let dst_span = self.span(dst)?;
        if srcs.len() > MAX_SRC {
            return Err(invalid("more sources than a node has slots"));
        }
        // A fixed array, not a Vec: every node of every decode step comes through here.
        let mut inputs = [None; MAX_SRC];
        for (slot, src) in inputs.iter_mut().zip(srcs) {
            let Some(src) = src else {
                continue;
            };
            let input = match (self.span(src)?, &dst_span) {
                (None, _) => Src::Bytes(&[]),
                (Some(s), Some(d))
                    if s.region.id == d.region.id && overlaps(&s.range, &d.range) =>
                {
                    if src.same_layout(dst) {
                        Src::Dst
                    } else {
                        return Err(invalid("a source partially overlaps the destination"));
                    }
                }
                (Some(s), _) => {
                    // SAFETY: `span` checked that `s.range` lies inside the locked buffer
                    // `s.region` (point 2 of the module documentation). The bytes are not
                    // written while the slice lives: it is borrowed from `self` for `'a`, during
                    // which the only writes are to `dst`, which the branch above showed to be
                    // disjoint from it (point 3).
                    let bytes = unsafe {
                        std::slice::from_raw_parts(
                            s.region.base.add(s.range.start),
                            s.range.end - s.range.start,
                        )
                    };
                    Src::Bytes(bytes)
                }
            };
            *slot = Some(input);
        }
        let base = match &dst_span {
            // SAFETY: `span` checked that the range lies inside the buffer.
            Some(d) => unsafe { d.region.base.add(d.range.start) },
            None => ptr::null_mut(),
        };
        Ok(NodeMemory {
            dst: Dst {
                base,
                layout: *dst,
                injective: dst_span.is_some() && injective(dst),
                _exclusive: PhantomData,
            },
            srcs: inputs,
        })
    }

    /// The buffer range of a non-empty tensor, after checking that every byte its indices reach
    /// lies in it and that it lies in its buffer; `None` for an empty tensor.
    fn span(&self, layout: &Layout) -> Result<Option<Span>> {
        if layout.is_empty() {
            return Ok(None);
        }
        let (id, offset) = layout
            .at
            .ok_or_else(|| invalid("a non-empty tensor without storage"))?;
        let region = self
            .region(id)
            .ok_or_else(|| invalid("a tensor in a buffer that is not locked"))?;
        let reach = extent(layout).ok_or_else(|| invalid("a tensor layout overflows"))?;
        if reach > layout.size {
            return Err(invalid("a tensor's strides reach beyond its byte size"));
        }
        let end = offset
            .checked_add(layout.size)
            .filter(|&end| end <= region.len)
            .ok_or_else(|| invalid("a tensor lies outside its buffer"))?;
        Ok(Some(Span {
            region,
            range: offset..end,
        }))
    }
}

#[derive(Debug, Clone)]
struct Span {
    region: Region,
    range: Range<usize>,
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

fn invalid(what: &'static str) -> Error {
    Error::InvalidGraph(proto_core::graph::GraphError::BadStorage {
        backend: "CPU",
        reason: what,
    })
}

/// One past the last byte that an in-range index of `layout` can touch, relative to the
/// tensor's first byte: `Σ (n_d - 1) · nb_d + type_size`, with `n_0` counted in blocks. `None`
/// on overflow, on an empty or misaligned shape, or on a zero-sized type.
pub(crate) fn extent(layout: &Layout) -> Option<usize> {
    if layout.block == 0 || layout.type_size == 0 || !layout.ne[0].is_multiple_of(layout.block) {
        return None;
    }
    let mut last = 0usize;
    for d in 0..4 {
        let n = if d == 0 {
            layout.ne[0] / layout.block
        } else {
            layout.ne[d]
        };
        let steps = n.checked_sub(1)?;
        last = last.checked_add(steps.checked_mul(layout.nb[d])?)?;
    }
    last.checked_add(layout.type_size)
}

/// Whether no two elements (blocks) of `layout` share a byte: with the dimensions that have
/// more than one element ordered by stride, each stride must clear everything the smaller
/// dimensions span. (Sufficient, and true of every layout ggml builds for a destination.)
pub(crate) fn injective(layout: &Layout) -> bool {
    // (stride, size) of the dimensions with more than one element, on the stack: this runs
    // for every node.
    let mut dims = [(0usize, 0usize); 4];
    let mut used = 0;
    for d in 0..4 {
        let n = if d == 0 {
            layout.ne[0] / layout.block.max(1)
        } else {
            layout.ne[d]
        };
        if n > 1 {
            dims[used] = (layout.nb[d], n);
            used += 1;
        }
    }
    let dims = &mut dims[..used];
    dims.sort_unstable();
    let mut span = layout.type_size;
    for &mut (stride, n) in dims {
        if stride < span {
            return false;
        }
        match (n - 1)
            .checked_mul(stride)
            .and_then(|s| s.checked_add(span))
        {
            Some(next) => span = next,
            None => return false,
        }
    }
    true
}

/// What [`Arena::node`] hands out.
#[derive(Debug)]
pub(crate) struct NodeMemory<'a> {
    /// The destination.
    pub dst: Dst<'a>,
    /// The sources, slot by slot (`None` past the node's last).
    pub srcs: [Option<Src<'a>>; MAX_SRC],
}

/// A source's bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Src<'a> {
    /// The tensor's bytes (empty for an empty tensor), disjoint from the destination.
    Bytes(&'a [u8]),
    /// The source is the destination itself (in-place op): read it through [`DstPart::read`].
    Dst,
}

/// A node's destination, to be split into parts.
#[derive(Debug)]
pub(crate) struct Dst<'a> {
    /// The tensor's first byte (null for an empty tensor).
    base: *mut u8,
    layout: Layout,
    /// Whether parts may be written concurrently (see [`injective`]).
    injective: bool,
    _exclusive: PhantomData<&'a mut [u8]>,
}

impl Dst<'_> {
    /// The destination's layout.
    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Parts of `chunk` consecutive rows each, every column. One part covering everything if
    /// the layout is not injective; none if the destination is empty.
    pub(crate) fn split_rows(&mut self, chunk: usize) -> Parts<'_> {
        let cols = self.layout.ne[0];
        self.split_grid(chunk, cols)
    }

    /// Tiles of `row_chunk` rows by `col_chunk` columns (rounded up to whole blocks). One part
    /// covering everything if the layout is not injective; none if the destination is empty.
    pub(crate) fn split_grid(&mut self, row_chunk: usize, col_chunk: usize) -> Parts<'_> {
        if self.base.is_null() || self.layout.is_empty() {
            return Parts::none();
        }
        let rows = self.layout.rows();
        let cols = self.layout.ne[0];
        if !self.injective {
            return Parts::one(self.part(0..rows, 0..cols));
        }
        let block = self.layout.block;
        let row_chunk = row_chunk.clamp(1, rows);
        let col_chunk = col_chunk.clamp(1, cols).div_ceil(block) * block;
        if row_chunk == rows && col_chunk >= cols {
            // One thread's split of a small node: no list to allocate.
            return Parts::one(self.part(0..rows, 0..cols));
        }
        let mut parts = Vec::with_capacity(rows.div_ceil(row_chunk) * cols.div_ceil(col_chunk));
        for r in (0..rows).step_by(row_chunk) {
            for c in (0..cols).step_by(col_chunk) {
                parts.push(self.part(r..(r + row_chunk).min(rows), c..(c + col_chunk).min(cols)));
            }
        }
        Parts {
            one: None,
            many: parts.into_iter(),
        }
    }

    fn part(&self, rows: Range<usize>, cols: Range<usize>) -> DstPart<'_> {
        DstPart {
            base: self.base,
            layout: self.layout,
            rows,
            cols,
            _exclusive: PhantomData,
        }
    }
}

/// The parts of one split of a destination, in row-major tile order. A split into one part
/// (every node of a single-threaded decode step) holds it inline.
#[derive(Debug)]
pub(crate) struct Parts<'p> {
    one: Option<DstPart<'p>>,
    many: std::vec::IntoIter<DstPart<'p>>,
}

impl<'p> Parts<'p> {
    fn none() -> Parts<'p> {
        Parts {
            one: None,
            many: Vec::new().into_iter(),
        }
    }

    fn one(part: DstPart<'p>) -> Parts<'p> {
        Parts {
            one: Some(part),
            many: Vec::new().into_iter(),
        }
    }
}

impl<'p> Iterator for Parts<'p> {
    type Item = DstPart<'p>;

    fn next(&mut self) -> Option<DstPart<'p>> {
        self.one.take().or_else(|| self.many.next())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::from(self.one.is_some()) + self.many.len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for Parts<'_> {}

/// A tile of a destination: rows `rows` (flat over dimensions 1..3) by columns `cols`
/// (elements of dimension 0). Parts of one split never overlap, so each can go to its own
/// thread.
#[derive(Debug)]
pub(crate) struct DstPart<'p> {
    base: *mut u8,
    layout: Layout,
    rows: Range<usize>,
    cols: Range<usize>,
    _exclusive: PhantomData<&'p mut [u8]>,
}

// SAFETY: a part only touches the bytes of its own tile (`locate` enforces it), parts of one
// split have disjoint tiles, and several parts exist only for an injective layout, where
// disjoint tiles are disjoint bytes (module documentation, point 4). Moving a part to another
// thread therefore cannot create a data race.
unsafe impl Send for DstPart<'_> {}

impl DstPart<'_> {
    /// The rows of the tile.
    pub(crate) fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// The columns of the tile.
    pub(crate) fn cols(&self) -> Range<usize> {
        self.cols.clone()
    }

    /// The byte offset of element (`col`, `row`) and the number of blocks that `len` bytes
    /// starting there cover, after checking that they all lie in the tile.
    fn locate(&self, row: usize, col: usize, len: usize) -> Result<(usize, usize)> {
        self.locate_at(self.layout.row_index(row), row, col, len)
    }

    /// [`DstPart::locate`] for row `row` whose index is `idx` (the caller's: row `row` is
    /// `idx` only if the two agree, which `write_at` checks).
    #[inline]
    fn locate_at(
        &self,
        idx: [usize; 3],
        row: usize,
        col: usize,
        len: usize,
    ) -> Result<(usize, usize)> {
        let l = &self.layout;
        // Plain types (one element per block, 2 or 4 bytes) are nearly every write: those
        // sizes divide without a division instruction, which would cost more than the rest of
        // a short row's write.
        let (units, whole) = match l.type_size {
            4 => (len >> 2, len & 3 == 0),
            2 => (len >> 1, len & 1 == 0),
            size => (len / size, len.is_multiple_of(size)),
        };
        let (block_col, aligned) = match l.block {
            1 => (col, true),
            block => (col / block, col.is_multiple_of(block)),
        };
        let fits = self.rows.contains(&row)
            && aligned
            && whole
            && col >= self.cols.start
            && units
                .checked_mul(l.block)
                .and_then(|n| n.checked_add(col))
                .is_some_and(|end| end <= self.cols.end);
        if !fits {
            return Err(Error::Backend(format!(
                "CPU compute engine: access to row {row}, column {col}, {len} bytes outside the part {:?}x{:?}",
                self.rows, self.cols
            )));
        }
        let offset = l.row_offset(idx) + block_col * l.nb[0];
        Ok((offset, units))
    }

    /// [`DstPart::write`] into the row of index `idx` (`(i1, i2, i3)`), which the caller
    /// knows: no division to find it from the flat row number.
    pub(crate) fn write_at(&mut self, idx: [usize; 3], col: usize, bytes: &[u8]) -> Result<()> {
        let l = &self.layout;
        // each index inside its dimension, so that the flat row number names this row and
        // the tile check below covers it
        if idx[0] >= l.ne[1] || idx[1] >= l.ne[2] || idx[2] >= l.ne[3] {
            return Err(Error::Backend(format!(
                "CPU compute engine: row index {idx:?} outside the destination"
            )));
        }
        let row = l.row_number(idx);
        let (offset, units) = self.locate_at(idx, row, col, bytes.len())?;
        // SAFETY: `locate_at` checked the run for these bytes.
        unsafe { self.store(offset, units, bytes) };
        Ok(())
    }

    /// Writes whole rows into plane `(i2, i3)`: `bytes` holds `ids.len()` packed rows, the
    /// `n`th going to row `(ids[n], i2, i3)` (a later one over an earlier one with the same
    /// id). The tile is checked once for the plane, each id against the rows: a scatter of
    /// many short rows (SET_ROWS) without a full check per row.
    pub(crate) fn write_plane_rows(
        &mut self,
        [i2, i3]: [usize; 2],
        ids: &[usize],
        bytes: &[u8],
    ) -> Result<()> {
        let l = self.layout;
        let row_bytes = l.row_bytes();
        let first = l.row_number([0, i2, i3]);
        let whole = i2 < l.ne[2]
            && i3 < l.ne[3]
            && self.rows.start <= first
            && first + l.ne[1] <= self.rows.end
            && self.cols == (0..l.ne[0])
            && bytes.len() == ids.len() * row_bytes;
        if !whole {
            return Err(Error::Backend(format!(
                "CPU compute engine: rows of plane ({i2}, {i3}) outside the part {:?}x{:?}",
                self.rows, self.cols
            )));
        }
        let units = l.ne[0] / l.block;
        for (&id, row) in ids.iter().zip(bytes.chunks_exact(row_bytes.max(1))) {
            if id >= l.ne[1] {
                return Err(Error::Backend(format!(
                    "CPU compute engine: row {id} outside the destination's {} rows",
                    l.ne[1]
                )));
            }
            // SAFETY: row `(id, i2, i3)` lies in this part's tile (all of the plane's rows and
            // columns do, checked above), and `row` is one packed row of `units` blocks: the
            // run that `locate` would return for it.
            unsafe { self.store(l.row_offset([id, i2, i3]), units, row) };
        }
        Ok(())
    }

    /// Writes packed elements (whole blocks) into row `row` starting at column `col`.
    pub(crate) fn write(&mut self, row: usize, col: usize, bytes: &[u8]) -> Result<()> {
        let (offset, units) = self.locate(row, col, bytes.len())?;
        // SAFETY: `locate` checked the run for these bytes.
        unsafe { self.store(offset, units, bytes) };
        Ok(())
    }

    /// Copies `units` blocks of `bytes` to `offset` at the layout's block stride.
    ///
    /// # Safety
    /// `(offset, units)` must be what [`DstPart::locate`] (or `locate_at`) returned for
    /// `bytes.len()`: the run then lies in this part's tile.
    #[inline]
    unsafe fn store(&mut self, offset: usize, units: usize, bytes: &[u8]) {
        let (size, stride) = (self.layout.type_size, self.layout.nb[0]);
        if stride == size {
            let (src, dst) = (bytes.as_ptr(), self.base.wrapping_add(offset));
            // SAFETY: the caller passes a run that `locate` checked to lie in this part's tile,
            // so its bytes lie in the destination's checked extent (point 2) and no other part
            // touches them (point 4); `bytes` is caller memory, not the destination. (One
            // element of 2 or 4 bytes, as SET_ROWS writes into a transposed V cache, is
            // copied inline rather than through a call of `memcpy`.)
            unsafe {
                match bytes.len() {
                    2 => ptr::copy_nonoverlapping(src, dst, 2),
                    4 => ptr::copy_nonoverlapping(src, dst, 4),
                    len => ptr::copy_nonoverlapping(src, dst, len),
                }
            };
        } else {
            for (u, unit) in bytes.chunks_exact(size).enumerate().take(units) {
                // SAFETY: as above, element by element at the layout's stride.
                unsafe {
                    ptr::copy_nonoverlapping(
                        unit.as_ptr(),
                        self.base.add(offset + u * stride),
                        size,
                    )
                };
            }
        }
    }

    /// Reads packed elements of row `row` starting at column `col` into `out` (the current
    /// destination bytes: an in-place op's source).
    pub(crate) fn read(&self, row: usize, col: usize, out: &mut [u8]) -> Result<()> {
        let (offset, units) = self.locate(row, col, out.len())?;
        let (size, stride) = (self.layout.type_size, self.layout.nb[0]);
        if stride == size {
            // SAFETY: as in `write`: the run is in this part's tile, which no other part writes.
            unsafe { ptr::copy_nonoverlapping(self.base.add(offset), out.as_mut_ptr(), out.len()) };
        } else {
            for (u, unit) in out.chunks_exact_mut(size).enumerate().take(units) {
                // SAFETY: as above, element by element.
                unsafe {
                    ptr::copy_nonoverlapping(
                        self.base.add(offset + u * stride),
                        unit.as_mut_ptr(),
                        size,
                    )
                };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto_core::ggml::types::id as ty;

    fn f32_layout(offset: usize, ne: [usize; 4], nb: [usize; 4]) -> Layout {
        let mut l = Layout {
            at: Some((BufferId(1), offset)),
            size: 0,
            type_id: ty::F32,
            block: 1,
            type_size: 4,
            ne,
            nb,
        };
        l.size = extent(&l).unwrap();
        l
    }

    fn contiguous(offset: usize, ne: [usize; 4]) -> Layout {
        f32_layout(
            offset,
            ne,
            [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]],
        )
    }

    #[test]
    fn extent_and_injectivity() {
        let l = contiguous(0, [4, 3, 2, 1]);
        assert_eq!(extent(&l), Some(96));
        assert!(injective(&l));
        // transposed view of a 4x3 matrix: still injective
        let t = f32_layout(0, [3, 4, 1, 1], [16, 4, 48, 48]);
        assert!(injective(&t));
        // rows aliasing each other
        let alias = f32_layout(0, [4, 3, 1, 1], [4, 8, 48, 48]);
        assert!(!injective(&alias));
        let zero = f32_layout(0, [4, 3, 1, 1], [4, 0, 48, 48]);
        assert!(!injective(&zero));
        // broadcast-like single row with stride 0 in a unit dimension is fine
        let unit = f32_layout(0, [4, 1, 1, 1], [4, 0, 0, 0]);
        assert!(injective(&unit));
        let mut huge = unit;
        huge.ne = [2, 2, 1, 1];
        huge.nb = [usize::MAX / 2 + 1, usize::MAX / 2 + 1, 4, 4];
        assert_eq!(extent(&huge), None);
    }

    #[test]
    fn sources_overlapping_the_destination_are_classified() {
        let mut bytes = vec![0u8; 256];
        let mut arena = Arena::new([(BufferId(1), bytes.as_mut_slice())]);
        let dst = contiguous(0, [4, 4, 1, 1]);
        let same = dst;
        let disjoint = contiguous(64, [4, 4, 1, 1]);
        let partial = contiguous(32, [4, 4, 1, 1]);
        let node = arena
            .node(&dst, &[Some(same), Some(disjoint), None])
            .unwrap();
        assert!(matches!(node.srcs[0], Some(Src::Dst)));
        assert!(matches!(node.srcs[1], Some(Src::Bytes(b)) if b.len() == 64));
        assert!(node.srcs[2].is_none());
        assert!(arena.node(&dst, &[Some(partial)]).is_err());
        // outside the buffer, or strides beyond the declared size
        assert!(arena.node(&contiguous(200, [4, 4, 1, 1]), &[]).is_err());
        let mut lying = contiguous(0, [4, 4, 1, 1]);
        lying.size = 32;
        assert!(arena.node(&lying, &[]).is_err());
        let mut unknown = dst;
        unknown.at = Some((BufferId(9), 0));
        assert!(arena.node(&unknown, &[]).is_err());
    }

    #[test]
    fn parts_write_only_their_tile() {
        let mut bytes = vec![0u8; 64];
        let mut arena = Arena::new([(BufferId(1), bytes.as_mut_slice())]);
        let dst = contiguous(0, [4, 4, 1, 1]);
        let mut node = arena.node(&dst, &[]).unwrap();
        let mut parts: Vec<_> = node.dst.split_grid(2, 2).collect();
        assert_eq!(parts.len(), 4);
        let p = &mut parts[3];
        assert_eq!((p.rows(), p.cols()), (2..4, 2..4));
        p.write(3, 2, &[1u8; 8]).unwrap();
        assert!(p.write(1, 2, &[1u8; 8]).is_err());
        assert!(p.write(3, 0, &[1u8; 8]).is_err());
        assert!(p.write(3, 2, &[1u8; 12]).is_err());
        assert!(p.write(3, 2, &[1u8; 3]).is_err());
        let mut back = [0u8; 8];
        p.read(3, 2, &mut back).unwrap();
        assert_eq!(back, [1u8; 8]);
        drop(parts);
        drop(arena);
        assert_eq!(&bytes[56..64], &[1u8; 8]);
        assert_eq!(bytes.iter().filter(|&&b| b != 0).count(), 8);
    }

    #[test]
    fn non_injective_destinations_get_one_part() {
        let mut bytes = vec![0u8; 64];
        let mut arena = Arena::new([(BufferId(1), bytes.as_mut_slice())]);
        let dst = f32_layout(0, [4, 3, 1, 1], [4, 8, 48, 48]);
        let mut node = arena.node(&dst, &[]).unwrap();
        let parts: Vec<_> = node.dst.split_rows(1).collect();
        assert_eq!(parts.len(), 1);
        assert_eq!((parts[0].rows(), parts[0].cols()), (0..3, 0..4));
    }
}
