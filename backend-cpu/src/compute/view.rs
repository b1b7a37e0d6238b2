//! Tensor layouts and safe, strided access to tensor bytes.
//!
//! * [`Layout`]: where a tensor lives and how its elements are laid out (`ne`, `nb`, type), as
//!   the plan resolved it from the graph record;
//! * [`SrcView`]: a read-only tensor over the byte slice `memory` handed out for it, with row and
//!   element accessors that convert to `f32`;
//! * [`Input`]: a source as a kernel sees it, either such a view or "the destination itself"
//!   (an in-place source, read back through the destination part);
//! * element conversions ([`Scalar`], [`decode`], [`encode`]) with ggml's rounding rules.
//!
//! Everything here is safe code: offsets computed from in-range indices stay inside the slice
//! because the plan and `memory` checked the layout's extent; a slip would be a slice-index
//! panic, never an out-of-bounds access.

use std::sync::OnceLock;

use proto_core::backend::BufferId;
use proto_core::ggml::types::id as ty;
use proto_core::{Error, Result};

use super::memory::DstPart;
use super::quant;

/// `GGML_TYPE_I64`.
pub(crate) const I64: u32 = 27;

/// Where a tensor's bytes are and how its elements map onto them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Buffer and byte offset of the first byte; `None` only for empty tensors.
    pub at: Option<(BufferId, usize)>,
    /// The tensor's byte extent (ggml's `nbytes`): the only bytes it may touch.
    pub size: usize,
    /// ggml type id.
    pub type_id: u32,
    /// Elements per block (1 for plain types).
    pub block: usize,
    /// Bytes per block (bytes per element for plain types).
    pub type_size: usize,
    /// Elements per dimension.
    pub ne: [usize; 4],
    /// Byte strides per dimension (dimension 0: per block).
    pub nb: [usize; 4],
}

impl Layout {
    /// Number of elements.
    pub(crate) fn elements(&self) -> usize {
        // An empty tensor passes the buffer check whatever its other sizes, so their product
        // may not fit: it has no elements, and a non-empty one fits in its buffer.
        if self.is_empty() {
            return 0;
        }
        self.ne
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .unwrap_or(usize::MAX)
    }

    /// Whether the tensor has no elements.
    pub(crate) fn is_empty(&self) -> bool {
        self.ne.contains(&0)
    }

    /// Number of rows (`ne1 * ne2 * ne3`).
    pub(crate) fn rows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// The `(i1, i2, i3)` of flat row `r` (row-major over dimensions 1..3, as ggml counts).
    pub(crate) fn row_index(&self, r: usize) -> [usize; 3] {
        let i1 = r % self.ne[1];
        let rest = r / self.ne[1];
        [i1, rest % self.ne[2], rest / self.ne[2]]
    }

    /// The flat row number of `(i1, i2, i3)`.
    pub(crate) fn row_number(&self, [i1, i2, i3]: [usize; 3]) -> usize {
        i1 + self.ne[1] * (i2 + self.ne[2] * i3)
    }

    /// Byte offset of the first element of row `(i1, i2, i3)`.
    pub(crate) fn row_offset(&self, [i1, i2, i3]: [usize; 3]) -> usize {
        i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3]
    }

    /// Bytes of one row when packed (`ne0 / block * type_size`).
    pub(crate) fn row_bytes(&self) -> usize {
        self.ne[0] / self.block * self.type_size
    }

    /// Whether the blocks of a row are adjacent (`nb0` is the block size), i.e. a row is one
    /// contiguous byte run.
    pub(crate) fn dense_rows(&self) -> bool {
        self.nb[0] == self.type_size
    }

    /// ggml's `ggml_is_contiguous`: the tensor is one packed run in row-major order (strides of
    /// dimensions with one element are ignored).
    pub(crate) fn is_contiguous(&self) -> bool {
        let mut next = self.type_size;
        for d in 0..4 {
            if self.ne[d] != 1 && self.nb[d] != next {
                return false;
            }
            let count = if d == 0 {
                self.ne[0] / self.block
            } else {
                self.ne[d]
            };
            // an empty tensor's other sizes are unchecked: a product past usize is no layout
            match next.checked_mul(count) {
                Some(product) => next = product,
                None => return d == 3,
            }
        }
        true
    }

    /// Same `ne` in every dimension.
    pub(crate) fn same_shape(&self, other: &Layout) -> bool {
        self.ne == other.ne
    }

    /// Same bytes, type, shape and strides: the two describe exactly the same elements.
    pub(crate) fn same_layout(&self, other: &Layout) -> bool {
        self.at == other.at
            && self.type_id == other.type_id
            && self.ne == other.ne
            && self.nb == other.nb
    }
}

