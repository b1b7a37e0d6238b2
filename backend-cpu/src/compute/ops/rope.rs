//! ROPE, as `ggml_compute_forward_rope_flt` (forward direction) computes it.
//!
//! For token `i2` at position `p = pos[i2]` the kernel builds a cache of `(cos, sin)` pairs
//! (`ggml_rope_cache_init`): `theta_0 = p`, `theta_{k+1} = theta_k * base^(-2/n_dims)`, each
//! divided by its frequency factor (src2) when present and passed through YaRN
//! (`rope_yarn`: interpolation `freq_scale * theta`, mixed with extrapolation over the
//! correction range by `ext_factor`, magnitude `attn_factor`, times `1 + 0.1 ln(1/freq_scale)`
//! when `ext_factor != 0`). Then every head's row rotates pairs:
//! * normal mode: `(x[i], x[i+1])`;
//! * neox and the multi-section modes: `(x[i], x[i + n_dims/2])`;
//! * vision: `(x[i], x[i + n_dims])` over the whole row;
//!
//! and the other dimensions are copied. The rotated window starts at `n_offs` (`op_params[15]`,
//! `ggml_rope_set_offset`; 0 by default) in every mode but vision. Multi-section modes take four positions per
//! token (`pos[i2 + k ne2]`) and pick one per rotated pair by section
//! (`ggml_mrope_cache_init`).
//!
//! ROPE_BACK (`ggml_compute_forward_rope_back`) is the same kernel rotating by the opposite
//! angles: ggml multiplies each cached `sin` by -1; here the cached pairs are shared with ROPE
//! and the rotation negates `sin` when it reads it (the same values: negation is exact).
//!
//! ggml builds each token's cache again in every ROPE node. Here the caches of all the
//! node's tokens form one table, kept for the rest of the graph computation ([`RopeTables`])
//! under everything it was computed from (the parameters and the position and frequency
//! factor values): a model's Q and K rotations of every layer share one table, so its
//! `sin`/`cos` pairs are computed once per graph instead of twice per layer. A node whose
//! table would pass [`TABLE_MAX_FLOATS`] (a token count that no memory backs, say) builds one
//! token's cache at a time instead, as ggml does.

use std::f32::consts::PI;

use proto_core::Result;

use crate::compute::memory::Dst;
use crate::compute::plan::{rope_mode, RopeParams};
use crate::compute::quant;
use crate::compute::view::{internal, SrcView};

use super::{c_max, c_min, map_rows, Node};

/// Most floats in one table (16 MiB: 32,768 tokens of 128 rotated dimensions).
const TABLE_MAX_FLOATS: usize = 1 << 22;

/// Tables kept per graph: models alternate at most a few ROPE settings (sliding-window and
/// global layers, for one), and a graph whose keys all differ recomputes as ggml does.
const KEPT_TABLES: usize = 4;

/// The `(cos, sin)` tables that the ROPE nodes of one graph computation built, by key.
#[derive(Debug, Default)]
pub(crate) struct RopeTables {
    tables: Vec<(TableKey, Vec<f32>)>,
}

/// Everything a table's values follow from: the parameters (bit for bit), the cache width,
/// and the values of the positions and frequency factors the cache reads, as they are when
/// the node runs (an earlier node of the graph may have written them).
#[derive(Debug, PartialEq, Eq)]
struct TableKey {
    params: [u64; 14],
    width: usize,
    positions: Vec<i64>,
    factors: Option<Vec<u32>>,
}

impl TableKey {
    fn new(rope: &Rope<'_>) -> TableKey {
        // Every field, exactly (the pattern names them all, so a new one cannot be missed):
        // f32s by their bits (NaN equal to itself, -0 apart from 0).
        let RopeParams {
            n_dims,
            mode,
            n_ctx_orig,
            freq_base,
            freq_scale,
            ext_factor,
            attn_factor,
            beta_fast,
            beta_slow,
            sections,
            n_offs,
        } = rope.p;
        let params = [
            n_dims as u64,
            mode as u32 as u64,
            n_ctx_orig as u32 as u64,
            freq_base.to_bits().into(),
            freq_scale.to_bits().into(),
            ext_factor.to_bits().into(),
            attn_factor.to_bits().into(),
            beta_fast.to_bits().into(),
            beta_slow.to_bits().into(),
            sections[0] as u32 as u64,
            sections[1] as u32 as u64,
            sections[2] as u32 as u64,
            sections[3] as u32 as u64,
            n_offs as u64,
        ];
        let used_positions = if rope.multi_section() {
            4 * rope.ne2
        } else {
            rope.ne2
        };
        let factors = rope.factors.as_ref().map(|f| {
            (0..f.layout.ne[0].min(rope.width / 2))
                .map(|i| f.value([i, 0, 0, 0]).to_bits())
                .collect()
        });
        TableKey {
            params,
            width: rope.width,
            positions: (0..used_positions)
                .map(|i| rope.positions.index_at([i, 0, 0, 0]))
                .collect(),
            factors,
        }
    }
}

