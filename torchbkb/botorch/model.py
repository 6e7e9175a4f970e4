"""BKB as a BoTorch ``Model``: the DTC posterior on a variance-sampled dictionary, training-free.

:class:`BKBModel` is a drop-in replacement for ``botorch.models.SingleTaskGP`` in a BoTorch loop:
``posterior(X)`` returns a ``GPyTorchPosterior`` whose ``MultivariateNormal`` has the DTC mean and the
**joint** DTC covariance over the ``q`` points of ``X`` (GP scale, 003 Eq. 4), differentiable in ``X``;
``condition_on_observations`` (hence ``fantasize``) adds points by rank-one updates of ``V⁻¹`` without
refitting; input and outcome transforms are applied the BoTorch way.

The dictionary ``S`` is drawn by BKB's posterior-variance (ridge-leverage-score) sampling over the
training points (:func:`sample_dictionary`, 000 Algorithm 1), or given by ``inducing_points``.
Hyperparameters are **fixed** (no marginal-likelihood fitting): see :data:`DEFAULT_LENGTHSCALE`,
:data:`DEFAULT_OUTPUTSCALE` and :data:`DEFAULT_NOISE`, chosen for inputs normalized to the unit cube and
standardized outcomes, which is BoTorch's recommended setting (``outcome_transform`` defaults to
``Standardize(m=1)`` exactly as in ``SingleTaskGP``). :meth:`BKBModel.from_model` takes the fitted
hyperparameters of an existing ``SingleTaskGP`` instead.

Example:
    >>> import torch
    >>> from botorch.acquisition import UpperConfidenceBound
    >>> from botorch.optim import optimize_acqf_discrete
    >>> from torchbkb.botorch import BKBModel
    >>> X = torch.rand(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> Y = torch.sin(6 * X[:, :1]) + X[:, 1:]
    >>> model = BKBModel(X, Y, seed=0)
    >>> post = model.posterior(torch.rand(5, 3, 2, dtype=torch.float64))   # (b, q, d) -> joint over q
    >>> post.mean.shape, post.distribution.covariance_matrix.shape
    (torch.Size([5, 3, 1]), torch.Size([5, 3, 3]))
    >>> cand, _ = optimize_acqf_discrete(UpperConfidenceBound(model, beta=4.0), q=1, choices=X)
    >>> cand.shape
    torch.Size([1, 2])
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.models.model import FantasizeMixin, Model
from botorch.models.transforms.outcome import Standardize
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.utils.types import DEFAULT
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.constraints import GreaterThan
from torch import Tensor, nn

from torchbkb.dtc_posterior import DTCPosterior
from torchbkb.errors import InputDataError, check_finite, check_positive
from torchbkb.nystrom import NystromEmbedding
from torchbkb.rls_dictionary import RLSDictionary

__all__ = [
    "BKBModel",
    "sample_dictionary",
    "default_kernel",
    "DEFAULT_LENGTHSCALE",
    "DEFAULT_OUTPUTSCALE",
    "DEFAULT_NOISE",
]

#: Matérn-5/2 lengthscale per input dimension is ``DEFAULT_LENGTHSCALE · √d`` (inputs in ``[0, 1]^d``):
#: the typical distance between two uniform points of the unit cube grows like ``√(d/6)``.
DEFAULT_LENGTHSCALE = 0.2
#: Prior variance ``k(x, x)`` of the default kernel (outcomes standardized to unit variance).
DEFAULT_OUTPUTSCALE = 1.0
#: Noise variance ``λ`` of the standardized outcomes (also BKB's regularization).
DEFAULT_NOISE = 1e-3


def default_kernel(d: int, *, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> ScaleKernel:
    """BoTorch's classic default kernel ``ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d))`` with fixed
    hyperparameters: lengthscale ``DEFAULT_LENGTHSCALE · √d`` in every dimension, outputscale
    ``DEFAULT_OUTPUTSCALE``.

    Example:
        >>> k = default_kernel(4)
        >>> round(k.base_kernel.lengthscale[0, 0].item(), 3), k.outputscale.item()
        (0.4, 1.0)
    """
    k = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=int(d)))
    k.base_kernel.lengthscale = torch.full((1, int(d)), DEFAULT_LENGTHSCALE * math.sqrt(d))
    k.outputscale = torch.tensor(DEFAULT_OUTPUTSCALE)
    return k.to(dtype=dtype, device=device)


class BKBModel(Model, FantasizeMixin):
    """A training-free BoTorch model: BKB's DTC posterior on a posterior-variance-sampled dictionary.

    Scales: ``posterior(X).variance`` is the GP-scale DTC variance ``λ·σ̃²`` (in the original outcome units
    after the outcome transform); the papers' RLS-scale ``σ̃²`` of the transformed outcomes is
    :meth:`rls`. A BKB UCB ``μ̃ + β̃σ̃`` is BoTorch's ``UpperConfidenceBound(beta=β̃²/λ)``
    (see :class:`~torchbkb.botorch.BKBUpperConfidenceBound`).

    Args:
        train_X: `(*batch, n, d)` training inputs (BoTorch recommends the unit cube, or pass
            ``input_transform=Normalize(d)``).
        train_Y: `(*batch, n, 1)` training outcomes (single output).
        kernel: a ``gpytorch.kernels.Kernel`` (or a callable ``(X1, X2) -> Tensor``) on the *transformed*
            inputs; default :func:`default_kernel`. It is deep-copied and frozen: hyperparameters are fixed.
        noise: ``λ > 0``, the noise variance of the *transformed* outcomes; default :data:`DEFAULT_NOISE`.
        q_bar: oversampling ``q̄`` of the dictionary sampling (000 Algorithm 1).
        inducing_points: `(m, d)` dictionary in the space of ``train_X`` (the input transform is applied);
            if given, no sampling takes place.
        seed: seed of the dictionary sampling (``None``: fresh randomness).
        input_transform: a BoTorch ``InputTransform``, applied as in ``SingleTaskGP``.
        outcome_transform: a BoTorch ``OutcomeTransform``; by default ``Standardize(m=1)`` as in
            ``SingleTaskGP``; ``None`` for none.

    Attributes:
        dtc_posterior: the :class:`~torchbkb.DTCPosterior` on transformed inputs and centered transformed
            outcomes.
        covar_module: the (frozen) kernel.
        mean_constant: `()` constant prior mean of the transformed outcomes (0 unless :meth:`from_model`).

    Example:
        >>> import torch
        >>> from torchbkb.botorch import BKBModel
        >>> X = torch.rand(200, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        >>> Y = (X - 0.5).pow(2).sum(-1, keepdim=True)
        >>> model = BKBModel(X, Y, seed=0)
        >>> model.num_inducing <= 200, model.num_outputs, model.batch_shape
        (True, 1, torch.Size([]))
        >>> fantasy = model.condition_on_observations(X[:2] + 0.01, Y[:2])   # rank-one updates, no refit
        >>> fantasy.train_inputs[0].shape
        torch.Size([202, 3])
    """

    _num_outputs = 1

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        kernel: Callable | None = None,
        noise: float = DEFAULT_NOISE,
        q_bar: float = 2.0,
        inducing_points: Tensor | None = None,
        seed: int | None = None,
        input_transform: nn.Module | None = None,
        outcome_transform: nn.Module | None = DEFAULT,
    ) -> None:
        super().__init__()
        _check_train_data(train_X, train_Y)
        if outcome_transform is DEFAULT:
            outcome_transform = Standardize(m=1, batch_shape=train_X.shape[:-2])
        with torch.no_grad():
            X_tf = self.transform_inputs(train_X, input_transform=input_transform)  # learns Normalize bounds
        Y_tf = train_Y
        if outcome_transform is not None:
            outcome_transform.train()
            Y_tf, _ = outcome_transform(train_Y, X=X_tf)
        if kernel is None:
            kernel = default_kernel(X_tf.shape[-1], dtype=train_X.dtype, device=train_X.device)
        S_tf = None
        if inducing_points is not None:
            S_tf = self._transform_inducing(inducing_points, train_X, input_transform)
        self._setup(
            kernel=kernel,
            X_tf=X_tf.detach(),
            y_tf=Y_tf.detach().squeeze(-1),
            noise=noise,
            mean_constant=0.0,
            q_bar=q_bar,
            inducing_points=S_tf,
            seed=seed,
            input_dim=train_X.shape[-1],
        )
        if input_transform is not None:
            self.input_transform = input_transform
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform
        self.eval()

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_model(
        cls,
        gp: Model,
        q_bar: float = 2.0,
        inducing_points: Tensor | None = None,
        seed: int | None = None,
    ) -> "BKBModel":
        """Build a BKBModel from a fitted single-output ``SingleTaskGP`` (or any single-output BoTorch
        ``ExactGP`` model with a homoskedastic ``GaussianLikelihood`` and a constant or zero mean).

        Copies the fitted kernel, the likelihood noise, the constant mean, the (transformed) training data
        and deep copies of the input and outcome transforms, so that with a dictionary holding every
        training point ``BKBModel.from_model(gp).posterior(X)`` equals ``gp.posterior(X)``.

        Args:
            gp: the fitted model (left unchanged).
            q_bar: oversampling of the dictionary sampling.
            inducing_points: `(m, d)` dictionary in the space of the original inputs; default: sampled.
            seed: seed of the dictionary sampling.

        Returns:
            A new :class:`BKBModel`.

        Example:
            >>> import torch
            >>> from botorch.models import SingleTaskGP
            >>> X = torch.rand(30, 2, dtype=torch.float64); Y = X.sum(-1, keepdim=True)
            >>> gp = SingleTaskGP(X, Y)                               # (hyperparameters normally fitted)
            >>> bkb = BKBModel.from_model(gp, inducing_points=X)     # every training point: the exact GP
            >>> Xq = torch.rand(4, 1, 2, dtype=torch.float64)
            >>> bool(torch.allclose(bkb.posterior(Xq).variance, gp.posterior(Xq).variance))
            True
        """
        from gpytorch.means import ConstantMean, ZeroMean
        from gpytorch.models import ExactGP

        if not isinstance(gp, Model) or not isinstance(gp, ExactGP):
            raise InputDataError(f"gp: expected a BoTorch ExactGP model such as SingleTaskGP, got {type(gp).__name__}")
        if gp.num_outputs != 1:
            raise InputDataError(f"gp: expected a single-output model, got num_outputs={gp.num_outputs}")
        if gp.batch_shape != torch.Size():
            raise InputDataError(
                f"gp: expected a model without batch dimensions (one shared dictionary), got batch_shape {tuple(gp.batch_shape)}"
            )
        lik = gp.likelihood
        if type(lik) is not GaussianLikelihood:
            raise InputDataError(
                f"gp.likelihood: expected a homoskedastic GaussianLikelihood, got {type(lik).__name__}"
            )
        noise = float(lik.noise.detach().reshape(-1)[0])
        mean_module = getattr(gp, "mean_module", None)
        if isinstance(mean_module, ConstantMean):
            c = float(mean_module.constant.detach().reshape(-1)[0])
        elif isinstance(mean_module, ZeroMean):
            c = 0.0
        else:
            raise InputDataError(
                f"gp.mean_module: expected ConstantMean or ZeroMean, got {type(mean_module).__name__}"
            )
        input_transform = getattr(gp, "input_transform", None)
        if gp._has_transformed_inputs:  # eval mode: train_inputs hold the transformed inputs
            X_orig = gp._original_train_inputs
            X_tf = gp.train_inputs[0]
        else:
            X_orig = gp.train_inputs[0]
            with torch.no_grad():
                X_tf = X_orig if input_transform is None else input_transform.preprocess_transform(X_orig)
        y_tf = gp.train_targets  # (n,) outcome-transformed
        it = None if input_transform is None else copy.deepcopy(input_transform).eval()
        ot = getattr(gp, "outcome_transform", None)
        ot = None if ot is None else copy.deepcopy(ot).eval()
        S_tf = None if inducing_points is None else cls._transform_inducing(inducing_points, X_orig, it)

        model = cls.__new__(cls)
        Model.__init__(model)
        model._setup(
            kernel=gp.covar_module,
            X_tf=X_tf.detach(),
            y_tf=y_tf.detach(),
            noise=noise,
            mean_constant=c,
            q_bar=q_bar,
            inducing_points=S_tf,
            seed=seed,
            input_dim=X_orig.shape[-1],
        )
        if it is not None:
            model.input_transform = it
        if ot is not None:
            model.outcome_transform = ot
        model.eval()
        return model

    @staticmethod
    def _transform_inducing(inducing_points: Tensor, train_X: Tensor, input_transform: nn.Module | None) -> Tensor:
        if not isinstance(inducing_points, Tensor) or inducing_points.dim() != 2 or inducing_points.shape[-1] != train_X.shape[-1]:
            got = tuple(inducing_points.shape) if isinstance(inducing_points, Tensor) else type(inducing_points).__name__
            raise InputDataError(f"inducing_points: expected shape (m, {train_X.shape[-1]}), got {got}")
        if inducing_points.dtype != train_X.dtype or inducing_points.device != train_X.device:
            raise InputDataError(
                f"inducing_points: expected dtype {train_X.dtype} on {train_X.device}, got "
                f"{inducing_points.dtype} on {inducing_points.device}"
            )
        check_finite(inducing_points, "inducing_points")
        if input_transform is None:
            return inducing_points.detach()
        was_training = input_transform.training
        input_transform.eval()
        with torch.no_grad():
            S = input_transform(inducing_points)
        input_transform.train(was_training)
        return S.detach()

    def _setup(self, *, kernel, X_tf, y_tf, noise, mean_constant, q_bar, inducing_points, seed, input_dim) -> None:
        lam = check_positive(noise, "noise")
        self.q_bar = check_positive(q_bar, "q_bar")
        self._input_dim = int(input_dim)
        if isinstance(kernel, nn.Module):
            kernel = copy.deepcopy(kernel).to(dtype=X_tf.dtype, device=X_tf.device)
            kernel.requires_grad_(False)  # fixed hyperparameters: the model is training-free
        self.covar_module = kernel
        self.register_buffer("mean_constant", torch.tensor(float(mean_constant), dtype=X_tf.dtype, device=X_tf.device))
        if inducing_points is None:
            gen = None if seed is None else torch.Generator(device=X_tf.device).manual_seed(int(seed))
            inducing_points = sample_dictionary(kernel, X_tf, lam, q_bar=self.q_bar, generator=gen)
        embedding = NystromEmbedding(kernel, inducing_points)
        self.dtc_posterior = DTCPosterior(embedding, noise=lam).fit(X_tf, y_tf - float(mean_constant))

    # ------------------------------------------------------------------ BoTorch Model API
    @property
    def num_outputs(self) -> int:
        """Always 1."""
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        """Batch shape of the training data (grows with ``fantasize``)."""
        return self.dtc_posterior.batch_shape

    @property
    def noise(self) -> float:
        """``λ``, the noise variance of the transformed outcomes."""
        return self.dtc_posterior.lam

    @property
    def num_inducing(self) -> int:
        """Dictionary size ``m``."""
        return self.dtc_posterior.embedding.num_inducing

    @property
    def inducing_points(self) -> Tensor:
        """`(m, d)` dictionary in the *transformed* input space."""
        return self.dtc_posterior.embedding.inducing_points

    @property
    def train_inputs(self) -> tuple[Tensor]:
        """``(X,)`` with `(*batch, n, d)` transformed training inputs (as ``SingleTaskGP`` in eval mode)."""
        return (self.dtc_posterior.train_X,)

    @property
    def train_targets(self) -> Tensor:
        """`(*batch, n)` outcome-transformed training targets."""
        return self.dtc_posterior.train_y + self.mean_constant.to(self.dtc_posterior.train_y)

    @property
    def likelihood(self) -> GaussianLikelihood:
        """A (new, detached) ``GaussianLikelihood`` with noise ``λ``; for BoTorch code that inspects it."""
        lik = GaussianLikelihood(noise_constraint=GreaterThan(0.0))
        lik = lik.to(self.mean_constant)
        lik.noise = torch.tensor(self.noise, dtype=self.mean_constant.dtype, device=self.mean_constant.device)
        return lik

    def subset_output(self, idcs: list[int]) -> "BKBModel":
        """Single output: ``idcs`` must be ``[0]``."""
        if list(idcs) != [0]:
            raise InputDataError(f"idcs: expected [0] (BKBModel has one output), got {idcs!r}")
        return self

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
        **kwargs: Any,
    ):
        """Joint DTC posterior over the ``q`` points of each batch of ``X``.

        Args:
            X: `(*batch, q, d)` points in the original input space; gradients flow to ``X``.
            output_indices: ``None`` or ``[0]``.
            observation_noise: ``True`` adds ``λ·I`` (transformed space); a `(*batch, q, 1)` tensor adds
                that noise (transformed space).
            posterior_transform: an optional BoTorch ``PosteriorTransform``.

        Returns:
            ``GPyTorchPosterior`` with ``mean`` `(*batch', q, 1)`, ``batch' = broadcast(batch, batch_shape)``,
            and a `(*batch', q, q)` covariance (untransformed by the outcome transform).
        """
        if output_indices is not None and list(output_indices) != [0]:
            raise InputDataError(f"output_indices: expected None or [0], got {output_indices!r}")
        self.eval()
        self._check_X(X, "X")
        try:
            torch.broadcast_shapes(X.shape[:-2], self.batch_shape)
        except RuntimeError:
            raise InputDataError(
                f"X: expected a batch shape broadcastable with the model's batch_shape {tuple(self.batch_shape)}, "
                f"got X of shape {tuple(X.shape)}"
            ) from None
        X_tf = self.transform_inputs(X)
        if X_tf.shape[-2] == 1:  # q = 1 (analytic acquisitions): the variance needs only k(x, x)
            mean, var = self.dtc_posterior(X_tf)  # (*b, 1), (*b, 1)
            cov = var.unsqueeze(-1)  # (*b, 1, 1)
        else:
            mean, cov = self.dtc_posterior.joint(X_tf)  # (*b, q), (*b, q, q)
        mean = mean + self.mean_constant.to(mean)
        if observation_noise is not False:
            if isinstance(observation_noise, Tensor):
                noise = observation_noise.to(cov)
                if noise.dim() >= 1 and noise.shape[-1] == 1:
                    noise = noise.squeeze(-1)  # (*b, q)
                cov = cov + torch.diag_embed(noise.expand(cov.shape[:-1]))
            else:
                cov = cov + self.noise * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        posterior = GPyTorchPosterior(distribution=MultivariateNormal(mean, cov))
        if hasattr(self, "outcome_transform"):
            posterior = self.outcome_transform.untransform_posterior(posterior, X=X_tf)
        if posterior_transform is not None:
            return posterior_transform(posterior, X=X_tf)
        return posterior

    def rls(self, X: Tensor) -> Tensor:
        """The papers' RLS-scale variance ``σ̃²`` (transformed outcomes, no observation noise).

        Args:
            X: `(*batch, n, d)` in the original input space.

        Returns:
            `(*batch', n)`.
        """
        self.eval()
        self._check_X(X, "X")
        return self.dtc_posterior.rls(self.transform_inputs(X))

    def condition_on_observations(self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any) -> "BKBModel":
        """A new model conditioned on ``(X, Y)`` by rank-one updates of ``V⁻¹`` (no refit, same dictionary).

        Args:
            X: `(*batch, n', d)` new inputs (original space).
            Y: `(*batch', n', 1)` new outcomes (original space); ``batch'`` may have more leading dimensions
                than ``batch`` (fantasies), it must broadcast against ``batch`` and the model's batch shape.
            noise: optional `(*batch', n', 1)` observation noise variances (transformed space) -- points are
                weighted by ``λ / noise``.

        Returns:
            A new :class:`BKBModel` of batch shape ``broadcast(batch', batch, self.batch_shape)`` that shares
            this model's dictionary, kernel and transforms.
        """
        self.eval()
        self._check_X(X, "X")
        if not isinstance(Y, Tensor) or Y.dim() < 2 or Y.shape[-1] != 1 or Y.shape[-2] != X.shape[-2]:
            got = tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__
            raise InputDataError(f"Y: expected shape (*batch, {X.shape[-2]}, 1), got {got}")
        check_finite(Y, "Y")
        X_tf = self.transform_inputs(X).detach()
        Y_tf = Y.detach().to(X_tf)
        if hasattr(self, "outcome_transform"):
            Y_tf, _ = self.outcome_transform(Y_tf, X=X_tf)
        y = Y_tf.squeeze(-1) - self.mean_constant.to(Y_tf)  # (*b', n')
        counts = None
        if noise is not None:
            if not isinstance(noise, Tensor):
                raise InputDataError(f"noise: expected a tensor like Y, got {type(noise).__name__}")
            nz = noise.detach().to(X_tf)
            if nz.dim() < 2 or nz.shape[-1] != 1:
                raise InputDataError(f"noise: expected shape (*batch, {X.shape[-2]}, 1) like Y, got {tuple(noise.shape)}")
            nz = nz.squeeze(-1)  # (*b, n')
            check_finite(nz, "noise")
            if bool((nz <= 0).any()):
                raise InputDataError(f"noise: expected positive variances, got min {float(nz.min()):.3e}")
            counts = self.noise / nz
        try:
            batch = torch.broadcast_shapes(X_tf.shape[:-2], y.shape[:-1], self.batch_shape)
            if counts is not None:
                batch = torch.broadcast_shapes(batch, counts.shape[:-1])
        except RuntimeError:
            raise InputDataError(
                f"X, Y: expected batch shapes broadcastable with the model's {tuple(self.batch_shape)}, got "
                f"X {tuple(X.shape)} and Y {tuple(Y.shape)}"
            ) from None
        new = self._clone()
        _condition(new.dtc_posterior, X_tf, y, counts, batch)
        return new

    def hallucinate(self, X: Tensor) -> "BKBModel":
        """A new model whose variance is conditioned on ``X`` with pseudo-rewards equal to the posterior
        mean (BBKB / GP-BUCB's hallucinated observations): the mean is unchanged, the variance shrinks.

        Args:
            X: `(n', d)` pending points (original space).

        Returns:
            A new :class:`BKBModel` sharing this model's dictionary.
        """
        self.eval()
        self._check_X(X, "X_pending")
        if X.dim() != 2:
            raise InputDataError(f"X_pending: expected shape (n, {self._input_dim}), got {tuple(X.shape)}")
        new = self._clone()
        if X.shape[0] > 0:
            with torch.no_grad():
                X_tf = self.transform_inputs(X).detach()
                new.dtc_posterior.update(X_tf.expand(*self.batch_shape, *X_tf.shape), None)  # (*batch, n', d)
        return new

    # ------------------------------------------------------------------ internals
    def _set_transformed_inputs(self) -> None:
        """No-op: BKBModel always stores transformed training inputs (it is never trained)."""

    def _revert_to_original_inputs(self) -> None:
        """No-op (see :meth:`_set_transformed_inputs`)."""

    def _check_X(self, X: Tensor, name: str) -> None:
        if not isinstance(X, Tensor):
            raise InputDataError(f"{name}: expected a torch.Tensor, got {type(X).__name__}")
        if X.dim() < 2 or X.shape[-1] != self._input_dim:
            raise InputDataError(f"{name}: expected shape (*batch, q, {self._input_dim}), got {tuple(X.shape)}")
        ref = self.mean_constant
        if X.dtype != ref.dtype or X.device != ref.device:
            raise InputDataError(
                f"{name}: expected dtype {ref.dtype} on {ref.device} (the model's; use model.to(X)), got "
                f"dtype {X.dtype} on {X.device}"
            )
        check_finite(X.detach(), name)

    def _clone(self) -> "BKBModel":
        """A copy with its own posterior state; dictionary, kernel and transforms are shared."""
        new = _shallow_module_copy(self)
        new.dtc_posterior = _shallow_module_copy(self.dtc_posterior)
        return new


# ---------------------------------------------------------------------- dictionary sampling
def sample_dictionary(
    kernel: Callable,
    X: Tensor,
    noise: float,
    q_bar: float = 2.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """BKB's posterior-variance (ridge-leverage-score) dictionary over a set of training points.

    000 Algorithm 1 resamples after every pull: each point enters with probability ``min(1, q̄·σ̃²(x))``
    computed under the previous posterior (RLS scale). Replaying that over ``n`` given points would cost
    ``n`` refits, so the history is replayed in geometric rounds: with ``S = {x_1}``, for prefixes of length
    ``1, 2, 4, ..., n``, the posterior fitted on the current prefix with the current dictionary scores the
    next (twice as long) prefix and the dictionary is resampled from it; a last round scores all ``n``
    points under the posterior fitted on all of them. Each round costs ``O(n_j m²)``, ``O(n m²)`` in all.
    If no point is drawn, the one of largest ``σ̃²`` is kept.

    Args:
        kernel: a GPyTorch kernel or callable ``(X1, X2) -> Tensor``.
        X: `(*batch, n, d)` training points, ``n >= 1`` (a batch gets the union of its batches' dictionaries).
        noise: ``λ > 0``.
        q_bar: oversampling ``q̄``.
        generator: ``torch.Generator`` for reproducibility.

    Returns:
        `(m, d)` dictionary (rows of ``X``).

    Example:
        >>> import torch
        >>> from torchbkb.kernels import GaussianKernel
        >>> X = torch.rand(500, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> S = sample_dictionary(GaussianKernel(0.2), X, noise=0.01, generator=torch.Generator().manual_seed(0))
        >>> 1 <= S.shape[0] < 100                      # a smooth 1-d kernel: small effective dimension
        True
    """
    lam = check_positive(noise, "noise")
    if not isinstance(X, Tensor) or X.dim() < 2 or X.shape[-2] < 1:
        raise InputDataError(f"X: expected shape (*batch, n >= 1, d), got {tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__}")
    dic = RLSDictionary(q_bar, generator=generator if generator is not None else _fresh_generator(X.device))
    flat = X.detach().reshape(-1, *X.shape[-2:])  # (B, n, d): one history per batch
    parts = [_sample_one(kernel, flat[i], lam, dic) for i in range(flat.shape[0])]
    return torch.cat(parts, dim=0)


def _sample_one(kernel, X: Tensor, lam: float, dic: RLSDictionary) -> Tensor:
    n = X.shape[0]
    emb = NystromEmbedding(kernel, X[:1])  # S_1 = {x_1}
    post = DTCPosterior(emb, noise=lam)
    end = 1
    with torch.no_grad():
        while True:
            final = end == n
            new_end = n if final else min(n, 2 * end)
            Z = emb(X[:new_end])  # (new_end, r): embedded once per round
            post.fit(X[:0], X.new_zeros(0))  # empty posterior on the current dictionary
            post.update_features(Z[:end], X.new_zeros(end))  # condition on the prefix (σ̃² ignores y)
            _, rls = post.score_embedded(Z, emb.kernel_diag(X[:new_end]))  # (new_end,)
            keep = dic.resample(rls.clamp_min(0.0))
            if not bool(keep.any()):
                keep[int(rls.argmax())] = True
            idx = keep.nonzero().squeeze(-1)
            if final:
                return X[idx]
            emb.set_inducing_points(X[idx])
            end = new_end


def _fresh_generator(device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.seed()
    return g


# ---------------------------------------------------------------------- helpers
def _check_train_data(train_X, train_Y) -> None:
    if not isinstance(train_X, Tensor) or train_X.dim() < 2 or not train_X.is_floating_point():
        got = f"{tuple(train_X.shape)} {train_X.dtype}" if isinstance(train_X, Tensor) else type(train_X).__name__
        raise InputDataError(f"train_X: expected a floating tensor of shape (*batch, n, d), got {got}")
    if not isinstance(train_Y, Tensor):
        raise InputDataError(f"train_Y: expected a torch.Tensor of shape (*batch, n, 1), got {type(train_Y).__name__}")
    if train_Y.dim() != train_X.dim() or train_Y.shape[:-1] != train_X.shape[:-1]:
        raise InputDataError(
            f"train_Y: expected shape {(*train_X.shape[:-1], 1)} (explicit output dimension, matching train_X), "
            f"got {tuple(train_Y.shape)}"
        )
    if train_Y.shape[-1] != 1:
        raise InputDataError(
            f"train_Y: expected one output column, shape {(*train_X.shape[:-1], 1)}, got {tuple(train_Y.shape)} "
            "(BKBModel is single-output; use a ModelListGP of BKBModels for several outcomes)"
        )
    if train_Y.dtype != train_X.dtype or train_Y.device != train_X.device:
        raise InputDataError(
            f"train_Y: expected dtype {train_X.dtype} on {train_X.device} (like train_X), got {train_Y.dtype} on {train_Y.device}"
        )
    if train_X.shape[-2] < 1:
        raise InputDataError(f"train_X: expected at least one training point, got shape {tuple(train_X.shape)}")
    check_finite(train_X, "train_X")
    check_finite(train_Y, "train_Y")


def _condition(post: DTCPosterior, X_tf: Tensor, y: Tensor, counts: Tensor | None, batch: torch.Size) -> None:
    """Add observed rows to ``post`` by rank-one updates; ``X_tf`` is embedded once for all fantasies.

    Args:
        X_tf: `(*bx, k, d)`; y: `(*by, k)`; counts: `(*bc, k)` or None; batch: the broadcast batch shape.
    """
    with torch.no_grad():
        Z = post.embedding(X_tf)  # (*bx, k, r): shared by every fantasy sample
    if counts is None:
        counts = torch.ones(X_tf.shape[:-1], dtype=X_tf.dtype, device=X_tf.device)
    post.update_features(Z, y, counts)  # ZtZ/V⁻¹ keep batch (*bx, *old); Zty/weights get the fantasy dims
    d = X_tf.shape[-1]

    def grow(old: Tensor, new: Tensor, tail: tuple) -> Tensor:
        return torch.cat([old.expand(*batch, *old.shape[-len(tail):]), new.expand(*batch, *new.shape[-len(tail):])], dim=-len(tail))

    post.train_X = grow(post.train_X, X_tf, (None, d))  # (*batch, n + k, d)
    post.train_y = grow(post.train_y, y, (None,))
    post.train_counts = grow(post.train_counts, counts.to(post.train_counts), (None,))
    post.pending_X = post.pending_X.expand(*batch, *post.pending_X.shape[-2:])
    post.pending_counts = post.pending_counts.expand(*batch, post.pending_counts.shape[-1])


def _shallow_module_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing submodules and tensors, with its own attribute/buffer/module tables."""
    new = copy.copy(module)
    new.__dict__ = dict(module.__dict__)
    for table in ("_parameters", "_buffers", "_modules"):
        new.__dict__[table] = dict(module.__dict__[table])
    return new