// --- element types ---------------------------------------------------------------------------

/// The plain element types kernels convert to and from `f32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scalar {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// 32-bit integer (converted as a C cast does, saturating where C is undefined).
    I32,
}

impl Scalar {
    /// The floating-point types: F32, F16, BF16.
    pub(crate) fn float(type_id: u32) -> Option<Scalar> {
        match type_id {
            ty::F32 => Some(Scalar::F32),
            ty::F16 => Some(Scalar::F16),
            ty::BF16 => Some(Scalar::Bf16),
            _ => None,
        }
    }

    /// The floating-point types and I32.
    pub(crate) fn numeric(type_id: u32) -> Option<Scalar> {
        match type_id {
            ty::I32 => Some(Scalar::I32),
            other => Scalar::float(other),
        }
    }

    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            Scalar::F32 | Scalar::I32 => 4,
            Scalar::F16 | Scalar::Bf16 => 2,
        }
    }

    /// One element from its little-endian bytes (`bytes` holds at least [`Scalar::size`]).
    #[inline]
    pub(crate) fn get(self, bytes: &[u8]) -> f32 {
        match self {
            Scalar::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            Scalar::F16 => f16_to_f32(u16::from_le_bytes([bytes[0], bytes[1]])),
            Scalar::Bf16 => bf16_to_f32(u16::from_le_bytes([bytes[0], bytes[1]])),
            Scalar::I32 => i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as f32,
        }
    }
}

/// f16 bits to f32 through a 64 Ki-entry table (ggml-cpu keeps the same table): one load
/// instead of the bit manipulation, which matters in the F16 mat-mul and attention loops.
#[inline]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    static TABLE: OnceLock<Box<[f32]>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect()
    });
    table[usize::from(bits)]
}

/// f32 to f16 bits, rounding to nearest even (what F16C and ggml's software path do).
#[inline]
pub(crate) fn f32_to_f16(value: f32) -> u16 {
    half::f16::from_f32(value).to_bits()
}

/// bf16 bits to f32 (exact).
#[inline]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 to bf16 bits exactly as ggml's `ggml_compute_fp32_to_bf16`: NaNs become quiet NaNs,
/// everything else rounds to nearest even.
#[inline]
pub(crate) fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 64) as u16;
    }
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// `value` rounded to f16 precision and back.
#[inline]
pub(crate) fn round_f16(value: f32) -> f32 {
    f16_to_f32(f32_to_f16(value))
}

/// `value` rounded to bf16 precision and back.
#[inline]
pub(crate) fn round_bf16(value: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(value))
}

/// Converts packed elements of `scalar` to f32 (`out.len()` elements).
pub(crate) fn decode(scalar: Scalar, bytes: &[u8], out: &mut [f32]) {
    let size = scalar.size();
    let bytes = &bytes[..out.len() * size];
    match scalar {
        Scalar::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Scalar::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        Scalar::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        Scalar::I32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
            }
        }
    }
}

/// Converts f32 values to packed elements of `scalar` (`src.len()` elements).
pub(crate) fn encode(scalar: Scalar, src: &[f32], out: &mut [u8]) {
    let size = scalar.size();
    let out = &mut out[..src.len() * size];
    match scalar {
        Scalar::F32 => {
            for (c, v) in out.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        Scalar::F16 => {
            // the quant module's vectorized conversion (F16C where the CPU has it) rounds as
            // `f32_to_f16` does; element by element only if it refuses the lengths
            if quant::quantize_row(ty::F16, src, out).is_err() {
                for (c, v) in out.chunks_exact_mut(2).zip(src) {
                    c.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
                }
            }
        }
        Scalar::Bf16 => {
            for (c, v) in out.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
            }
        }
        Scalar::I32 => {
            for (c, v) in out.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&(*v as i32).to_le_bytes());
            }
        }
    }
}

