//! Checks of DeepSeek V4's ops: LIGHTNING_INDEXER, DSV4_HC_COMB / _PRE / _POST.

use super::*;

/// Streams of DeepSeek V4's hyper-connections: the only count DSV4_HC_COMB takes (its
/// mixing matrices are `4 x 4`).
pub(crate) const HC_STREAMS: usize = 4;

/// Mixes per token that DSV4_HC_COMB reads from: `(2 + hc) * hc` (pre weights, post weights,
/// then the `hc x hc` matrix).
pub(crate) const HC_MIX_LEN: usize = (2 + HC_STREAMS) * HC_STREAMS;

impl Checker<'_> {
    /// LIGHTNING_INDEXER (`ggml_lightning_indexer`): `q {D, H, T, S}` (F32), keys
    /// `k {D, 1, n_kv, S}` (F32, F16, BF16 or a quantized type ggml can dequantize), `weights
    /// {H, T, 1, S}` (F32) and `mask {n_kv, T, 1, S'}` (F16, `S'` dividing `S`: the streams
    /// share masks by `s % S'`) give F32 `{n_kv, T, 1, S}`. ggml-cpu asserts packed elements
    /// along dimension 0 of every tensor; the other strides are free.
    pub(super) fn lightning_indexer(&self, dst: &Layout) -> Result<Planned> {
        let (q, k, weights, mask) = (self.need(0)?, self.need(1)?, self.need(2)?, self.need(3)?);
        if q.type_id != ty::F32
            || weights.type_id != ty::F32
            || mask.type_id != ty::F16
            || dst.type_id != ty::F32
        {
            return Err(self.refuse(
                "LIGHTNING_INDEXER takes F32 queries and weights, an F16 mask, and gives F32",
            ));
        }
        if !(is_float(&k) || (is_encoded(k.type_id) && quant::supports(k.type_id))) {
            return Err(self.refuse("LIGHTNING_INDEXER keys of this type are not supported"));
        }
        let [width, heads, tokens, streams] = q.ne;
        let n_kv = k.ne[2];
        let shapes = k.ne == [width, 1, n_kv, streams]
            && weights.ne == [heads, tokens, 1, streams]
            && mask.ne[..3] == [n_kv, tokens, 1]
            && mask.ne[3] > 0
            && streams.is_multiple_of(mask.ne[3])
            && dst.ne == [n_kv, tokens, 1, streams];
        if !shapes {
            return Err(self.bad(format!(
                "q {:?}, k {:?}, weights {:?}, mask {:?} cannot give {:?}",
                q.ne, k.ne, weights.ne, mask.ne, dst.ne
            )));
        }
        if ![&q, &k, &weights, &mask, dst]
            .iter()
            .all(|t| t.dense_rows())
        {
            return Err(self.bad("LIGHTNING_INDEXER needs packed elements along dimension 0"));
        }
        Ok(Planned {
            kernel: Kernel::LightningIndexer,
            sources: [q, k, weights, mask].map(Some).to_vec(),
            may_be_destination: vec![false; 4],
        })
    }

    /// DSV4_HC_COMB (`ggml_dsv4_hc_comb`): `mixes {(2 + hc) * hc, n_tokens}`, `scale {>= 3}`
    /// and `base {(2 + hc) * hc}`, all F32, give F32 `{hc, hc, n_tokens}`; ggml takes only
    /// `hc = 4` (24 mixes per token, of which the last 16 are the matrix). Any strides.
    pub(super) fn hc_comb(&self, dst: &Layout) -> Result<Planned> {
        let (mixes, scale, base) = (self.need(0)?, self.need(1)?, self.need(2)?);
        if [&mixes, &scale, &base, dst]
            .iter()
            .any(|t| t.type_id != ty::F32)
        {
            return Err(self.refuse("DSV4_HC_COMB takes and gives F32"));
        }
        let (streams, mix_len) = (HC_STREAMS, HC_MIX_LEN);
        let tokens = mixes.ne[1];
        let shapes = mixes.ne == [mix_len, tokens, 1, 1]
            && scale.ne[0] >= 3
            && scale.ne[1..] == [1, 1, 1]
            && base.ne == [mix_len, 1, 1, 1]
            && dst.ne == [streams, streams, tokens, 1];
        if !shapes {
            return Err(self.bad(format!(
                "mixes {:?}, scale {:?}, base {:?} cannot give {:?} ({streams} streams: \
                 {mix_len} mixes per token)",
                mixes.ne, scale.ne, base.ne, dst.ne
            )));
        }
        let iterations = usize::try_from(self.param(1))
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| self.bad(format!("iteration count {} below 1", self.param(1))))?;
        Ok(Planned {
            kernel: Kernel::HcComb {
                eps: self.fparam(0),
                iterations,
            },
            sources: vec![Some(mixes), Some(scale), Some(base)],
            may_be_destination: vec![false; 3],
        })
    }

    /// DSV4_HC_PRE (`ggml_dsv4_hc_pre` / `ggml_dsv4_hc_pre_gated`): `x {n_embd, hc, n_tokens}`
    /// with `weights {hc, n_tokens}` (or gates `{n_embd, hc, n_tokens}` when `op_params[1]`
    /// is not 0), all F32, give F32 `{n_embd, n_tokens}`, `hc` at least 1. Any strides.
    pub(super) fn hc_pre(&self, dst: &Layout) -> Result<Planned> {
        let (x, weights) = (self.need(0)?, self.need(1)?);
        if [&x, &weights, dst].iter().any(|t| t.type_id != ty::F32) {
            return Err(self.refuse("DSV4_HC_PRE takes and gives F32"));
        }
        let gated = self.param(1) != 0;
        let [n_embd, streams, tokens, _] = x.ne;
        let weights_fit = if gated {
            weights.ne == [n_embd, streams, tokens, 1]
        } else {
            weights.ne == [streams, tokens, 1, 1]
        };
        let shapes = streams > 0 && x.ne[3] == 1 && weights_fit && dst.ne == [n_embd, tokens, 1, 1];
        if !shapes {
            return Err(self.bad(format!(
                "x {:?} with {} {:?} cannot give {:?}",
                x.ne,
                if gated { "gates" } else { "weights" },
                weights.ne,
                dst.ne
            )));
        }
        Ok(Planned {
            kernel: Kernel::HcPre {
                scale: self.fparam(0),
                gated,
            },
            sources: vec![Some(x), Some(weights)],
            may_be_destination: vec![false; 2],
        })
    }

    /// DSV4_HC_POST (`ggml_dsv4_hc_post`): `x {n_embd, n_tokens}`, `residual {n_embd, hc,
    /// n_tokens}`, `post {hc, n_tokens}` and the optional `comb {hc, hc, n_tokens}`, all F32,
    /// give F32 `{n_embd, hc, n_tokens}`, `hc` at least 1. Any strides.
    pub(super) fn hc_post(&self, dst: &Layout) -> Result<Planned> {
        let (x, residual, post) = (self.need(0)?, self.need(1)?, self.need(2)?);
        let comb = self.src(3)?;
        if [&x, &residual, &post, dst]
            .into_iter()
            .chain(&comb)
            .any(|t| t.type_id != ty::F32)
        {
            return Err(self.refuse("DSV4_HC_POST takes and gives F32"));
        }
        let [n_embd, tokens, _, _] = x.ne;
        let streams = residual.ne[1];
        let shapes = streams > 0
            && x.ne[2..] == [1, 1]
            && residual.ne == [n_embd, streams, tokens, 1]
            && post.ne == [streams, tokens, 1, 1]
            && comb
                .as_ref()
                .is_none_or(|c| c.ne == [streams, streams, tokens, 1])
            && dst.ne == [n_embd, streams, tokens, 1];
        if !shapes {
            return Err(self.bad(format!(
                "x {:?}, residual {:?}, post {:?}, comb {:?} cannot give {:?}",
                x.ne,
                residual.ne,
                post.ne,
                comb.map(|c| c.ne),
                dst.ne
            )));
        }
        Ok(Planned {
            kernel: Kernel::HcPost,
            sources: vec![Some(x), Some(residual), Some(post), comb],
            may_be_destination: vec![false; 4],
        })
    }
}
