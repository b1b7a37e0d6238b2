//! Checks of the optimizer steps: OPT_STEP_SGD, OPT_STEP_ADAMW.

use super::*;

impl Checker<'_> {
    /// The optimizer steps' common rules: the destination is the weights (src0) themselves
    /// (ggml's result is a view of them, and it writes the weights), F32; the per-element
    /// tensors `others` share the weights' shape and strides (ggml's kernel walks them all
    /// with the weights' strides), rows packed; `params` holds `count` contiguous F32 values.
    pub(super) fn optimizer_operands(
        &self,
        dst: &Layout,
        weights: &Layout,
        others: &[Layout],
        params: &Layout,
        count: usize,
    ) -> Result<()> {
        if weights.type_id != ty::F32 || others.iter().any(|t| t.type_id != ty::F32) {
            return Err(self.refuse("optimizer steps take F32 tensors"));
        }
        if params.type_id != ty::F32 {
            return Err(self.bad("optimizer parameters must be F32"));
        }
        if alias(dst, weights) != Alias::Same {
            return Err(self.bad("the destination must be the weights (src0) themselves"));
        }
        if others
            .iter()
            .any(|t| t.ne != weights.ne || t.nb != weights.nb)
        {
            return Err(
                self.bad("the optimizer's tensors differ from the weights in shape or strides")
            );
        }
        if !weights.dense_rows() {
            return Err(self.bad("optimizer steps need rows packed along ne[0]"));
        }
        if params.elements() != count || !params.is_contiguous() {
            return Err(self.bad(format!("the optimizer needs {count} contiguous parameters")));
        }
        Ok(())
    }

    /// OPT_STEP_SGD (`ggml_opt_step_sgd`): weights, gradient, and `α, wd`.
    pub(super) fn sgd(&self, dst: &Layout) -> Result<Planned> {
        let (w, g, params) = (self.need(0)?, self.need(1)?, self.need(2)?);
        self.optimizer_operands(dst, &w, &[g], &params, 2)?;
        Ok(Planned {
            kernel: Kernel::SgdStep,
            sources: vec![Some(w), Some(g), Some(params)],
            may_be_destination: vec![true, false, false],
        })
    }

    /// OPT_STEP_ADAMW (`ggml_opt_step_adamw`): weights, gradient, moments `m` and `v`, and the
    /// seven parameters `α, β1, β2, eps, wd, β1h, β2h`. ggml updates `m`, `v` and the weights
    /// element by element, each weight from its element's new moments; here three steps do
    /// the same arithmetic one tensor at a time (`m`, then `v`, then the weights), each
    /// writing only its own destination. Every tensor must be apart from the others (checked
    /// per step: the gradient and the parameters are sources of all three, so no step
    /// overwrites what a later one reads).
    pub(super) fn adamw(&self, dst: &Layout) -> Result<Vec<Step>> {
        let [w, g, m, v, params] = [0, 1, 2, 3, 4].map(|slot| self.need(slot));
        let (w, g, m, v, params) = (w?, g?, m?, v?, params?);
        self.optimizer_operands(dst, &w, &[g, m, v], &params, 7)?;
        // the moments are destinations of their steps: as any destination, injective
        if !injective(&m) || !injective(&v) {
            return Err(self.bad("a moment's elements overlap each other"));
        }
        let moment = |second: bool, target: Layout| -> Result<Step> {
            let srcs = vec![Some(target), Some(g), Some(params), Some(w)];
            // the weights are listed (not read) so that this step may not write them
            self.check_aliasing(&target, &srcs, &[true, false, false, false])?;
            Ok(self.step(Kernel::AdamwMoment { second }, target, srcs))
        };
        let first = moment(false, m)?;
        let second = moment(true, v)?;
        // the moments must not overlap each other either
        self.check_aliasing(&v, &[Some(m)], &[false])?;
        let srcs = vec![Some(w), Some(m), Some(v), Some(params), Some(g)];
        self.check_aliasing(dst, &srcs, &[true, false, false, false, false])?;
        let weights = self.step(Kernel::AdamwWeights, *dst, srcs);
        Ok(vec![first, second, weights])
    }
}
