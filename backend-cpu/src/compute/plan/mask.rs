//! Checks of TOP_K_MASK (8.0.1, llama.cpp b12032+1): `ggml_top_k_mask`'s asserts in
//! `ggml/src/ggml.c` and `ggml_compute_forward_top_k_mask`'s in `ggml-cpu/ops.cpp`.

use super::*;

impl Checker<'_> {
    /// TOP_K_MASK: `mask [n_kv, m1, m2, m3]` F16 / F32 packed along `ne[0]`, `top_k [n_top,
    /// ne1, ne2, ne3]` I32 (dimensions 1–3 multiples of the mask's, which is broadcast),
    /// optional `score [n_pick, ne1, ne2, ne3]` F32, `blocks [n_blk, n_pick, 1, 1]` I32 and
    /// `extra [n_extra, ne1, ne2, ne3]` I32; the result is `[n_kv, ne1, ne2, ne3]` of the
    /// mask's type, packed along `ne[0]`. No `op_params`.
    pub(super) fn top_k_mask(&self, dst: &Layout) -> Result<Planned> {
        let (mask, top_k) = (self.need(0)?, self.need(1)?);
        let (score, blocks, extra) = (self.src(2)?, self.src(3)?, self.src(4)?);
        if mask.type_id != ty::F16 && mask.type_id != ty::F32 {
            return Err(self.refuse("TOP_K_MASK takes an F16 or F32 mask"));
        }
        if dst.type_id != mask.type_id {
            return Err(self.bad("TOP_K_MASK gives the mask's type"));
        }
        if top_k.type_id != ty::I32 {
            return Err(self.bad("TOP_K_MASK picks must be I32"));
        }
        if !mask.dense_rows() || !dst.dense_rows() {
            return Err(self.bad("TOP_K_MASK needs the mask and the result packed along ne[0]"));
        }
        let rows_of = |t: &Layout| [t.ne[1], t.ne[2], t.ne[3]];
        let picks = rows_of(&top_k);
        let broadcast = (1..4).all(|d| mask.ne[d] > 0 && top_k.ne[d].is_multiple_of(mask.ne[d]));
        if !broadcast || dst.ne != [mask.ne[0], picks[0], picks[1], picks[2]] {
            return Err(self.bad(format!(
                "mask {:?} with picks {:?} cannot give {:?}",
                mask.ne, top_k.ne, dst.ne
            )));
        }
        if let Some(score) = &score {
            if score.type_id != ty::F32 {
                return Err(self.bad("TOP_K_MASK scores must be F32"));
            }
            if rows_of(score) != picks {
                return Err(self.bad(format!(
                    "scores {:?} do not match picks {:?}",
                    score.ne, top_k.ne
                )));
            }
        }
        if let Some(blocks) = &blocks {
            if blocks.type_id != ty::I32 {
                return Err(self.bad("TOP_K_MASK blocks must be I32"));
            }
            if blocks.ne[2] != 1
                || blocks.ne[3] != 1
                || score.as_ref().is_some_and(|s| s.ne[0] != blocks.ne[1])
            {
                return Err(self.bad(format!(
                    "blocks {:?} are not [n_blk, n_pick, 1, 1] for the scores",
                    blocks.ne
                )));
            }
        }
        if let Some(extra) = &extra {
            if extra.type_id != ty::I32 {
                return Err(self.bad("TOP_K_MASK extra cells must be I32"));
            }
            if rows_of(extra) != picks {
                return Err(self.bad(format!(
                    "extra cells {:?} do not match picks {:?}",
                    extra.ne, top_k.ne
                )));
            }
        }
        Ok(Planned {
            kernel: Kernel::TopKMask,
            sources: vec![Some(mask), Some(top_k), score, blocks, extra],
            may_be_destination: vec![false; 5],
        })
    }
}
