"""Thompson sampling on BKB's sketched posterior: the dictionary, its resampling and the refit are BKB's; only the
selection differs.

The DTC posterior is a Bayesian linear model on the Nyström features ``z(a) = W k_S(a)`` (``W`` whitens
``K_S``): the weights have the Gaussian posterior ``w ~ N(w̄, λ V⁻¹)`` (GP scale), ``μ̃(a) = z(a)ᵀ w̄``,
plus at each arm the part of the prior the dictionary does not see, ``k(a, a) - ‖z(a)‖²``. Each step draws
both, their standard deviations scaled by ``ν``, and pulls the arm whose draw is largest (lowest index on ties)::

    f(a) = μ̃(a) + k_S(a)ᵀ Wᵀ ε + ν √(k(a, a) - ‖z(a)‖²) ζ_a,   ε = ν L ξ,   L Lᵀ = λ V⁻¹,
    ξ, ζ standard normal

so each arm's draw has the DTC posterior's mean and variance ``ν² λ σ̃²(a)``, correlated through the features. The
weights' part over all ``A`` arms is one `(m,)·(m, A)` product with the dictionary's kernel rows; the residual
``k - ‖z‖²`` (one `(A × m)·(m × r)` pass, in chunks) is computed once per dictionary. Without the residual a
draw is flat away from the dictionary, the arms there are never pulled and the dictionary never grows: the
residual is what makes BKB explore (000, Sec. 3), here as for its UCB.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> arms = torch.rand(200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> f = 1 - ((arms - 0.3) ** 2).sum(-1)
    >>> bandit = ThompsonBKB(arms, GaussianKernel(0.3), noise=0.01, q_bar=1.0, seed=0)
    >>> for _ in range(60):
    ...     i = bandit.ask(); bandit.tell(i, f[i])
    >>> tuple(bandit.sample(4).shape), float(f.max() - f[bandit.ask()]) < 0.05
    ((4, 200), True)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchbkb.bandits.kernel_row_cache import ROW_CACHE_BYTES
from torchbkb.bandits.sketched import SketchedKernelBandit
from torchbkb.errors import check_int, check_nonnegative
from torchbkb.gp.linalg import safe_cholesky
from torchbkb.sampling.rls_dictionary import DEFAULT_INCLUSION

__all__ = ["ThompsonBKB"]


class ThompsonBKB(SketchedKernelBandit):
    """Thompson sampling with BKB's adaptively sketched posterior (module docstring).

    Args:
        arms: `(A, d)` arm set.
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.
        q_bar: oversampling ``q̄`` of the dictionary resampling.
        sample_scale: ``ν >= 0``, the multiplier of the weights' posterior standard deviation (``0``: greedy on
            ``μ̃``).
        seed: generator seed (first arm, dictionary draws, and the seed of each posterior draw, which is made
            on the arms' device).
        chunk_size, row_cache_bytes, inclusion, kernel_cache_bytes: see
            :class:`~torchbkb.bandits.sketched.SketchedKernelBandit`.

    Attributes:
        sample_scale: ``ν``.
        dictionary, embeddings_computed, row_posterior: see :class:`~torchbkb.bandits.sketched.SketchedKernelBandit`.
    """

    def __init__(
        self,
        arms: torch.Tensor,
        kernel: Callable,
        *,
        noise: float,
        q_bar: float = 2.0,
        sample_scale: float = 1.0,
        seed: int | None = None,
        chunk_size: int | None = None,
        row_cache_bytes: int = ROW_CACHE_BYTES,
        inclusion: str = DEFAULT_INCLUSION,
        kernel_cache_bytes: int | None = None,
    ):
        nu = check_nonnegative(sample_scale, "sample_scale")
        super().__init__(arms, kernel, noise=noise, q_bar=q_bar, beta=0.0, seed=seed, chunk_size=chunk_size,
                         row_cache_bytes=row_cache_bytes, prune=False, inclusion=inclusion,
                         kernel_cache_bytes=kernel_cache_bytes)
        self.sample_scale = nu
        self._residual: tuple | None = None  # (W, its residual std): derived once per dictionary

    def sample(self, n: int = 1) -> torch.Tensor:
        """`(n, A)` draws of ``z(a)ᵀ w`` over every arm from the current posterior (the bandit's generator; the
        prior's draws are ``0`` before the first reward: no dictionary, ``z ≡ 0``)."""
        n = check_int(n, "n")
        post = self.row_posterior
        if not post.fitted:
            return self.arms.new_zeros((n, self.num_arms))
        cov = post.V_inv * self.lam  # (r, r) λ V⁻¹, float64
        # the normals come from a generator on the arms' device seeded by the bandit's (checkpointed) one: an
        # (n, A) draw is never made on the host and copied
        seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        gen = torch.Generator(device=self.arms.device).manual_seed(seed)
        xi = torch.randn((cov.shape[0], n), dtype=cov.dtype, device=self.arms.device, generator=gen)
        zeta = torch.randn((n, self.num_arms), dtype=self.arms.dtype, device=self.arms.device, generator=gen)
        eps = self.sample_scale * (safe_cholesky(cov, name="λ V⁻¹") @ xi)  # (r, n)
        K_SA = self.rows.rows()  # (m, A), cached or streamed, in the slot order of W
        v = (post.W.T.to(eps.dtype) @ eps).T.to(self.arms.dtype)  # (n, m)
        return self.arm_means + v @ K_SA + (self.sample_scale * self.residual_std()) * zeta  # (n, A)

    def residual_std(self) -> torch.Tensor:
        """`(A,)` ``√(k(a, a) - ‖z(a)‖²)`` (GP scale) of the current dictionary, computed once per dictionary."""
        W = self.row_posterior.W
        cached = self._residual
        if cached is None or cached[0] is not W:
            rows, c = self.feature_rows(), self.chunk_size
            sq = torch.cat([rows[i : i + c].square().sum(-1) for i in range(0, self.num_arms, c)])  # (A,) ‖z‖²
            cached = self._residual = (W, (self.kdiag - sq.to(self.kdiag.dtype)).clamp_min(0.0).sqrt())
        return cached[1]

    def _select(self) -> torch.Tensor:
        if self.t == 0 or not self.row_posterior.fitted:
            return self._random_arm()
        return torch.argmax(self._mask_excluded(self.sample(1)[0])).reshape(1)
