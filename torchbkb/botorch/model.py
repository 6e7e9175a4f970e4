"""BKB as a BoTorch ``Model``: the DTC posterior on a variance-sampled dictionary, with learned hyperparameters.

:class:`BKBModel` replaces ``botorch.models.SingleTaskGP`` in a BoTorch loop, with its constructor arguments:
``posterior(X)`` has the DTC mean and **joint** covariance (GP scale, 003 Eq. 4), differentiable in ``X``;
``model(X)`` is the prior in training mode and the posterior in eval mode, as for an ``ExactGP``;
``condition_on_observations`` (hence ``fantasize``) adds points without refitting, differentiably; transforms,
known noise (``train_Yvar``) and batched training data (one set of hyperparameters per batch, exact GP) work as
in BoTorch. The dictionary is drawn by BKB's variance sampling (:func:`sample_dictionary`, 000 Algorithm 1) or
given; when it holds at least ``exact_fraction`` of the points the exact GP is computed (:mod:`.engine`). The
hyperparameters are ``SingleTaskGP``'s (:func:`~torchbkb.botorch.defaults.hyperparameter_modules`), learned at
``O(n·m²)`` by ``fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))`` (:mod:`.fitting`) or
copied from a fitted GP (:meth:`BKBModel.from_model`). The posterior is never stale, and threads, pickles and
state dicts are safe (:mod:`.model_lifecycle`). ``state_dict()`` holds hyperparameters and transforms, never data.

Example:
    >>> import torch
    >>> from botorch.acquisition import UpperConfidenceBound
    >>> from botorch.optim import optimize_acqf_discrete
    >>> X = torch.rand(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> model = BKBModel(X, torch.sin(6 * X[:, :1]) + X[:, 1:], seed=0)
    >>> cand, _ = optimize_acqf_discrete(UpperConfidenceBound(model, beta=4.0), q=1, choices=X)
    >>> cand.shape
    torch.Size([1, 2])
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.models.model import FantasizeMixin, Model
from botorch.models.transforms.outcome import Standardize
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.utils.types import DEFAULT
from gpytorch.distributions import MultivariateNormal
from gpytorch.models import GP  # GPyTorch's MLLs take a GP
from linear_operator import to_linear_operator
from torch import Tensor, nn

from torchbkb.botorch.defaults import DEFAULT_LENGTHSCALE, DEFAULT_NOISE, DEFAULT_OUTPUTSCALE, EXACT_FRACTION, MIN_YVAR
from torchbkb.botorch.defaults import default_kernel, hyperparameter_modules
from torchbkb.sampling.dictionary_replay import sample_dictionary
from torchbkb.botorch.engine import ModelEngine
from torchbkb.botorch.fitting import fit_rounds
from torchbkb.botorch.from_model import gp_parts, transform_inducing_points
from torchbkb.botorch.model_data import ModelData
from torchbkb.botorch.model_lifecycle import ModelLifecycle
from torchbkb.botorch.training_data import as_query, check_model_inputs, check_observation_noise, check_observations
from torchbkb.botorch.training_data import check_query
from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.errors import InputDataError, check_positive
from torchbkb.sampling.rls_dictionary import DEFAULT_INCLUSION, check_inclusion

__all__ = ["BKBModel", "sample_dictionary", "default_kernel", "DEFAULT_LENGTHSCALE", "DEFAULT_OUTPUTSCALE",
           "DEFAULT_NOISE", "EXACT_FRACTION", "MIN_YVAR"]


class BKBModel(ModelLifecycle, Model, FantasizeMixin, GP):
    """BKB's DTC posterior on a posterior-variance-sampled dictionary as a BoTorch model, ``SingleTaskGP``'s drop-in.

    ``posterior(X).variance`` is the GP-scale ``λ·σ̃²``; :meth:`rls` is the papers' ``σ̃²``. A BKB UCB
    ``μ̃ + β̃σ̃`` is BoTorch's ``UpperConfidenceBound(beta=β̃²/λ)``
    (:class:`~torchbkb.botorch.BKBUpperConfidenceBound`).

    Args:
        train_X: `(*batch, n, d)` training inputs (BoTorch recommends the unit cube, or pass
            ``input_transform=Normalize(d)``), ``d >= 1``.
        train_Y: `(*batch, n, 1)` training outcomes (single output).
        train_Yvar: optional `(*batch, n, 1)` known noise variances of ``train_Y`` (heteroskedastic; values
            below :data:`MIN_YVAR` after the outcome transform count as :data:`MIN_YVAR`). Then ``λ`` is their
            mean and each point weighs ``λ / noise_i``.
        kernel: a ``gpytorch.kernels.Kernel`` (or a callable ``(X1, X2) -> Tensor``) on the *transformed*
            inputs, used as given (its parameters are learned by the fit); default ``SingleTaskGP``'s RBF kernel
            with a dimension-scaled lognormal lengthscale prior. ``covar_module`` is BoTorch's name for it.
        noise: a fixed ``λ > 0``, the noise variance of the *transformed* outcomes (not learned; not with
            ``train_Yvar`` or ``likelihood``); default: learned, with ``SingleTaskGP``'s lognormal prior.
        q_bar, inclusion: oversampling ``q̄`` and inclusion rule of the dictionary sampling
            (:func:`sample_dictionary`).
        inducing_points: `(m, d)` dictionary in the space of ``train_X`` (the input transform is applied);
            if given, no sampling takes place.
        seed: seed of the dictionary sampling (``None``: fresh randomness).
        input_transform: a BoTorch ``InputTransform``, applied as in ``SingleTaskGP``.
        outcome_transform: a BoTorch ``OutcomeTransform``; by default ``Standardize(m=1)`` as in
            ``SingleTaskGP``; ``None`` for none.
        exact_fraction: the exact GP when the dictionary holds this fraction of the points (default
            :data:`EXACT_FRACTION`) or there are at most :func:`~torchbkb.botorch.defaults.exact_below`; ``None``: DTC.
        likelihood: a ``gpytorch.likelihoods.GaussianLikelihood`` (e.g. with a noise constraint, as TuRBO's
            tutorial builds it), used as given; not with ``noise`` or ``train_Yvar``.
        mean_module: a ``ConstantMean`` or ``ZeroMean`` (the posterior's prior mean is a constant).

    Attributes:
        covar_module: the kernel; likelihood: ``GaussianLikelihood`` (``FixedNoiseGaussianLikelihood`` with
            ``train_Yvar``); mean_module: ``ConstantMean`` -- the hyperparameters, as in ``SingleTaskGP``.
        engine: the :class:`~torchbkb.botorch.engine.ModelEngine` the posterior is computed with.

    Example:
        >>> import torch
        >>> from torchbkb.botorch import BKBModel
        >>> X = torch.rand(200, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        >>> Y = (X - 0.5).pow(2).sum(-1, keepdim=True)
        >>> model = BKBModel(X, Y, seed=0)
        >>> model.num_inducing <= 200, model.num_outputs, model.batch_shape
        (True, 1, torch.Size([]))
        >>> fantasy = model.condition_on_observations(X[:2] + 0.01, Y[:2])   # no refit
        >>> fantasy.train_inputs[0].shape
        torch.Size([202, 3])
    """

    _num_outputs = 1

    def __init__(self, train_X: Tensor, train_Y: Tensor, train_Yvar: Tensor | None = None,
                 kernel: Callable | None = None, noise: float | None = None, q_bar: float = 2.0,
                 inducing_points: Tensor | None = None, seed: int | None = None,
                 input_transform: nn.Module | None = None, outcome_transform: nn.Module | None = DEFAULT,
                 exact_fraction: float | None = EXACT_FRACTION, covar_module: Callable | None = None,
                 inclusion: str = DEFAULT_INCLUSION, likelihood=None, mean_module=None) -> None:
        super().__init__()
        kernel = check_model_inputs(train_X, train_Y, train_Yvar, noise, kernel, covar_module, likelihood, mean_module)
        if noise is not None:
            check_positive(noise, "noise")
        batch = train_X.shape[:-2]
        if outcome_transform is DEFAULT:
            outcome_transform = Standardize(m=1, batch_shape=batch)
        with torch.no_grad():
            X_tf = self.transform_inputs(train_X, input_transform=input_transform)  # learns Normalize bounds
        Y_tf, Yvar_tf = train_Y, train_Yvar
        if outcome_transform is not None:
            outcome_transform.train()
            Y_tf, Yvar_tf = outcome_transform(train_Y, Yvar=train_Yvar, X=X_tf)
        S_tf = None
        if inducing_points is not None:
            S_tf = transform_inducing_points(inducing_points, train_X, input_transform)
        noise_tf = None if Yvar_tf is None else Yvar_tf.detach().squeeze(-1).clamp_min(MIN_YVAR)
        modules = hyperparameter_modules(X_tf.shape[-1], noise_tf, noise, kernel, X_tf, batch, likelihood, mean_module)
        self._setup(*modules, X_tf=X_tf.detach(), y_tf=Y_tf.detach().squeeze(-1), noise_tf=noise_tf, q_bar=q_bar,
                    inclusion=inclusion, inducing_points=S_tf, seed=seed, input_dim=train_X.shape[-1],
                    exact_fraction=exact_fraction, transforms=(input_transform, outcome_transform))
        self.eval()

    @classmethod
    def from_model(cls, gp: Model, q_bar: float = 2.0, inducing_points: Tensor | None = None, seed: int | None = None,
                   exact_fraction: float | None = EXACT_FRACTION, inclusion: str = DEFAULT_INCLUSION) -> BKBModel:
        """A BKBModel from a fitted single-output ``SingleTaskGP`` (or any single-output ``ExactGP`` with a
        homoskedastic ``GaussianLikelihood`` and a constant or zero mean) with copies of its modules, data and
        transforms (:func:`~torchbkb.botorch.from_model.gp_parts`): with a complete dictionary it is ``gp``'s posterior.

        Example:
            >>> import torch
            >>> from botorch.models import SingleTaskGP
            >>> X = torch.rand(30, 2, dtype=torch.float64); Y = X.sum(-1, keepdim=True)
            >>> gp = SingleTaskGP(X, Y)                               # (hyperparameters normally fitted)
            >>> bkb, Xq = BKBModel.from_model(gp, inducing_points=X), torch.rand(4, 1, 2, dtype=torch.float64)
            >>> bool(torch.allclose(bkb.posterior(Xq).variance, gp.posterior(Xq).variance))
            True
        """
        parts = gp_parts(gp, inducing_points)
        it, ot = parts.pop("input_transform"), parts.pop("outcome_transform")
        model = cls.__new__(cls)
        GP.__init__(model)  # the modules' state (torch's and GPyTorch's), without __init__'s data
        model._setup(parts.pop("kernel"), parts.pop("likelihood"), parts.pop("mean_module"), **parts, noise_tf=None,
                     q_bar=q_bar, inclusion=inclusion, seed=seed, exact_fraction=exact_fraction, transforms=(it, ot))
        return model.eval()

    def _setup(self, kernel, likelihood, mean_module, *, X_tf, y_tf, noise_tf, q_bar, inclusion, inducing_points, seed,
               input_dim, exact_fraction, transforms) -> None:
        self._init_lifecycle()
        self.q_bar, self.inclusion = check_positive(q_bar, "q_bar"), check_inclusion(inclusion)
        if exact_fraction is not None and not 0.0 < float(exact_fraction) <= 1.0:
            raise InputDataError(f"exact_fraction: expected a number in (0, 1] or None, got {exact_fraction!r}")
        self.exact_fraction = None if exact_fraction is None else float(exact_fraction)
        self.seed = None if seed is None else int(seed)
        self._input_dim = int(input_dim)
        self._hyper_batch = X_tf.shape[:-2]  # one set of hyperparameters per batch of the training data
        self.covar_module = kernel.to(X_tf) if isinstance(kernel, nn.Module) else kernel
        self.likelihood = likelihood.to(X_tf)
        self.mean_module = mean_module.to(X_tf)
        self._data = ModelData(X_tf, y_tf, noise_tf)  # every observation; moved by .to(), never in state_dict
        self.register_buffer("_given_dictionary", inducing_points, persistent=False)
        self._engine = self._snapshot = None  # built on first use, and again whenever a hyperparameter changed
        for name, transform in zip(("input_transform", "outcome_transform"), transforms):
            if transform is not None:
                setattr(self, name, transform)

    # ------------------------------------------------------------------ the posterior
    def _build(self, values: Tensor | None) -> None:
        kernel = self.covar_module
        if isinstance(kernel, nn.Module):  # a frozen copy: later changes to the kernel never corrupt this posterior
            kernel = copy.deepcopy(kernel).requires_grad_(False)
        engine = ModelEngine.from_data(self._data, kernel, self._default_noise(), self._mean_offset(),
                                       self._given_dictionary, q_bar=self.q_bar, seed=self.seed,
                                       exact_fraction=self.exact_fraction, inclusion=self.inclusion,
                                       batched=bool(self._hyper_batch))
        self._engine, self._snapshot = engine, values

    def _default_noise(self) -> Tensor:
        """The noise variance of a point observed without one: the mean known noise (``train_Yvar``), else the
        likelihood's, `()` or `(*hyper_batch, 1)` (detached)."""
        base = self._data.blocks[0].noise
        if base is not None:
            return base.mean()
        noise = self.likelihood.noise.detach()
        return noise if self._hyper_batch else noise.reshape(-1)[0]

    def _mean_offset(self) -> Tensor:
        """`(*hyper_batch)` the constant prior mean of the transformed outcomes (detached)."""
        with torch.no_grad():
            X1 = self._data.blocks[0].X[..., :1, :]
            return self.mean_module(X1).detach()[..., 0].clone()

    def custom_fit(self, mll, closure=None, optimizer=None, closure_kwargs=None, optimizer_kwargs=None, **kwargs):
        """BoTorch's hook in ``fit_gpytorch_mll``: fit with a :class:`~torchbkb.botorch.DTCMarginalLogLikelihood`
        in rounds (:func:`~torchbkb.botorch.fitting.fit_rounds`); returns ``mll``, in eval mode."""
        return fit_rounds(self, mll, closure=closure, optimizer=optimizer, closure_kwargs=closure_kwargs,
                          optimizer_kwargs=optimizer_kwargs, **kwargs)

    # ------------------------------------------------------------------ BoTorch Model API
    @property
    def num_outputs(self) -> int:
        """Always 1."""
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        """Batch shape of the training data (grows with ``fantasize``)."""
        return self._data.batch_shape

    @property
    def noise(self) -> float:
        """``λ`` of the posterior: the noise variance of the transformed outcomes (the mean known noise with
        ``train_Yvar``)."""
        return self.engine.lam

    @property
    def mean_constant(self) -> Tensor:
        """`(*hyper_batch)` the constant prior mean of the transformed outcomes the posterior uses."""
        return self._mean_offset()

    @property
    def train_noise(self) -> Tensor:
        """`(*batch, n)` the noise variance of every observed point (transformed outcomes), current likelihood."""
        return self._data.noise(self._default_noise())

    @property
    def input_dim(self) -> int:
        """``d``, the dimension of the (untransformed) inputs."""
        return self._input_dim

    @property
    def is_exact(self) -> bool:
        """Whether the model computes the exact GP (the dictionary holds at least ``exact_fraction`` of the data)."""
        return self.engine.is_exact

    @property
    def num_inducing(self) -> int:
        """Dictionary size ``m``."""
        return int(self.engine.dictionary.shape[0])

    dictionary_size = num_inducing

    @property
    def inducing_points(self) -> Tensor:
        """`(m, d)` dictionary in the *transformed* input space."""
        return self.engine.dictionary

    @property
    def dtc_posterior(self) -> DTCPosterior:
        """The :class:`~torchbkb.DTCPosterior` on transformed inputs and centered transformed outcomes (built on
        first use when the model computes exactly; BBKB batches and BKB's widths read it)."""
        return self.engine.dtc

    @property
    def train_inputs(self) -> tuple[Tensor]:
        """``(X,)`` with `(*batch, n, d)` transformed training inputs (as ``SingleTaskGP`` in eval mode)."""
        return (self._data.X,)

    @property
    def train_targets(self) -> Tensor:
        """`(*batch, n)` outcome-transformed training targets."""
        return self._data.y

    def subset_output(self, idcs: list[int]) -> BKBModel:
        """Single output: ``idcs`` must be ``[0]``."""
        if list(idcs) != [0]:
            raise InputDataError(f"idcs: expected [0] (BKBModel has one output), got {idcs!r}")
        return self

    def forward(self, X: Tensor) -> MultivariateNormal:
        """``model(X)`` as an ``ExactGP`` answers it: in training mode the prior ``N(m(X), k(X, X))`` of the transformed
        `(*b, n, d)` inputs (what GPyTorch's training loop hands its MLL; the DTC bound does not need it); in eval
        mode the joint posterior of the latent function at `(*b, q, d)` ``X`` taken as *transformed* inputs,
        transformed outcomes (``SingleTaskGP`` in eval mode takes them so)."""
        X = as_query(X, self._input_dim)
        check_query(X, self._input_dim, self._data.blocks[0].X, "X", finite=self.training)
        if self.training:
            X = self.transform_inputs(X)  # a dense k(X, X) (torchbkb's kernels) wrapped: factorized when used
            return MultivariateNormal(self.mean_module(X), to_linear_operator(self.covar_module(X)))
        mean, cov = self.engine_for(X).predict(X)  # X's finiteness read with the hyperparameters' snapshot
        return MultivariateNormal(mean + self.mean_constant.to(mean).unsqueeze(-1), to_linear_operator(cov))

    def posterior(self, X: Tensor, output_indices: list[int] | None = None, observation_noise: bool | Tensor = False,
                  posterior_transform: PosteriorTransform | None = None, **kwargs: Any):
        """Joint DTC posterior over the ``q`` points of each batch of ``X``.

        Args:
            X: `(*batch, q, d)` points in the original input space (`(q,)` when ``d = 1``, as ``SingleTaskGP``);
                gradients flow to ``X``.
            output_indices: ``None`` or ``[0]``.
            observation_noise: ``True`` adds ``λ·I`` (transformed space); a `(*batch, q, 1)` tensor of
                non-negative variances adds that noise (transformed space).
            posterior_transform: an optional BoTorch ``PosteriorTransform``.

        Returns:
            ``GPyTorchPosterior`` with ``mean`` `(*batch', q, 1)`, ``batch' = broadcast(batch, batch_shape)``,
            and a `(*batch', q, q)` covariance (untransformed by the outcome transform).
        """
        if output_indices is not None and list(output_indices) != [0]:
            raise InputDataError(f"output_indices: expected None or [0], got {output_indices!r}")
        X = as_query(X, self._input_dim)
        check_query(X, self._input_dim, self._data.blocks[0].X, "X", batch_shape=self.batch_shape, finite=False)
        check_observation_noise(observation_noise, X)
        engine = self.engine_for(X)  # X's finiteness read with the hyperparameters' snapshot: one host read
        self.eval()
        X_tf = self.transform_inputs(X)
        mean, cov = engine.predict(X_tf, observation_noise)
        mean = mean + self.mean_constant.to(mean).unsqueeze(-1)
        posterior = GPyTorchPosterior(distribution=MultivariateNormal(mean, to_linear_operator(cov)))
        if hasattr(self, "outcome_transform"):
            posterior = self.outcome_transform.untransform_posterior(posterior, X=X_tf)
        if posterior_transform is not None:
            return posterior_transform(posterior, X=X_tf)
        return posterior

    def rls(self, X: Tensor) -> Tensor:
        """The papers' RLS-scale ``σ̃²`` `(*batch', n)` at `(*batch, n, d)` ``X`` (transformed, no noise)."""
        self.eval()
        self.check_query(X, "X")
        engine = self.engine
        return engine.forward(self.transform_inputs(X))[1] / engine.lam

    def condition_on_observations(self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any) -> BKBModel:
        """A new model conditioned on ``(X, Y)`` without refitting (same dictionary), differentiable in ``X``
        and ``Y`` (so fantasy-based acquisitions such as ``qKnowledgeGradient`` have gradients). The new model
        owns copies of the hyperparameter modules; fitting it rebuilds its posterior from all its data and never
        changes this model.

        Args:
            X: `(*batch, n', d)` new inputs (original space).
            Y: `(*batch', n', 1)` new outcomes (original space); ``batch'`` may have more leading dimensions
                than ``batch`` (fantasies), it must broadcast against ``batch`` and the model's batch shape.
            noise: optional `(*batch', n', 1)` observation noise variances, in the outcome-transformed space
                (BoTorch's convention); default ``λ``.

        Returns:
            A new :class:`BKBModel` of batch shape ``broadcast(batch', batch, self.batch_shape)``.
        """
        self.eval()
        self.check_query(X, "X")
        batch = check_observations(X, Y, noise, self.batch_shape)
        X_tf = self.transform_inputs(X)
        Y_tf = Y.to(X_tf)
        if hasattr(self, "outcome_transform"):
            Y_tf, _ = self.outcome_transform(Y_tf, X=X_tf)
        return self._conditioned(X_tf, Y_tf.squeeze(-1), None if noise is None else noise.to(X_tf).squeeze(-1), batch)

    def hallucinate(self, X: Tensor) -> BKBModel:
        """A new model (same dictionary) conditioned on `(n', d)` pending ``X`` with the posterior mean as outcome
        (BBKB / GP-BUCB's hallucinations): the mean is unchanged, the variance shrinks."""
        self.eval()
        self.check_query(X, "X_pending")
        if X.dim() != 2:
            raise InputDataError(f"X_pending: expected shape (n, {self._input_dim}), got {tuple(X.shape)}")
        with self._lock:
            engine = self.engine
            new = self.derived_copy()
            new._snapshot = self._snapshot
        if X.shape[0] > 0:
            X_tf = self.transform_inputs(X).detach().expand(*self.batch_shape, *X.shape)  # (*batch, n', d)
            new._engine = engine.hallucinate(X_tf)
            mean = engine.forward(X_tf)[0] + self.mean_constant.to(X_tf).unsqueeze(-1)
            new._data = self._data.append(X_tf, mean, None, hallucinated=True)
        return new

    def _set_transformed_inputs(self) -> None:
        """No-op: BKBModel always stores transformed training inputs."""

    _revert_to_original_inputs = _set_transformed_inputs

    def check_query(self, X: Tensor, name: str = "X") -> None:
        """Raise :class:`~torchbkb.errors.InputDataError` unless ``X`` is finite `(*batch, q, d)` like the model."""
        check_query(X, self._input_dim, self._data.blocks[0].X, name)