/// `ggml_rope_yarn_corr_dims`: the dimension range over which YaRN blends.
fn corr_dims(p: &RopeParams) -> [f32; 2] {
    let n_dims = p.n_dims as f32;
    let dim = |n_rot: f32| {
        n_dims * (p.n_ctx_orig as f32 / (n_rot * 2.0 * PI)).ln() / (2.0 * p.freq_base.ln())
    };
    let start = dim(p.beta_fast).floor();
    let end = dim(p.beta_slow).ceil();
    [c_max(0.0, start), c_min(n_dims - 1.0, end)]
}

fn yarn_ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / c_max(0.001, high - low);
    1.0 - c_min(1.0, c_max(0.0, y))
}

/// `rope_yarn`: `(cos, sin)` of one pair.
fn rope_yarn(theta_extrap: f32, p: &RopeParams, corr: [f32; 2], i0: usize) -> (f32, f32) {
    let theta_interp = p.freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = p.attn_factor;
    if p.ext_factor != 0.0 {
        let ramp_mix = yarn_ramp(corr[0], corr[1], i0) * p.ext_factor;
        theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}

struct Rope<'a> {
    p: RopeParams,
    corr: [f32; 2],
    theta_scale: f32,
    positions: SrcView<'a>,
    factors: Option<SrcView<'a>>,
    ne2: usize,
    /// Pairs the cache needs: `n_dims` dimensions, or the whole row in vision mode.
    width: usize,
    /// ROPE_BACK: rotate by `-theta` (the inverse rotation).
    backward: bool,
}

impl Rope<'_> {
    /// Whether the mode takes four positions per token.
    fn multi_section(&self) -> bool {
        matches!(
            self.p.mode,
            rope_mode::MROPE | rope_mode::VISION | rope_mode::IMROPE
        )
    }

    /// Floats per token in the table: the cache's pairs, and two more (zero) as the
    /// per-token cache always had.
    fn stride(&self) -> usize {
        self.width + 2
    }

    /// The table of this node's tokens, from `tables` or computed (on the threads) and kept
    /// there.
    fn table<'t>(&self, node: &Node<'_>, tables: &'t mut RopeTables) -> Result<&'t [f32]> {
        let key = TableKey::new(self);
        let found = tables.tables.iter().position(|(k, _)| *k == key);
        let index = match found {
            Some(index) => index,
            None => {
                let stride = self.stride();
                // At most TABLE_MAX_FLOATS: the caller checks before asking for a table.
                let mut values = vec![0.0f32; self.ne2 * stride];
                let chunk = node
                    .pool
                    .chunk(self.ne2, self.width.saturating_mul(16))
                    .max(1);
                let items: Vec<(usize, &mut [f32])> = values
                    .chunks_mut(chunk * stride)
                    .enumerate()
                    .map(|(n, tokens)| (n * chunk, tokens))
                    .collect();
                node.pool.run(items, &|(first, tokens)| {
                    for (k, cache) in tokens.chunks_exact_mut(stride).enumerate() {
                        self.fill(first + k, cache);
                    }
                    Ok(())
                })?;
                if tables.tables.len() == KEPT_TABLES {
                    tables.tables.remove(0);
                }
                tables.tables.push((key, values));
                tables.tables.len() - 1
            }
        };
        Ok(&tables.tables[index].1)
    }

    fn factor(&self, i0: usize) -> f32 {
        match &self.factors {
            Some(f) if i0 / 2 < f.layout.ne[0] => f.value([i0 / 2, 0, 0, 0]),
            _ => 1.0,
        }
    }

    fn position(&self, i: usize) -> f32 {
        self.positions.index_at([i, 0, 0, 0]) as f32
    }

    fn fill(&self, i2: usize, cache: &mut [f32]) {
        if !self.multi_section() {
            let mut theta = self.position(i2);
            for i0 in (0..self.width).step_by(2) {
                let (c, s) = rope_yarn(theta / self.factor(i0), &self.p, self.corr, i0);
                cache[i0] = c;
                cache[i0 + 1] = s;
                theta *= self.theta_scale;
            }
            return;
        }
        // ggml_mrope_cache_init
        let base = [0, 1, 2, 3].map(|k| self.position(i2 + k * self.ne2));
        let [t, h, w, e] = base;
        let (mut theta_t, mut theta_h, mut theta_w, mut theta_e) = (t, h, w, e);
        let s = self.p.sections.map(|v| v as usize);
        let sect_dims = s[0] + s[1] + s[2] + s[3];
        let sec_w = s[0] + s[1];
        let sec_e = sec_w + s[2];
        let imrope = self.p.mode == rope_mode::IMROPE;
        let independent = self.p.mode == rope_mode::VISION;
        for i0 in (0..self.width).step_by(2) {
            let sector = (i0 / 2) % sect_dims;
            if independent {
                if sector == 0 {
                    theta_t = t;
                } else if sector == s[0] {
                    theta_h = h;
                } else if sector == sec_w {
                    theta_w = w;
                } else if sector == sec_e {
                    theta_e = e;
                }
            }
            let theta = if imrope {
                if sector % 3 == 1 && sector < 3 * s[1] {
                    theta_h
                } else if sector % 3 == 2 && sector < 3 * s[2] {
                    theta_w
                } else if sector % 3 == 0 && sector < 3 * s[0] {
                    theta_t
                } else {
                    theta_e
                }
            } else if sector >= s[0] && sector < sec_w {
                theta_h
            } else if sector >= sec_w && sector < sec_w + s[2] {
                theta_w
            } else if sector >= sec_w + s[2] {
                theta_e
            } else {
                theta_t
            };
            let (c, sn) = rope_yarn(theta / self.factor(i0), &self.p, self.corr, i0);
            cache[i0] = c;
            cache[i0 + 1] = sn;
            theta_t *= self.theta_scale;
            theta_w *= self.theta_scale;
            theta_h *= self.theta_scale;
            theta_e *= self.theta_scale;
        }
    }

    fn rotate(&self, cache: &[f32], x: &[f32], y: &mut [f32]) {
        let n_dims = self.p.n_dims;
        let (pairs, offset, spread) = match self.p.mode {
            rope_mode::NORMAL => (n_dims, 1, false),
            rope_mode::VISION => (x.len(), n_dims, true),
            _ => (n_dims, n_dims / 2, true),
        };
        y.copy_from_slice(x);
        let window = if self.p.mode == rope_mode::VISION {
            0
        } else {
            self.p.n_offs
        };
        let backward = self.backward;
        let mut rotate = |fused: bool| {
            for i0 in (0..pairs).step_by(2) {
                let ic = window + if spread { i0 / 2 } else { i0 };
                let (cos, sin) = if backward {
                    (cache[i0], -cache[i0 + 1])
                } else {
                    (cache[i0], cache[i0 + 1])
                };
                let (x0, x1) = (x[ic], x[ic + offset]);
                (y[ic], y[ic + offset]) = if fused {
                    (x0.mul_add(cos, -(x1 * sin)), x0.mul_add(sin, x1 * cos))
                } else {
                    (x0 * cos - x1 * sin, x0 * sin + x1 * cos)
                };
            }
        };
        // the fused loop compiled for FMA (one instruction per `mul_add`, not a library call:
        // ROPE took 2-3x the time of ggml's); FMA machines without AVX2 take the library call
        if !(fused_multiply_add() && quant::with_fma(|| rotate(true))) {
            rotate(fused_multiply_add());
        }
    }
}

