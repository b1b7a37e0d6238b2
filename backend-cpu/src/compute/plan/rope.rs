//! Checks of ROPE and ROPE_BACK.

use super::*;

/// ROPE's parameters (`op_params` 1..=14).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RopeParams {
    /// Rotated dimensions (even, at most `ne0`).
    pub n_dims: usize,
    /// ggml rope mode: 0 normal, 2 neox, 8 mrope, 24 vision, 40 imrope.
    pub mode: i32,
    /// Original context length (YaRN).
    pub n_ctx_orig: i32,
    /// Base frequency.
    pub freq_base: f32,
    /// Frequency scale.
    pub freq_scale: f32,
    /// YaRN extrapolation mix.
    pub ext_factor: f32,
    /// Magnitude scale.
    pub attn_factor: f32,
    /// YaRN low correction dimension parameter.
    pub beta_fast: f32,
    /// YaRN high correction dimension parameter.
    pub beta_slow: f32,
    /// M-RoPE sections.
    pub sections: [i32; 4],
    /// First rotated dimension (`op_params[15]`, `ggml_rope_set_offset`): the rotated window
    /// is `n_offs..n_offs + n_dims`, everything else is copied.
    pub n_offs: usize,
}

/// ggml rope modes.
pub(crate) mod rope_mode {
    /// `GGML_ROPE_TYPE_NORMAL`.
    pub const NORMAL: i32 = 0;
    /// `GGML_ROPE_TYPE_NEOX`.
    pub const NEOX: i32 = 2;
    /// `GGML_ROPE_TYPE_MROPE`.
    pub const MROPE: i32 = 8;
    /// `GGML_ROPE_TYPE_VISION`.
    pub const VISION: i32 = 24;
    /// `GGML_ROPE_TYPE_IMROPE`.
    pub const IMROPE: i32 = 40;
}

impl Checker<'_> {
    /// ROPE and ROPE_BACK (same sources and parameters; `backward` rotates the other way).
    pub(super) fn rope(&self, dst: &Layout, backward: bool) -> Result<Planned> {
        let (a, pos) = (self.need(0)?, self.need(1)?);
        let factors = self.src(2)?;
        if !is_float(&a) || a.type_id != dst.type_id {
            return Err(self.refuse("ROPE takes and gives one float type"));
        }
        self.same_shape(&a, dst, "src0 and the destination")?;
        if pos.type_id != ty::I32 {
            return Err(self.bad("positions must be I32"));
        }
        let mut sections = [0i32; 4];
        sections.copy_from_slice(&self.node.record.op_params[11..15]);
        let params = RopeParams {
            n_dims: usize::try_from(self.param(1)).map_err(|_| self.bad("negative n_dims"))?,
            mode: self.param(2),
            n_ctx_orig: self.param(4),
            freq_base: self.fparam(5),
            freq_scale: self.fparam(6),
            ext_factor: self.fparam(7),
            attn_factor: self.fparam(8),
            beta_fast: self.fparam(9),
            beta_slow: self.fparam(10),
            sections,
            n_offs: usize::try_from(self.param(15))
                .map_err(|_| self.bad("negative rotated-window offset (op_params[15])"))?,
        };
        use rope_mode::*;
        let mrope = match params.mode {
            NORMAL | NEOX => false,
            MROPE | VISION | IMROPE => true,
            _ => return Err(self.refuse("unknown rope mode")),
        };
        let ne0 = a.ne[0];
        if !params.n_dims.is_multiple_of(2) || params.n_dims > ne0 {
            return Err(self.bad(format!("n_dims = {} with ne[0] = {ne0}", params.n_dims)));
        }
        if params.mode == VISION && params.n_dims * 2 != ne0 {
            return Err(self.bad("vision rope rotates half of ne[0]"));
        }
        // The rotated window `n_offs..n_offs + n_dims` must lie inside the row, start on a
        // pair, and vision mode (which rotates the whole row) takes none.
        let n_offs = params.n_offs;
        if !n_offs.is_multiple_of(2)
            || n_offs
                .checked_add(params.n_dims)
                .is_none_or(|end| end > ne0)
            || (params.mode == VISION && n_offs != 0)
        {
            return Err(self.bad(format!(
                "rotated window offset {n_offs} with n_dims = {} and ne[0] = {ne0}",
                params.n_dims
            )));
        }
        if mrope {
            let total: i64 = sections.iter().map(|&s| i64::from(s)).sum();
            if sections.iter().any(|&s| s < 0) || total <= 0 || total as usize > ne0 {
                return Err(self.bad(format!("invalid m-rope sections {sections:?}")));
            }
        }
        let per_token = if mrope { 4 } else { 1 };
        // ggml_is_vector(b): one row of positions (an empty one has none to read)
        if pos.ne[1..] != [1, 1, 1] || pos.ne[0] < per_token * a.ne[2] {
            return Err(self.bad(format!("{} positions for {} tokens", pos.ne[0], a.ne[2])));
        }
        if let Some(f) = &factors {
            if !is_float(f) || f.is_empty() || f.ne[0] < params.n_dims / 2 {
                return Err(self.bad("frequency factors must be floats, n_dims/2 of them"));
            }
        }
        let kernel = if backward {
            Kernel::RopeBack(params)
        } else {
            Kernel::Rope(params)
        };
        Ok(Planned {
            kernel,
            sources: vec![Some(a), Some(pos), factors],
            may_be_destination: vec![true, false, false],
        })
    }
}
