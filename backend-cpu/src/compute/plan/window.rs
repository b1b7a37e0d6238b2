//! Checks of ACC and SET (writes through a window of the destination).

use super::*;

/// Where ACC and SET put src1: element `(i0, i1, i2, i3)` of src1 goes to flat element
/// `offset + i0 + i1 strides[0] + i2 strides[1] + i3 strides[2]` of the (contiguous)
/// destination. The plan proved every such element inside the destination, and no two the
/// same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// The first element (`op_params[3]` in bytes, divided by the element size).
    pub offset: usize,
    /// Element strides of dimensions 1..3 (`op_params[0..3]` in bytes, divided likewise).
    pub strides: [usize; 3],
}

impl Checker<'_> {
    /// ACC (`acc == true`) and SET (`ggml_acc_impl`, `ggml_set_impl`): src0 and the destination
    /// contiguous, same shape and type (F32; SET also I32); src1 of that type with packed rows,
    /// no more elements than src0; op_params `nb1, nb2, nb3, offset` (bytes) place src1 in the
    /// destination. They are client values: each must be a non-negative multiple of the
    /// element size, the whole window inside the destination, and its elements distinct (ggml
    /// checks less: where it writes past the tensor or races, this refuses). `op_params[4]`
    /// (ggml's "in place") needs no decoding: src0 is copied unless it is the destination.
    pub(super) fn acc_or_set(&self, dst: &Layout, acc: bool) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        let type_ok = if acc {
            a.type_id == ty::F32
        } else {
            a.type_id == ty::F32 || a.type_id == ty::I32
        };
        if !type_ok || b.type_id != a.type_id || dst.type_id != a.type_id {
            return Err(self.refuse(if acc {
                "ACC takes and gives F32"
            } else {
                "SET takes and gives F32 or I32"
            }));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if !a.is_contiguous() || !dst.is_contiguous() || !b.dense_rows() {
            return Err(self.bad("src0 and the destination must be contiguous, src1 packed"));
        }
        if b.elements() > a.elements() {
            return Err(self.bad("src1 has more elements than src0"));
        }
        let size = a.type_size;
        let bytes = [0, 1, 2, 3].map(|slot| self.param(slot));
        let in_elements = bytes.map(|v| {
            usize::try_from(v)
                .ok()
                .filter(|v| v.is_multiple_of(size))
                .map(|v| v / size)
        });
        let [Some(s1), Some(s2), Some(s3), Some(offset)] = in_elements else {
            return Err(self.bad(format!(
                "window strides and offset {bytes:?} must be non-negative multiples of {size}"
            )));
        };
        let window = Layout {
            ne: b.ne,
            nb: [size, s1 * size, s2 * size, s3 * size],
            ..*dst
        };
        if !b.is_empty() {
            let inside = extent(&window)
                .and_then(|end| end.checked_add(offset * size))
                .is_some_and(|end| end <= dst.size);
            if !inside {
                return Err(self.bad(format!(
                    "a window of {:?} at strides {bytes:?} reaches beyond the destination",
                    b.ne
                )));
            }
            if !injective(&window) {
                return Err(self.bad("the window's elements overlap each other"));
            }
        }
        let window = Window {
            offset,
            strides: [s1, s2, s3],
        };
        let kernel = if acc {
            Kernel::Acc(window)
        } else {
            Kernel::Set(window)
        };
        Ok(Planned {
            kernel,
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![true, false],
        })
    }
}