/// Encodes a row of f32 values into `dst_type` (a [`Scalar`] type or a quantized type with a
/// quantizer), packed, into `out` (resized to the row's bytes).
pub(crate) fn encode_row(dst_type: u32, src: &[f32], out: &mut Vec<u8>) -> Result<()> {
    match Scalar::numeric(dst_type) {
        Some(scalar) => {
            out.resize(src.len() * scalar.size(), 0);
            encode(scalar, src, out);
            Ok(())
        }
        None => {
            let info = proto_core::ggml::type_info(dst_type)
                .ok_or(Error::InvalidType { type_id: dst_type })?;
            let bytes = src.len() / info.block_size as usize * info.type_size as usize;
            out.resize(bytes, 0);
            quant::quantize_row(dst_type, src, out)
        }
    }
}

// --- reading ---------------------------------------------------------------------------------

/// A source tensor: its layout over the bytes of its extent (offset 0 = the tensor's first
/// byte).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SrcView<'a> {
    /// The tensor's bytes (`layout.size` of them).
    pub bytes: &'a [u8],
    /// The tensor's layout.
    pub layout: Layout,
}

impl<'a> SrcView<'a> {
    /// The packed bytes of row `idx`; the layout must have [`Layout::dense_rows`].
    pub(crate) fn row(&self, idx: [usize; 3]) -> &'a [u8] {
        let start = self.layout.row_offset(idx);
        &self.bytes[start..start + self.layout.row_bytes()]
    }

    /// The bytes of element (block, for block types) `i`.
    pub(crate) fn element(&self, i: [usize; 4]) -> &'a [u8] {
        let l = &self.layout;
        let start = (i[0] / l.block) * l.nb[0] + l.row_offset([i[1], i[2], i[3]]);
        &self.bytes[start..start + l.type_size]
    }

    /// Element `i` of a plain numeric tensor as f32 (NaN for other types, which the plan never
    /// lets through to a kernel reading values).
    pub(crate) fn value(&self, i: [usize; 4]) -> f32 {
        Scalar::numeric(self.layout.type_id).map_or(f32::NAN, |s| s.get(self.element(i)))
    }

    /// Element `i` of an I32 or I64 index tensor.
    pub(crate) fn index_at(&self, i: [usize; 4]) -> i64 {
        let b = self.element(i);
        if self.layout.type_id == I64 {
            i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
        } else {
            i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
    }

    /// Row `idx` converted to f32 into `out` (`ne0` values): plain types through [`decode`]
    /// (strided rows element by element), quantized types through `quant::dequantize_row`.
    pub(crate) fn load_f32(&self, idx: [usize; 3], out: &mut [f32]) -> Result<()> {
        let l = &self.layout;
        let out = &mut out[..l.ne[0]];
        if out.is_empty() {
            return Ok(());
        }
        if let Some(scalar) = Scalar::numeric(l.type_id) {
            if l.dense_rows() {
                // F16/BF16 rows through the quant module's vectorized (F16C) conversions,
                // which are exact, as ours are
                if matches!(scalar, Scalar::F16 | Scalar::Bf16)
                    && quant::dequantize_row(l.type_id, self.row(idx), out).is_ok()
                {
                    return Ok(());
                }
                decode(scalar, self.row(idx), out);
            } else {
                let start = l.row_offset(idx);
                for (i0, o) in out.iter_mut().enumerate() {
                    let at = start + i0 * l.nb[0];
                    *o = scalar.get(&self.bytes[at..at + l.type_size]);
                }
            }
            Ok(())
        } else if l.dense_rows() {
            quant::dequantize_row(l.type_id, self.row(idx), out)
        } else {
            // one-element blocks (F8_E4M3) may be strided: element by element (the plan
            // refuses strided blocks of more than one element)
            let start = l.row_offset(idx);
            for (i0, o) in out.iter_mut().enumerate() {
                let at = start + i0 * l.nb[0];
                quant::dequantize_row(
                    l.type_id,
                    &self.bytes[at..at + l.type_size],
                    std::slice::from_mut(o),
                )?;
            }
            Ok(())
        }
    }
}

