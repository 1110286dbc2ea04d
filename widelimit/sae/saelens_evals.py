"""SAELens' own evaluation code on stored activations (offline), for comparison with widelimit's metrics.

``sae_lens.evals.get_sparsity_and_variance_metrics`` reads activations from a
model's forward pass (``model.run_with_cache`` over token batches from an
``ActivationsStore``). Here the "model" is a lookup into the stored activation
matrix: the "tokens" are row indices, and ``run_with_cache`` returns those rows
under the SAE's hook name. SAELens' metric code then runs unchanged.
"""

from __future__ import annotations

import numpy as np

__all__ = ["saelens_sparsity_and_variance"]


class _Rows:
    def __init__(self, acts, hook):
        self.acts, self.hook = acts, hook

    def run_with_cache(self, tokens, **kw):
        return None, {self.hook: self.acts[tokens]}


class _Store:
    def __init__(self, n, ctx):
        self.n, self.ctx, self.pos = n, ctx, 0

    def get_batch_tokens(self, n_prompts):
        import torch

        idx = torch.arange(self.pos, self.pos + n_prompts * self.ctx).reshape(n_prompts, self.ctx)
        self.pos += n_prompts * self.ctx
        return idx


def saelens_sparsity_and_variance(sl_sae, acts, *, ctx: int = 16, batch_prompts: int = 8) -> dict:
    """SAELens' ``get_sparsity_and_variance_metrics`` of a ``sae_lens.SAE`` on ``acts`` (N, d_in).

    Uses the first ``floor(N / (ctx * batch_prompts)) * ctx * batch_prompts`` rows
    (SAELens evaluates whole batches). Returns its scalar metrics (``mse``,
    ``explained_variance``, ``cossim``, ``l2_ratio``, ``relative_reconstruction_bias``,
    ``l0``, ``l1``, ...) and ``n_tokens``.
    """
    import torch
    from sae_lens.evals import get_sparsity_and_variance_metrics
    from sae_lens.training.activation_scaler import ActivationScaler

    A = torch.as_tensor(np.asarray(acts), dtype=sl_sae.dtype)
    per = ctx * batch_prompts
    n_batches = A.shape[0] // per
    if n_batches < 1:
        raise ValueError(f"need at least ctx * batch_prompts = {per} rows, got {A.shape[0]}")
    hook = "hook_acts"
    sl_sae.cfg.metadata.hook_name = hook
    sl_sae.cfg.metadata.hook_head_index = None
    m, _ = get_sparsity_and_variance_metrics(
        sl_sae, _Rows(A, hook), _Store(A.shape[0], ctx), ActivationScaler(), n_batches=n_batches,
        compute_l2_norms=True, compute_sparsity_metrics=True, compute_variance_metrics=True,
        compute_featurewise_density_statistics=False, eval_batch_size_prompts=batch_prompts, model_kwargs={})
    m["n_tokens"] = n_batches * per
    return m
