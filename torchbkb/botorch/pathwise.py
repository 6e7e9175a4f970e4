"""Pathwise posterior samples of a :class:`~torchbkb.botorch.BKBModel`, registered with BoTorch's dispatchers.

The DTC posterior is a Bayesian linear model on the Nyström features ``z(x) = W k_S(x)`` plus the prior's
residual, so an exact draw of the posterior *function* is, with ``f₀`` a prior draw::

    f(x) = f₀(x) + z(x)ᵀ (w - W f₀(S)),      w ~ N(V⁻¹ Zᵀ C y, λ V⁻¹)

(``z(x)ᵀ W f₀(S)`` is ``f₀``'s projection on the dictionary, ``WᵀW = K_S⁺``, so the residual keeps the prior's
covariance ``k - zᵀz`` and the linear part has the DTC one). In exact mode it is Matheron's rule,
``f(x) = f₀(x) + k(x, X)(K + N)⁻¹(y - f₀(X) - ε)``. ``f₀`` comes from BoTorch's random-feature prior
sampler (``draw_kernel_feature_paths``; GPyTorch RBF, Matérn and scaled kernels), so
``draw_matheron_paths``, ``get_optimal_samples``, ``qJointEntropySearch`` and pathwise Thompson sampling
accept a ``BKBModel``.

Example:
    >>> import torch
    >>> from botorch.sampling.pathwise import draw_matheron_paths
    >>> from torchbkb.botorch import BKBModel
    >>> X = torch.rand(30, 2, dtype=torch.float64); Y = X.sum(-1, keepdim=True)
    >>> paths = draw_matheron_paths(BKBModel(X, Y, seed=0), sample_shape=torch.Size([4]))
    >>> paths(torch.rand(7, 2, dtype=torch.float64)).shape       # (samples, points)
    torch.Size([4, 7])
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.sampling.pathwise.features.generators import gen_kernel_features
from botorch.sampling.pathwise.paths import GeneralizedLinearPath, SamplePath
from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths
from botorch.sampling.pathwise.prior_samplers import DrawKernelFeaturePaths, draw_kernel_feature_paths
from botorch.sampling.pathwise.utils import get_input_transform, get_output_transform
from botorch.utils.sampling import draw_sobol_normal_samples
from torch import Size, Tensor, nn

from torchbkb.gp.exact_gp_state import ExactGPState
from torchbkb.botorch.model import BKBModel
from torchbkb.errors import InputDataError
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.gp.linalg import safe_cholesky

__all__ = ["BKBSamplePath", "draw_bkb_paths"]


class BKBSamplePath(SamplePath):
    """A batch of posterior function draws ``c + f₀(x) + update(x)`` in the model's transformed space; the
    model's input and outcome transforms are applied around it (BoTorch's ``TransformedModuleMixin``).

    Calling it on `(*batch, q, d)` original-space inputs returns `(*sample_shape, *batch', q)` values.
    """

    def __init__(self, prior_paths: SamplePath, update: nn.Module, mean_constant: Tensor, input_transform=None,
                 output_transform=None):
        super().__init__()
        self.prior_paths = prior_paths
        self.update = update
        self.register_buffer("mean_constant", mean_constant)
        self.input_transform = input_transform
        self.output_transform = output_transform

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        return self.prior_paths.forward(x) + self.update(x) + self.mean_constant.to(x)

    def set_ensemble_as_batch(self, ensemble_as_batch: bool) -> None:
        """A BKBModel is not an ensemble: nothing to set."""


class _FeatureUpdate(nn.Module):
    """``z(x)ᵀ coef`` on a Nyström embedding (DTC mode)."""

    def __init__(self, embedding: NystromEmbedding, coef: Tensor):
        super().__init__()
        self.embedding = embedding
        self.register_buffer("coef", coef)  # (*s, *b, r)

    def forward(self, x: Tensor) -> Tensor:
        Z = self.embedding(x)  # (*bx, q, r)
        return (Z @ self.coef.to(Z).unsqueeze(-1)).squeeze(-1)


class _ExactUpdate(nn.Module):
    """``Σ_j U_j(x) w_j`` on the exact state's blocks (exact mode)."""

    def __init__(self, state: ExactGPState, weights: list[Tensor]):
        super().__init__()
        self.state = state
        self.weights = weights  # [(*s, *b, n_j)]

    def forward(self, x: Tensor) -> Tensor:
        U = self.state.features(x)
        return sum((u @ w.to(u).unsqueeze(-1)).squeeze(-1) for u, w in zip(U, self.weights)).to(x.dtype)


