//! Checks of SOFT_MAX and FLASH_ATTN_EXT.

use super::*;

/// `GGML_PREC_DEFAULT` and `GGML_PREC_F32`, the precisions FLASH_ATTN_EXT accepts.
const PREC_DEFAULT: i32 = 0;
const PREC_F32: i32 = 10;

impl Checker<'_> {
    pub(super) fn soft_max(&self, dst: &Layout) -> Result<Planned> {
        let a = self.need(0)?;
        let (mask, sinks) = (self.src(1)?, self.src(2)?);
        if !is_float(&a) || !is_float(dst) {
            return Err(self.refuse("SOFT_MAX takes F32, F16 or BF16 tensors"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if let Some(m) = &mask {
            let ok = is_float(m)
                && m.ne[0] == a.ne[0]
                && m.ne[1] >= a.ne[1]
                && m.ne[2] > 0
                && m.ne[3] > 0
                && a.ne[2] % m.ne[2] == 0
                && a.ne[3] % m.ne[3] == 0;
            if !ok {
                return Err(self.bad(format!("mask {:?} does not fit {:?}", m.ne, a.ne)));
            }
        }
        if let Some(s) = &sinks {
            if !is_float(s) || s.is_empty() || s.ne[0] < a.ne[2] {
                return Err(self.bad("sinks must be floats, one per head"));
            }
        }
        Ok(Planned {
            kernel: Kernel::SoftMax {
                scale: self.fparam(0),
                max_bias: self.fparam(1),
            },
            sources: vec![Some(a), mask, sinks],
            may_be_destination: vec![true, true, false],
        })
    }

    pub(super) fn flash_attn(&self, dst: &Layout) -> Result<Planned> {
        let (q, k, v) = (self.need(0)?, self.need(1)?, self.need(2)?);
        let (mask, sinks) = (self.src(3)?, self.src(4)?);
        if !is_float(&q) || dst.type_id != ty::F32 || !readable(k.type_id) || !readable(v.type_id) {
            return Err(self.refuse("FLASH_ATTN_EXT takes float Q, readable K/V, and gives F32"));
        }
        if Scalar::numeric(k.type_id) == Some(Scalar::I32)
            || Scalar::numeric(v.type_id) == Some(Scalar::I32)
        {
            return Err(self.refuse("FLASH_ATTN_EXT does not take integer K/V"));
        }
        let prec = self.param(3);
        if prec != PREC_DEFAULT && prec != PREC_F32 {
            return Err(self.refuse("unknown precision"));
        }
        let (dk, dv, n_kv, n_q, n_head) = (q.ne[0], v.ne[0], k.ne[1], q.ne[1], q.ne[2]);
        let kv_fits = |t: &Layout| {
            t.ne[2] > 0 && t.ne[3] > 0 && n_head % t.ne[2] == 0 && q.ne[3] % t.ne[3] == 0
        };
        let shapes = dk > 0
            && dv > 0
            && k.ne[0] == dk
            && v.ne[1] == n_kv
            && kv_fits(&k)
            && kv_fits(&v)
            && dst.ne == [dv, n_head, n_q, q.ne[3]];
        if !shapes {
            return Err(self.bad(format!(
                "q {:?}, k {:?}, v {:?} cannot give {:?}",
                q.ne, k.ne, v.ne, dst.ne
            )));
        }
        if let Some(m) = &mask {
            let ok = is_float(m)
                && m.ne[0] >= n_kv
                && m.ne[1] >= n_q
                && m.ne[2] > 0
                && m.ne[3] > 0
                && n_head % m.ne[2] == 0
                && q.ne[3] % m.ne[3] == 0;
            if !ok {
                return Err(self.bad(format!(
                    "mask {:?} does not fit q {:?}, k {:?}",
                    m.ne, q.ne, k.ne
                )));
            }
        }
        if let Some(s) = &sinks {
            if !is_float(s) || s.is_empty() || s.ne[0] < n_head {
                return Err(self.bad("sinks must be floats, one per head"));
            }
        }
        Ok(Planned {
            kernel: Kernel::FlashAttn {
                scale: self.fparam(0),
                max_bias: self.fparam(1),
                softcap: self.fparam(2),
            },
            sources: vec![Some(q), Some(k), Some(v), mask, sinks],
            may_be_destination: vec![false; 5],
        })
    }
}