/// Whether the rotation contracts its first product and the sum into one fused multiply-add,
/// as ggml-cpu does when GCC builds it for a CPU with FMA (its default `-ffp-contract=fast`
/// turns `x0*cos - x1*sin` into `fma(x0, cos, -(x1*sin))`): then our rotations match the
/// reference's bit for bit, where separate roundings differed by 1-2 ulp on about a fifth of
/// the elements. Without FMA, ggml rounds each product, and so does this.
fn fused_multiply_add() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// ROPE (`backward` false) and ROPE_BACK (`backward` true).
pub(super) fn rope(
    node: &Node<'_>,
    dst: Dst<'_>,
    p: RopeParams,
    backward: bool,
    tables: &mut RopeTables,
) -> Result<()> {
    let a = node.input(0)?;
    let positions = node.view(1)?;
    let factors = node.optional_view(2)?;
    let ne0 = a.layout().ne[0];
    let width = if p.mode == rope_mode::VISION {
        ne0 - ne0 % 2
    } else {
        p.n_dims
    };
    let rope = Rope {
        p,
        corr: corr_dims(&p),
        theta_scale: p.freq_base.powf(-2.0 / p.n_dims as f32),
        positions,
        factors,
        ne2: a.layout().ne[2],
        width,
        backward,
    };
    let stride = rope.stride();
    // The table (and its key) grow with the token count, which a graph may set far above
    // the memory behind it (an empty tensor, zero strides): past a bound, each thread builds
    // one token's cache at a time, as ggml does.
    let tabled = dst.layout().rows() > 0
        && rope
            .ne2
            .checked_mul(stride)
            .is_some_and(|floats| floats <= TABLE_MAX_FLOATS);
    let table = if tabled {
        Some(rope.table(node, tables)?)
    } else {
        None
    };
    map_rows(
        node,
        dst,
        a,
        4,
        || (None, Vec::new()),
        |(token, own), _, [_, i2, _], x, y| {
            let cache = match table {
                Some(table) => table
                    .get(i2 * stride..(i2 + 1) * stride)
                    .ok_or_else(|| internal("ROPE row of a token beyond the table"))?,
                None => {
                    if *token != Some(i2) {
                        own.resize(stride, 0.0);
                        rope.fill(i2, own);
                        *token = Some(i2);
                    }
                    own
                }
            };
            rope.rotate(cache, x, y);
            Ok(())
        },
    )
}