def draw_bkb_paths(model: BKBModel, sample_shape: Size, prior_sampler=draw_kernel_feature_paths,
                   num_features: int = 1024, **kwargs: Any) -> BKBSamplePath:
    """Draw ``sample_shape`` posterior functions of ``model`` (see the module docstring).

    Args:
        model: a :class:`~torchbkb.botorch.BKBModel` with a GPyTorch RBF/Matérn (optionally scaled) kernel.
        sample_shape: the number (shape) of draws.
        prior_sampler: BoTorch's prior sampler (random Fourier features by default).
        num_features: random features of the default prior sampler.
        kwargs: ``update_strategy`` is accepted and ignored (the update is the model's own rule).

    Returns:
        A :class:`BKBSamplePath`.
    """
    kwargs.pop("update_strategy", None)
    if kwargs:
        raise InputDataError(f"draw_bkb_paths: expected no other keyword arguments, got {sorted(kwargs)}")
    from gpytorch.kernels import Kernel

    if not isinstance(model.covar_module, Kernel):
        raise InputDataError(
            f"model.covar_module: expected a GPyTorch kernel for pathwise sampling (RBF, Matérn, ScaleKernel), got "
            f"{type(model.covar_module).__name__}"
        )
    extra = {"num_features": int(num_features)} if prior_sampler is draw_kernel_feature_paths else {}
    prior = prior_sampler(model=model, sample_shape=Size(sample_shape), **extra)
    engine = model.dtc_posterior if not model.is_exact else None
    with torch.no_grad():
        if engine is not None:
            emb = engine.embedding
            S = emb.inducing_points
            f0_S = prior.forward(S)  # (*s, m)
            W = emb.projection  # (r, m)
            dt = engine.V_inv.dtype
            L = safe_cholesky(engine.lam * engine.V_inv, name="λ V⁻¹")  # (*b, r, r)
            eps = torch.randn(*Size(sample_shape), *L.shape[:-1], dtype=dt, device=L.device)  # (*s, *b, r)
            w = engine.weights.to(dt) + (L @ eps.unsqueeze(-1)).squeeze(-1)
            coef = w - f0_S.to(dt) @ W.to(dt).transpose(-1, -2)
            update = _FeatureUpdate(emb, coef)
        else:
            state = model.engine.exact_state
            X = state.train_X  # (*b, N, d)
            f0_X = prior.forward(X)  # (*s, *b, N)
            noise = state.train_noise.detach()
            eps = noise.sqrt() * torch.randn(f0_X.shape, dtype=f0_X.dtype, device=f0_X.device)
            update = _ExactUpdate(state, state.whiten(state.train_y.detach() - f0_X - eps))
    return BKBSamplePath(prior, update, model.mean_constant.detach().clone(), get_input_transform(model),
                         get_output_transform(model))


@DrawMatheronPaths.register(BKBModel)
def _draw_matheron_paths_bkb(model: BKBModel, *, sample_shape: Size, prior_sampler=draw_kernel_feature_paths,
                             update_strategy=None) -> BKBSamplePath:
    return draw_bkb_paths(model, sample_shape, prior_sampler=prior_sampler)


@DrawKernelFeaturePaths.register(BKBModel)
def _draw_kernel_feature_paths_bkb(model: BKBModel, sample_shape: Size, num_features: int = 1024,
                                   **kwargs: Any) -> GeneralizedLinearPath:
    """The prior of ``model`` in its transformed input space (zero mean, no transforms): random features of
    the kernel with Sobol normal weights, as BoTorch draws it for its own GPs."""
    kernel = model.covar_module
    features = gen_kernel_features(kernel=kernel, num_inputs=model.inducing_points.shape[-1],
                                   num_outputs=int(num_features))
    n = Size(sample_shape).numel() * kernel.batch_shape.numel()
    weight = draw_sobol_normal_samples(n=n, d=features.num_outputs, device=kernel.device, dtype=kernel.dtype)
    return GeneralizedLinearPath(feature_map=features,
                                 weight=weight.reshape(*Size(sample_shape), *kernel.batch_shape, features.num_outputs))