/// A source as a kernel reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Input<'a> {
    /// A tensor disjoint from the destination.
    View(SrcView<'a>),
    /// The destination itself (same bytes, type, shape and strides): an in-place op. Read
    /// through the destination part that owns the row, before the row is written.
    Dst(Layout),
}

impl Input<'_> {
    /// The source's layout.
    pub(crate) fn layout(&self) -> &Layout {
        match self {
            Input::View(view) => &view.layout,
            Input::Dst(layout) => layout,
        }
    }

    /// Row `idx` as f32 into `out`. For [`Input::Dst`], `idx` must be a row `part` owns;
    /// `scratch` holds the raw bytes in between.
    pub(crate) fn load_f32(
        &self,
        part: &DstPart<'_>,
        idx: [usize; 3],
        out: &mut [f32],
        scratch: &mut Vec<u8>,
    ) -> Result<()> {
        match self {
            Input::View(view) => view.load_f32(idx, out),
            Input::Dst(layout) => {
                let scalar = Scalar::numeric(layout.type_id)
                    .ok_or_else(|| internal("in-place source of a non-numeric type"))?;
                if scalar == Scalar::F32 && cfg!(target_endian = "little") {
                    // F32 little-endian is the values' own bytes: read straight into them
                    let out = &mut out[..layout.ne[0]];
                    return part.read(layout.row_number(idx), 0, bytemuck::cast_slice_mut(out));
                }
                scratch.resize(layout.row_bytes(), 0);
                part.read(layout.row_number(idx), 0, scratch)?;
                decode(scalar, scratch, &mut out[..layout.ne[0]]);
                Ok(())
            }
        }
    }
}

/// An internal inconsistency between the plan and a kernel (a bug, reported as an error).
pub(crate) fn internal(what: &'static str) -> Error {
    Error::Backend(format!("CPU compute engine: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_ggml() {
        // round to nearest even on the dropped 16 bits
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        // NaN stays NaN (quiet), infinities stay
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)) & 0x7fc0, 0x7fc0);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn f16_conversions_round_to_nearest_even() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0)
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        assert_eq!(f32_to_f16(65536.0), 0x7c00);
        for bits in [0u16, 1, 0x3555, 0x7bff, 0x8001, 0xfbff] {
            assert_eq!(f32_to_f16(f16_to_f32(bits)), bits);
        }
    }

    #[test]
    fn an_empty_tensor_has_no_elements_whatever_its_other_sizes() {
        let mut l = Layout {
            at: None,
            size: 0,
            type_id: ty::F32,
            block: 1,
            type_size: 4,
            ne: [1 << 40, 1 << 40, 0, 1],
            nb: [4, 4, 4, 4],
        };
        // the product of the other sizes overflows; an empty tensor still has 0 elements
        assert_eq!(l.elements(), 0);
        l.ne = [3, 5, 7, 2];
        assert_eq!(l.elements(), 210);
        l.ne = [1 << 40, 1 << 40, 1, 1];
        assert_eq!(l.elements(), usize::MAX, "saturates instead of wrapping");
    }

    #[test]
    fn contiguity_ignores_unit_dimensions() {
        let mut l = Layout {
            at: None,
            size: 64,
            type_id: ty::F32,
            block: 1,
            type_size: 4,
            ne: [4, 4, 1, 1],
            nb: [4, 16, 64, 64],
        };
        assert!(l.is_contiguous());
        l.nb[2] = 12345;
        assert!(l.is_contiguous());
        l.nb[1] = 20;
        assert!(!l.is_contiguous());
        assert_eq!(l.row_index(3), [3, 0, 0]);
    }
}
