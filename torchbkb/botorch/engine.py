"""The posterior a :class:`~torchbkb.botorch.BKBModel` computes with: DTC on its dictionary, or the exact GP when
the dictionary holds (nearly) every training point.

Both forms answer the same questions in the model's transformed space -- mean and variance, joint covariance,
conditioning on new (possibly differentiable) observations, hallucination -- so the model never asks which one
it holds. The DTC form is also built on demand in exact mode for what needs DTC quantities (BBKB batches,
BKB's widths): with the complete dictionary it is the same posterior. An engine is immutable once built: its lazy
parts (the dictionary of an exact engine, that DTC form) are made once under a lock, so threads that share a
model read the same posterior; it pickles (Ax and Ray pickle models).

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
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

import threading
from collections.abc import Callable

import torch
from gpytorch.kernels import Kernel
from linear_operator import LinearOperator, to_linear_operator
from torch import Tensor, nn

from torchbkb.botorch.conditioning import dtc_condition, shallow_module_copy
from torchbkb.botorch.defaults import exact_outright
from torchbkb.sampling.dictionary_replay import draw_dictionary, sample_dictionary
from torchbkb.gp.exact_gp_state import ExactGPState
from torchbkb.botorch.model_data import ModelData
from torchbkb.botorch.posterior_covariance import LAZY_JOINT, lazy_covariance
from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.gp.kernels import KernelAdapter, as_kernel
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.sampling.rls_dictionary import DEFAULT_INCLUSION

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

    def __init__(self, kernel: Callable, X: Tensor, y: Tensor, noise: Tensor | None, lam: float, dictionary: Tensor,
                 exact: bool):
        self.kernel, self.lam = kernel, float(lam)
        self._dictionary, self._draw = dictionary, None
        self._lock = threading.RLock()
        if exact:
            nz = torch.full_like(y, self.lam) if noise is None else noise
            self.exact_state: ExactGPState | None = ExactGPState(kernel, X, y, nz)
            self._dtc: DTCPosterior | None = None
        else:
            self.exact_state = None
            counts = None if noise is None else self.lam / noise
            self._dtc = DTCPosterior(NystromEmbedding(kernel, dictionary), noise=self.lam).fit(X, y, counts)

    @staticmethod
    def dense(dictionary: Tensor, X: Tensor, exact_fraction: float | None) -> bool:
        """Whether a dictionary of `(m, d)` points over `(*b, n, d)` ``X`` calls for the exact GP:
        ``m >= exact_fraction · n``."""
        return exact_fraction is not None and dictionary.shape[0] >= exact_fraction * X.shape[-2]

    @classmethod
    def build(cls, kernel: Callable, X: Tensor, y: Tensor, noise: Tensor | None, lam: float, q_bar: float, generator,
              exact_fraction: float | None, inclusion: str = DEFAULT_INCLUSION, exact: bool = False) -> ModelEngine:
        """Draw the dictionary by BKB's variance sampling and build the engine.

        When the replay of :func:`~torchbkb.botorch.sample_dictionary` predicts a dictionary of at least
        ``exact_fraction`` of the points (``complete_above``), the engine is exact and the dictionary (kept for
        DTC quantities) is drawn from the exact RLS variances at the training points, what the replay's last
        rounds approximate: a replay heading for a dense dictionary never costs more than the exact model.
        Otherwise the replay runs to the end and the engine is exact iff ``m >= exact_fraction · n``. Up to
        :func:`~torchbkb.botorch.defaults.exact_below` points on their device (unbatched), or with ``exact=True``,
        the engine is exact outright (no replay; the dictionary is drawn only if read).
        """
        counts = None if noise is None else lam / noise
        small = exact or exact_outright(X, exact_fraction)
        S = None
        if not small:
            S = sample_dictionary(kernel, X, lam, q_bar=q_bar, generator=generator, counts=counts,
                                  complete_above=exact_fraction, inclusion=inclusion)
        if S is not None:
            return cls(kernel, X, y, noise, lam, S, cls.dense(S, X, exact_fraction))
        engine = cls(kernel, X, y, noise, lam, X.reshape(-1, X.shape[-1])[:0], exact=True)
        # the draw costs a triangular inverse: made when the dictionary is first read, from this state
        state = None if generator is None else generator.get_state()
        engine._draw = (engine.exact_state, q_bar, inclusion, state, None if generator is None else generator.device)
        return engine

    @classmethod
    def from_data(cls, data: ModelData, kernel: Callable, default_noise: Tensor, offset: Tensor,
                  dictionary: Tensor | None, *, q_bar: float, seed: int | None, exact_fraction: float | None,
                  inclusion: str, batched: bool) -> ModelEngine:
        """The engine of a model's data: built on every observed block (the dictionary drawn, unless given, with
        a generator seeded by ``seed``), the hallucinated blocks then hallucinated in order.

        Args:
            data: the model's :class:`~torchbkb.botorch.model_data.ModelData`.
            kernel: the kernel, a frozen copy of the model's: a module is read through a frozen
                :class:`~torchbkb.gp.kernels.KernelAdapter` (its hyperparameters once).
            default_noise: the noise of points observed without one, `()` or `(*batch, 1)`.
            offset: `(*batch)` the constant prior mean of the transformed outcomes.
            dictionary: `(m, d)` a given dictionary, or ``None`` to draw one.
            batched: one set of hyperparameters per batch: the exact GP (one dictionary cannot serve them).
        """
        kernel = KernelAdapter(kernel, frozen=True) if isinstance(kernel, nn.Module) else kernel
        X, y = data.observed()
        known = data.observed_noise() if data.has_noise else None
        if known is None and (data.has_noise or batched):  # per-point, or one noise per batch
            known = data.noise(default_noise, hallucinated=False)
        lam = float(known.mean()) if known is not None else float(default_noise)
        yc = y - offset.unsqueeze(-1)
        if dictionary is not None:
            engine = cls(kernel, X, yc, known, lam, dictionary, batched or cls.dense(dictionary, X, exact_fraction))
        else:
            gen = None if seed is None else torch.Generator(device=X.device).manual_seed(seed)
            engine = cls.build(kernel, X, yc, known, lam, q_bar, gen, exact_fraction, inclusion, exact=batched)
        for Xh in data.hallucinated_inputs():
            engine = engine.hallucinate(Xh)
        return engine

    @property
    def dictionary(self) -> Tensor:
        """`(m, d)` the dictionary (transformed space)."""
        with self._lock:
            if self._draw is not None:
                self._dictionary, self._draw = self._drawn(*self._draw), None
            return self._dictionary

    def _drawn(self, state: ExactGPState, q_bar, inclusion, gen_state, gen_device) -> Tensor:
        """The dictionary drawn from the exact RLS variances at the build's training points (batches: the union)."""
        gen = None
        if gen_state is not None:
            gen = torch.Generator(device=gen_device)
            gen.set_state(gen_state)
        X = state.train_X.detach()  # the build's state: one block
        rls = state.training_variances() / self.lam
        flat_X, flat_r = X.reshape(-1, *X.shape[-2:]), rls.expand(X.shape[:-1]).reshape(-1, X.shape[-2])
        parts = [draw_dictionary(x, r, q_bar=q_bar, generator=gen, inclusion=inclusion) for x, r in zip(flat_X, flat_r)]
        return torch.cat(parts).to(self._dictionary)

    @property
    def is_exact(self) -> bool:
        """Whether the exact GP is computed."""
        return self.exact_state is not None

    @property
    def _active(self) -> nn.Module:
        return self.exact_state if self.exact_state is not None else self._dtc

    @property
    def dtc(self) -> DTCPosterior:
        """The DTC posterior on the dictionary (built once on first use in exact mode, on the same data)."""
        with self._lock:
            if self._dtc is None:
                state = self.exact_state
                counts = self.lam / state.train_noise.detach()
                emb = NystromEmbedding(self.kernel, self.dictionary)
                X, y = state.train_X.detach(), state.train_y.detach()
                self._dtc = DTCPosterior(emb, noise=self.lam).fit(X, y, counts)
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

    @property
    def has_graph(self) -> bool:
        """Whether the posterior was conditioned on observations that carry an autograd graph (a fantasy)."""
        if self.exact_state is not None:
            return any(t.requires_grad for t in self.exact_state.state_tensors())
        return any(t.requires_grad for t in (self._dtc.ZtZ, self._dtc.Zty, self._dtc.V_inv, self._dtc.train_y))

    def forward(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and GP-scale variance at `(*b, q, d)` ``X``, each `(*b', q)`. Marginals do not depend on how the
        points are grouped: without batched training data every point is scored in one `(N, d)` call (a
        kernel over a batch of 2,048 `(1, d)` queries is several times slower than over one `(2048, d)` block)."""
        if X.dim() > 2 and self.batch_shape == torch.Size():
            mean, var = self._marginals(X.reshape(-1, X.shape[-1]))
            return mean.reshape(X.shape[:-1]), var.reshape(X.shape[:-1])
        return self._marginals(X)

    def _marginals(self, X: Tensor) -> tuple[Tensor, Tensor]:
        if self.exact_state is not None:
            return self.exact_state(X)
        return self._dtc(X, validate=False)  # the model checked the query (once per posterior, one host read)

    def joint(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean `(*b', q)` and joint covariance `(*b', q, q)` at `(*b, q, d)` ``X``."""
        return self._active.joint(X)

    def predict(self, X: Tensor, observation_noise: bool | Tensor = False):
        """Mean `(*b', q)` and covariance `(*b', q, q)` (batch dimensions broadcast) at `(*b, q, d)` ``X``, plus
        ``λ·I`` (``observation_noise=True``) or the given `(*b, q[, 1])` noise. ``q = 1`` needs only ``k(x, x)``;
        past :data:`~torchbkb.botorch.posterior_covariance.LAZY_JOINT` points the covariance is a lazy
        ``LinearOperator`` whose diagonal costs ``O(q·m)`` (marginals never form the `(q, q)` matrix)."""
        noise = None
        if isinstance(observation_noise, Tensor):
            noise = observation_noise.to(X)
            if noise.dim() >= 1 and noise.shape[-1] == 1:
                noise = noise.squeeze(-1)  # (*b, q)
        elif observation_noise:
            noise = torch.full(X.shape[-2:-1], self.lam, dtype=X.dtype, device=X.device)  # (q,)
        if X.shape[-2] > LAZY_JOINT:
            mean, prior, roots = self.joint_roots(X)
            cov = lazy_covariance(prior, roots, noise)
        else:
            if X.shape[-2] == 1:
                mean, var = self.forward(X)  # (*b, 1)
                cov = var.unsqueeze(-1)  # (*b, 1, 1)
            else:
                mean, cov = self.joint(X)
            if noise is not None:
                cov = cov + torch.diag_embed(noise.expand(cov.shape[:-1]))
        batch = torch.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
        return mean.expand(*batch, mean.shape[-1]), cov.expand(*batch, *cov.shape[-2:])

    def joint_roots(self, X: Tensor) -> tuple[Tensor, Tensor, list[tuple[Tensor, float]]]:
        """``(mean, prior, roots)`` with the joint covariance at `(*b, q, d)` ``X`` equal to
        ``prior + Σ c R Rᵀ`` over ``roots = [(R, c), ...]``: exactly ``K_qq - U Uᵀ``, DTC
        ``K_qq - Z Zᵀ + λ U Uᵀ``; ``prior`` is the kernel's (lazy for a GPyTorch kernel) `(*b, q, q)` operator."""
        if self.exact_state is not None:
            mean, U = self.exact_state.mean_and_root(X)
            roots = [(U, -1.0)]
        else:
            mean, Z, U = self._dtc.joint_factors(X)
            roots = [(Z, -1.0), (U, self.lam)]
        return mean, kernel_operator(self.kernel, X), roots

    def condition(self, X: Tensor, y: Tensor, noise: Tensor | None, batch: torch.Size) -> ModelEngine:
        """A new engine that also observed ``y`` `(*b', k)` at ``X`` `(*b, k, d)` with noise `(*b'', k)` (default
        ``λ``); ``batch`` is the broadcast batch shape. Differentiable in ``X`` and ``y``; ``self`` is unchanged."""
        new = self._copy()
        k, d = X.shape[-2:]
        if self.is_exact:
            nz = torch.full_like(y, self.lam) if noise is None else noise
            grown = (X.expand(*batch, k, d), y.expand(*batch, k), nz.expand(*batch, k))
            new.exact_state = self.exact_state.condition(*grown)
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
        with self._lock:
            for part in {id(p): p for p in (self.exact_state, self._dtc) if p is not None}.values():
                part._apply(fn)
            self._dictionary = fn(self._dictionary)  # a pending draw follows its state, moved above

    def _copy(self) -> ModelEngine:
        with self._lock:  # the lazy parts made so far are shared with the copy
            new = ModelEngine.__new__(ModelEngine)
            new.__dict__.update(self.__dict__)
        new._lock = threading.RLock()
        return new

    def __getstate__(self) -> dict:
        with self._lock:
            state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()


def kernel_operator(kernel: Callable, X: Tensor) -> LinearOperator:
    """The prior covariance `(*b, q, q)` of ``X`` as a ``LinearOperator``: lazy for a GPyTorch kernel (its diagonal
    is ``k(x, x)``, no `(q, q)` block), dense for other callables."""
    if isinstance(kernel, KernelAdapter):
        kernel = kernel.kernel  # the wrapped kernel: a GPyTorch one keeps its lazy operator
    if isinstance(kernel, Kernel):
        return kernel(X)
    return to_linear_operator(as_kernel(kernel)(X, X))
