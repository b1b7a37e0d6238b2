//! Checks of the recurrent ops: SSM_CONV, SSM_SCAN, RWKV_WKV6/7, GATED_LINEAR_ATTN, GATED_DELTA_NET, SOLVE_TRI.

use super::*;

/// The linear-attention recurrences of [`Kernel::Wkv`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum WkvOp {
    /// RWKV_WKV6: sources `k, v, r, time_first, time_decay, state`.
    Rwkv6,
    /// RWKV_WKV7: sources `r, w, k, v, a, b, state`.
    Rwkv7,
    /// GATED_LINEAR_ATTN: sources `k, v, q, g, state`.
    GatedLinearAttn {
        /// The factor of `q` (`op_params[0]`).
        scale: f32,
    },
}

impl Checker<'_> {
    pub(super) fn solve_tri(&self, dst: &Layout) -> Result<Planned> {
        let (a, b) = (self.need(0)?, self.need(1)?);
        if a.type_id != ty::F32 || b.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("SOLVE_TRI takes and gives F32"));
        }
        let shapes = a.ne[0] == a.ne[1]
            && a.ne[1] == b.ne[1]
            && a.ne[2] == b.ne[2]
            && a.ne[3] == b.ne[3]
            && dst.ne == b.ne;
        if !shapes {
            return Err(self.bad(format!(
                "A {:?} and B {:?} cannot give {:?}",
                a.ne, b.ne, dst.ne
            )));
        }
        if !a.is_contiguous() || !b.is_contiguous() {
            return Err(self.bad("SOLVE_TRI needs contiguous A and B"));
        }
        Ok(Planned {
            kernel: Kernel::SolveTri,
            sources: vec![Some(a), Some(b)],
            may_be_destination: vec![false, false],
        })
    }

    /// GATED_DELTA_NET: q, k, v `[S_v, heads, tokens, seqs]` (q and k with fewer heads or
    /// sequences, taken modulo and by ratio as ggml does), gate `[1 or S_v, H, T, B]`, beta
    /// `[1, H, T, B]`, state `[S_v, S_v, H, B]`; the destination holds the outputs
    /// `[S_v * H, T * B]` followed by `snapshots` states of `S_v` rows per sequence.
    pub(super) fn gated_delta_net(&self, dst: &Layout) -> Result<Planned> {
        let srcs = [
            self.need(0)?,
            self.need(1)?,
            self.need(2)?,
            self.need(3)?,
            self.need(4)?,
            self.need(5)?,
        ];
        if srcs.iter().any(|s| s.type_id != ty::F32) || dst.type_id != ty::F32 {
            return Err(self.refuse("GATED_DELTA_NET takes and gives F32"));
        }
        let [q, k, v, gate, beta, state] = srcs;
        let [s_v, heads, tokens, seqs] = v.ne;
        // q and k: same row length and tokens; heads taken modulo, sequences by ratio
        let shares = |t: &Layout| {
            t.ne[0] == s_v
                && t.ne[2] == tokens
                && t.ne[1] > 0
                && t.ne[3] > 0
                && seqs.is_multiple_of(t.ne[3])
        };
        let gate_ok = (gate.ne[0] == 1 || gate.ne[0] == s_v) && gate.ne[1..] == v.ne[1..];
        let shapes = shares(&q)
            && shares(&k)
            && gate_ok
            && beta.ne == [1, heads, tokens, seqs]
            && state.ne == [s_v, s_v, heads, seqs];
        if !shapes {
            return Err(self.bad(format!(
                "q {:?}, k {:?}, v {:?}, g {:?}, beta {:?}, state {:?} do not fit",
                q.ne, k.ne, v.ne, gate.ne, beta.ne, state.ne
            )));
        }
        if !(q.dense_rows() && k.dense_rows() && v.dense_rows()) {
            return Err(self.bad("q, k and v need rows of adjacent elements"));
        }
        if !(gate.is_contiguous() && beta.is_contiguous() && state.is_contiguous()) {
            return Err(self.bad("g, beta and the state must be contiguous"));
        }
        let snapshots = usize::try_from(self.param(0))
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| self.bad(format!("snapshot count {} below 1", self.param(0))))?;
        let rows = snapshots
            .checked_mul(s_v)
            .and_then(|n| n.checked_mul(seqs))
            .and_then(|n| n.checked_add(tokens.checked_mul(seqs)?));
        let width = s_v.checked_mul(heads);
        if width
            .zip(rows)
            .is_none_or(|(width, rows)| dst.ne != [width, rows, 1, 1])
        {
            return Err(self.bad(format!(
                "destination {:?} is not [S_v * H, T * B + {snapshots} * S_v * B]",
                dst.ne
            )));
        }
        Ok(Planned {
            kernel: Kernel::GatedDeltaNet { snapshots },
            sources: srcs.map(Some).to_vec(),
            may_be_destination: vec![false; 6],
        })
    }

    /// SSM_CONV (`ggml_ssm_conv`): `sx {d_conv - 1 + n_t, d_inner, n_s}` and
    /// `c {d_conv, d_inner}` give `{d_inner, n_t, n_s}`, all F32 (the only type ggml-cpu has),
    /// with the element strides ggml-cpu asserts.
    pub(super) fn ssm_conv(&self, dst: &Layout) -> Result<Planned> {
        let (sx, c) = (self.need(0)?, self.need(1)?);
        if sx.type_id != ty::F32 || c.type_id != ty::F32 || dst.type_id != ty::F32 {
            return Err(self.refuse("SSM_CONV takes and gives F32"));
        }
        let (d_conv, d_inner) = (c.ne[0], c.ne[1]);
        // ggml_is_3d(sx), ggml_is_matrix(c), and at least one window per sequence
        let tokens = sx.ne[0].saturating_add(1).checked_sub(d_conv);
        let shapes = sx.ne[3] == 1
            && c.ne[2] == 1
            && c.ne[3] == 1
            && sx.ne[1] == d_inner
            && tokens.is_some_and(|n_t| dst.ne == [d_inner, n_t, sx.ne[2], 1]);
        if !shapes {
            return Err(self.bad(format!(
                "SSM_CONV of {:?} with weights {:?} cannot give {:?}",
                sx.ne, c.ne, dst.ne
            )));
        }
        if sx.nb[0] != 4 || c.nb[0] != 4 || sx.ne[0].checked_mul(4) != Some(sx.nb[1]) {
            return Err(self.bad("SSM_CONV needs packed rows of sx (and of c's elements)"));
        }
        Ok(Planned {
            kernel: Kernel::SsmConv,
            sources: vec![Some(sx), Some(c)],
            may_be_destination: vec![false, false],
        })
    }

    /// SSM_SCAN (`ggml_ssm_scan`): `s {d_state, head_dim, n_head, n_rs}`,
    /// `x {head_dim, n_head, n_t, n_s}`, `dt {n_head, n_t, n_s}`, `A {1 or d_state, n_head}`,
    /// `B`, `C {d_state, n_group, n_t, n_s}`, `ids {n_s}` (I32, which state of `s` each
    /// sequence starts from: checked at run time) give a 1-D F32 tensor of the outputs (`x`'s
    /// shape) followed by `K` states per sequence.
    pub(super) fn ssm_scan(&self, dst: &Layout) -> Result<Planned> {
        let [s, x, dt, a, b, c, ids] = [0, 1, 2, 3, 4, 5, 6].map(|slot| self.need(slot));
        let (s, x, dt, a, b, c, ids) = (s?, x?, dt?, a?, b?, c?, ids?);
        if ids.type_id != ty::I32 {
            return Err(self.bad("sequence ids must be I32"));
        }
        if [&s, &x, &dt, &a, &b, &c, dst]
            .iter()
            .any(|t| t.type_id != ty::F32)
        {
            return Err(self.refuse("SSM_SCAN takes and gives F32"));
        }
        let snapshots = usize::try_from(self.param(0))
            .ok()
            .filter(|&k| k >= 1)
            .ok_or_else(|| self.bad("K (op_params[0]) must be at least 1"))?;
        let (d_state, head_dim, n_head, n_tokens, n_seqs) =
            (s.ne[0], x.ne[0], x.ne[1], x.ne[2], x.ne[3]);
        let n_group = b.ne[1];
        let shapes = dt.ne == [n_head, n_tokens, n_seqs, 1]
            && s.ne[1] == head_dim
            && s.ne[2] == n_head
            && b.same_shape(&c)
            && b.ne[0] == d_state
            && b.ne[2] == n_tokens
            && b.ne[3] == n_seqs
            && d_state > 0
            && n_group > 0
            && n_head.is_multiple_of(n_group)
            && ids.ne == [n_seqs, 1, 1, 1]
            && a.ne[1] == n_head
            && a.ne[2] == 1
            && a.ne[3] == 1
            && (a.ne[0] == 1 || (a.ne[0] == d_state && snapshots == 1));
        if !shapes {
            return Err(self.bad(format!(
                "SSM_SCAN of s {:?}, x {:?}, dt {:?}, A {:?}, B {:?}, C {:?}, ids {:?} with K = {snapshots}",
                s.ne, x.ne, dt.ne, a.ne, b.ne, c.ne, ids.ne
            )));
        }
        let total = [d_state, head_dim, n_head, n_seqs]
            .iter()
            .try_fold(snapshots, |n, &d| n.checked_mul(d))
            .and_then(|states| states.checked_add(x.elements()));
        if total.is_none_or(|total| dst.ne != [total, 1, 1, 1]) {
            return Err(self.bad(format!(
                "SSM_SCAN of x {:?} and s {:?} with K = {snapshots} cannot give {:?}",
                x.ne, s.ne, dst.ne
            )));
        }
        // the layouts ggml asserts (its kernel walks them as packed runs)
        let packed_rows = |t: &Layout| t.nb[0] == 4 && t.ne[0].checked_mul(4) == Some(t.nb[1]);
        let strides = s.is_contiguous()
            && dt.is_contiguous()
            && a.is_contiguous()
            && packed_rows(&x)
            && packed_rows(&b)
            && packed_rows(&c)
            && ids.nb[0] == 4;
        if !strides {
            return Err(
                self.bad("SSM_SCAN needs contiguous s, dt and A, packed rows of x, B and C")
            );
        }
        Ok(Planned {
            kernel: Kernel::SsmScan { snapshots },
            sources: [s, x, dt, a, b, c, ids].map(Some).to_vec(),
            may_be_destination: vec![false; 7],
        })
    }

    /// RWKV_WKV6 / RWKV_WKV7 / GATED_LINEAR_ATTN (`ggml_rwkv_wkv6`, `ggml_rwkv_wkv7`,
    /// `ggml_gated_linear_attn`): contiguous F32 sources, the per-token ones
    /// `{S, H, n_tokens}`, RWKV 6's `time_first` `S * H` values, the state `S * S * H` values per
    /// sequence (`state.ne1` sequences, which share the tokens evenly), giving
    /// `{S * H, n_tokens + S * n_seqs}`: the outputs, then the final states.
    pub(super) fn wkv(&self, dst: &Layout, op: WkvOp) -> Result<Planned> {
        let count = match op {
            WkvOp::Rwkv6 => 6,
            WkvOp::Rwkv7 => 7,
            WkvOp::GatedLinearAttn { .. } => 5,
        };
        let srcs = (0..count)
            .map(|slot| self.need(slot))
            .collect::<Result<Vec<_>>>()?;
        if srcs.iter().chain([dst]).any(|t| t.type_id != ty::F32) {
            return Err(self.refuse("linear-attention recurrences take and give F32"));
        }
        if !srcs.iter().all(Layout::is_contiguous) {
            return Err(self.bad("linear-attention recurrences need contiguous sources"));
        }
        // k sets the sizes (slot 0 in RWKV 6 and GLA, 2 in RWKV 7); the state is last
        let key = if op == WkvOp::Rwkv7 { 2 } else { 0 };
        let (head_size, heads, tokens) = (srcs[key].ne[0], srcs[key].ne[1], srcs[key].ne[2]);
        let state = srcs[count - 1];
        let n_seqs = state.ne[1];
        let per_token = [head_size, heads, tokens, 1];
        // an empty k passes the buffer check whatever its sizes: their products are checked
        let width = head_size.checked_mul(heads);
        let token_inputs_fit =
            srcs[..count - 1]
                .iter()
                .enumerate()
                .all(|(slot, t)| match (op, slot) {
                    // RWKV 6's time_first: one value per head and key, read flat
                    (WkvOp::Rwkv6, 3) => Some(t.elements()) == width,
                    _ => t.ne == per_token,
                });
        let state_len = [head_size, head_size, heads, n_seqs]
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        let rows = head_size
            .checked_mul(n_seqs)
            .and_then(|n| n.checked_add(tokens));
        let shapes = token_inputs_fit
            && n_seqs > 0
            && tokens.is_multiple_of(n_seqs)
            && state_len == Some(state.elements())
            && width
                .zip(rows)
                .is_some_and(|(width, rows)| dst.ne == [width, rows, 1, 1]);
        if !shapes {
            let ne: Vec<_> = srcs.iter().map(|t| t.ne).collect();
            return Err(self.bad(format!(
                "sources {ne:?} cannot give {:?} (S = {head_size}, H = {heads}, {tokens} tokens, {n_seqs} sequences)",
                dst.ne
            )));
        }
        let in_place = vec![false; count];
        Ok(Planned {
            kernel: Kernel::Wkv(op),
            sources: srcs.into_iter().map(Some).collect(),
            may_be_destination: in_place,
        })
    }
}
