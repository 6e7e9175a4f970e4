"""The posterior a :class:`~torchbkb.botorch.BKBModel` computes with: DTC on its dictionary, or the exact GP when
the dictionary holds (nearly) every training point.

Both forms answer the same questions in the model's transformed space -- mean and variance, joint covariance,
conditioning on new (possibly differentiable) observations, hallucination -- so the model never asks which one
it holds. The DTC form is also built on demand in exact mode for what needs DTC quantities (BBKB batches,
BKB's widths): with the complete dictionary it is the same posterior.

Example:
    >>> import torch
    >>> from torchbkb.kernels import GaussianKernel
    >>> X = torch.rand(20, 2, dtype=torch.float64); y = X.sum(-1)
    >>> exact = ModelEngine(GaussianKernel(0.5), X, y, None, 0.01, X, exact=True)
    >>> dtc = ModelEngine(GaussianKernel(0.5), X, y, None, 0.01, X, exact=False)
    >>> exact.is_exact, dtc.is_exact
    (True, False)
    >>> Xq = torch.rand(5, 2, dtype=torch.float64)
    >>> all(torch.allclose(a, b) for a, b in zip(exact.joint(Xq), dtc.joint(Xq)))
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from torchbkb.botorch.conditioning import dtc_condition, shallow_module_copy
from torchbkb.botorch.defaults import EXACT_BELOW
from torchbkb.botorch.dictionary_sampling import draw_dictionary, sample_dictionary
from torchbkb.botorch.exact_state import ExactGPState
from torchbkb.dtc_posterior import DTCPosterior
from torchbkb.nystrom import NystromEmbedding
from torchbkb.rls_dictionary import DEFAULT_INCLUSION

__all__ = ["ModelEngine"]


class ModelEngine:
    """DTC or exact posterior of centered, transformed outcomes with noise ``λ`` (or per-point noise).

    Args:
        kernel: the model's kernel.
        X: `(*b, n, d)` transformed inputs; y: `(*b, n)` centered transformed outcomes.
        noise: `(*b, n)` per-point noise variances, or ``None`` for ``λ`` everywhere.
        lam: ``λ`` (the mean noise with per-point noise).
        dictionary: `(m, d)` the dictionary.
        exact: compute the exact GP (else DTC on the dictionary); :meth:`dense` is the model's rule.
    """

    def __init__(self, kernel: Callable, X: Tensor, y: Tensor, noise: Tensor | None, lam: float, dictionary: Tensor, exact: bool):
        self.kernel, self.lam, self.dictionary = kernel, float(lam), dictionary
        self.offset: Tensor | None = None  # the model's constant prior mean (set by the model, moved by apply)
        if exact:
            self.exact_state: ExactGPState | None = ExactGPState(kernel, X, y, torch.full_like(y, self.lam) if noise is None else noise)
            self._dtc: DTCPosterior | None = None
        else:
            self.exact_state = None
            self._dtc = DTCPosterior(NystromEmbedding(kernel, dictionary), noise=self.lam).fit(X, y, None if noise is None else self.lam / noise)

    @staticmethod
    def dense(dictionary: Tensor, X: Tensor, exact_fraction: float | None) -> bool:
        """Whether a dictionary of `(m, d)` points over `(*b, n, d)` ``X`` calls for the exact GP: ``m >= exact_fraction · n``."""
        return exact_fraction is not None and dictionary.shape[0] >= exact_fraction * X.shape[-2]

    @classmethod
    def build(cls, kernel: Callable, X: Tensor, y: Tensor, noise: Tensor | None, lam: float, q_bar: float, generator, exact_fraction: float | None,
              inclusion: str = DEFAULT_INCLUSION) -> ModelEngine:
        """Draw the dictionary by BKB's variance sampling and build the engine.

        When the replay of :func:`~torchbkb.botorch.sample_dictionary` predicts a dictionary of at least
        ``exact_fraction`` of the points (``complete_above``), the engine is exact and the dictionary (kept for
        DTC quantities) is drawn from the exact RLS variances at the training points, what the replay's last
        rounds approximate: a replay heading for a dense dictionary never costs more than the exact model.
        Otherwise the replay runs to the end and the engine is exact iff ``m >= exact_fraction · n``. Up to
        :data:`~torchbkb.botorch.defaults.EXACT_BELOW` points the engine is exact outright (no replay).
        """
        counts = None if noise is None else lam / noise
        small = exact_fraction is not None and X.shape[-2] <= EXACT_BELOW and X.dim() == 2
        S = None if small else sample_dictionary(kernel, X, lam, q_bar=q_bar, generator=generator, counts=counts, complete_above=exact_fraction, inclusion=inclusion)
        if S is not None:
            return cls(kernel, X, y, noise, lam, S, cls.dense(S, X, exact_fraction))
        engine = cls(kernel, X, y, noise, lam, X[:0], exact=True)  # exact, whatever the draw's size
        state = engine.exact_state
        engine._draw = lambda: draw_dictionary(X, state.training_variances() / lam, q_bar=q_bar, generator=generator, inclusion=inclusion)
        engine._like = X[:0]  # the dtype and device the drawn dictionary takes (moved by apply)
        return engine  # the draw costs a triangular inverse: made when the dictionary is first read

    @property
    def dictionary(self) -> Tensor:
        """`(m, d)` the dictionary (transformed space)."""
        if self._draw is not None:
            self._dictionary, self._draw = self._draw().to(self._like), None
        return self._dictionary

    @dictionary.setter
    def dictionary(self, value: Tensor) -> None:
        self._dictionary, self._draw = value, None

    @property
    def is_exact(self) -> bool:
        """Whether the exact GP is computed."""
        return self.exact_state is not None

    @property
    def _active(self) -> nn.Module:
        return self.exact_state if self.exact_state is not None else self._dtc

    @property
    def dtc(self) -> DTCPosterior:
        """The DTC posterior on the dictionary (built on first use in exact mode, on the same data)."""
        if self._dtc is None:
            state = self.exact_state
            counts = self.lam / state.train_noise.detach()
            emb = NystromEmbedding(self.kernel, self.dictionary)
            self._dtc = DTCPosterior(emb, noise=self.lam).fit(state.train_X.detach(), state.train_y.detach(), counts)
        return self._dtc

    @property
    def train_X(self) -> Tensor:
        """`(*b, n, d)` every observed input (transformed)."""
        return self._active.train_X

    @property
    def train_y(self) -> Tensor:
        """`(*b, n)` the centered observed outcomes."""
        return self._active.train_y

    @property
    def train_noise(self) -> Tensor:
        """`(*b, n)` the noise variance of every observed point."""
        if self.exact_state is not None:
            return self.exact_state.train_noise
        return self.lam / self._dtc.train_counts

    @property
    def batch_shape(self) -> torch.Size:
        """Batch shape of the observations (grows with fantasies)."""
        return self._active.batch_shape

    def forward(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and GP-scale variance at `(*b, q, d)` ``X``, each `(*b', q)`. Marginals do not depend on how the
        points are grouped: without batched training data every point is scored in one `(N, d)` call (a
        kernel over a batch of 2,048 `(1, d)` queries is several times slower than over one `(2048, d)` block)."""
        if X.dim() > 2 and self.batch_shape == torch.Size():
            mean, var = self._active(X.reshape(-1, X.shape[-1]))
            return mean.reshape(X.shape[:-1]), var.reshape(X.shape[:-1])
        return self._active(X)

    def joint(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean `(*b', q)` and joint covariance `(*b', q, q)` at `(*b, q, d)` ``X``."""
        return self._active.joint(X)

    def predict(self, X: Tensor, observation_noise: bool | Tensor = False) -> tuple[Tensor, Tensor]:
        """Mean `(*b', q)` and covariance `(*b', q, q)` (batch dimensions broadcast) at `(*b, q, d)` ``X``, plus
        ``λ·I`` (``observation_noise=True``) or the given `(*b, q[, 1])` noise; ``q = 1`` needs only ``k(x, x)``."""
        if X.shape[-2] == 1:
            mean, var = self.forward(X)  # (*b, 1)
            cov = var.unsqueeze(-1)  # (*b, 1, 1)
        else:
            mean, cov = self.joint(X)
        if isinstance(observation_noise, Tensor):
            noise = observation_noise.to(cov)
            if noise.dim() >= 1 and noise.shape[-1] == 1:
                noise = noise.squeeze(-1)  # (*b, q)
            cov = cov + torch.diag_embed(noise.expand(cov.shape[:-1]))
        elif observation_noise is not False:
            cov = cov + self.lam * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        batch = torch.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
        return mean.expand(*batch, mean.shape[-1]), cov.expand(*batch, *cov.shape[-2:])

    def condition(self, X: Tensor, y: Tensor, noise: Tensor | None, batch: torch.Size) -> ModelEngine:
        """A new engine that also observed ``y`` `(*b', k)` at ``X`` `(*b, k, d)` with noise `(*b'', k)` (default
        ``λ``); ``batch`` is the broadcast batch shape. Differentiable in ``X`` and ``y``; ``self`` is unchanged."""
        new = self._copy()
        k, d = X.shape[-2:]
        if self.is_exact:
            nz = torch.full_like(y, self.lam) if noise is None else noise
            new.exact_state = self.exact_state.condition(X.expand(*batch, k, d), y.expand(*batch, k), nz.expand(*batch, k))
            new._dtc = None
        else:
            new._dtc = shallow_module_copy(self._dtc)
            dtc_condition(new._dtc, X, y, None if noise is None else self.lam / noise, batch)
        return new

    def hallucinate(self, X: Tensor) -> ModelEngine:
        """A new engine conditioned on `(*b, k, d)` ``X`` with the posterior mean as outcome (variance shrinks,
        mean unchanged)."""
        new = self._copy()
        with torch.no_grad():
            if self.is_exact:
                mean = self.exact_state(X)[0]
                new.exact_state = self.exact_state.condition(X, mean, torch.full_like(mean, self.lam))
                new._dtc = None
            else:
                new._dtc = shallow_module_copy(self._dtc)
                new._dtc.update(X, None)
        return new

    def apply(self, fn) -> None:
        """Apply ``fn`` to every tensor (``nn.Module._apply``: ``.to()``, ``.double()``...)."""
        for part in {id(p): p for p in (self.exact_state, self._dtc) if p is not None}.values():
            part._apply(fn)
        if self.offset is not None:
            self.offset = fn(self.offset)
        if self._draw is not None:  # still to be drawn: stay lazy (BoTorch calls .to(X) on every forward), and
            self._like = fn(self._like)  # remember only where the draw must go (no chain of conversions)
        else:
            self._dictionary = fn(self._dictionary)

    def _copy(self) -> ModelEngine:
        new = ModelEngine.__new__(ModelEngine)
        new.__dict__.update(self.__dict__)
        return new
