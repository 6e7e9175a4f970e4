"""The DTC posterior as a GPyTorch ``ApproximateGP`` with a closed-form (Titsias-optimal) variational strategy.

For a Gaussian likelihood with noise ``σ²`` and inducing points ``Z``, the variational distribution that
maximizes the collapsed bound (Titsias 2009; 003 Eq. 4-5) is, with ``Σ = K_ZZ + σ⁻² K_ZX K_XZ``::

    q*(u) = N( m(Z) + σ⁻² K_ZZ Σ⁻¹ K_ZX (y - m(X)),   K_ZZ Σ⁻¹ K_ZZ )

and marginalizing ``p(f | u)`` against it gives exactly the DTC posterior::

    mean(x)   = m(x) + σ⁻² k_Z(x)ᵀ Σ⁻¹ K_ZX (y - m(X))
    cov(x,x') = k(x,x') - k_Z(x)ᵀ K_ZZ⁻¹ k_Z(x') + k_Z(x)ᵀ Σ⁻¹ k_Z(x')

:class:`DTCApproximateGP` sets ``q(u)`` to this optimum in closed form -- no variational training -- and
predicts through :class:`torchbkb.DTCPosterior` (the same numbers as BKB). GPyTorch's SGPR
(``InducingPointKernel``) predicts FITC or SoR, not DTC; this class fills that gap. Hyperparameters
(kernel, mean, noise, optionally inducing locations) can be learned by maximizing the collapsed bound
:meth:`DTCApproximateGP.titsias_bound` with any torch optimizer.

Example:
    >>> import torch, gpytorch
    >>> from torchbkb.gpytorch import DTCApproximateGP
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.rand(200, 1, generator=g, dtype=torch.float64)
    >>> y = torch.sin(6 * x[:, 0]) + 0.05 * torch.randn(200, generator=g, dtype=torch.float64)
    >>> model = DTCApproximateGP(x[:15], x, y, noise=0.01)
    >>> model.eval()
    DTCApproximateGP(...)
    >>> pred = model.likelihood(model(torch.linspace(0, 1, 5, dtype=torch.float64)))
    >>> pred.mean.shape, bool((pred.variance > 0.01).all())
    (torch.Size([5]), True)
"""

from __future__ import annotations

import math

import gpytorch
import torch
from gpytorch.constraints import GreaterThan
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from gpytorch.models import ApproximateGP
from gpytorch.variational import _VariationalDistribution, _VariationalStrategy
from linear_operator.operators import LowRankRootLinearOperator, SumLinearOperator
from torch import Tensor

from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.errors import InputDataError, check_finite, check_matrix, check_positive
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.gp.linalg import safe_cholesky
from torchbkb.utils.state_loading import load_state_dict_atomically

__all__ = ["DTCApproximateGP", "DTCVariationalStrategy", "TitsiasVariationalDistribution"]

#: Lower bound of the learnable noise (GPyTorch's default constraint, 1e-4, is too high for DTC work).
MIN_NOISE = 1e-8


class DTCApproximateGP(ApproximateGP):
    """A GPyTorch ``ApproximateGP`` whose predictive distribution is exactly the DTC posterior.

    Args:
        inducing_points: `(m, d)` inducing inputs ``Z`` (or `(m,)` for ``d = 1``).
        train_x: `(n, d)` training inputs (or `(n,)` for ``d = 1``).
        train_y: `(n,)` training targets.
        noise: initial Gaussian noise variance ``σ² > 0`` (``model.likelihood.noise``, learnable).
        covar_module: a GPyTorch kernel; default ``ScaleKernel(RBFKernel())``.
        mean_module: a GPyTorch mean; default ``ConstantMean()``.
        learn_inducing_locations: make ``Z`` a parameter of :meth:`titsias_bound`.

    Attributes:
        covar_module, mean_module, likelihood: as in GPyTorch models.
        variational_strategy: a :class:`DTCVariationalStrategy`; its ``variational_distribution`` is the
            closed-form ``q*(u)``.
        train_inputs, train_targets: `(n, d)`, `(n,)` buffers.

    Predictions (``model(x)`` for `(*batch, q, d)` ``x``) are recomputed from the current hyperparameters at
    each call (``O(n m² + m³)``). Learn the hyperparameters with :meth:`titsias_bound`, or with GPyTorch's
    ``VariationalELBO`` in training mode, which has the same value and gradients (``q*(u)`` is held at its
    optimum, see :meth:`DTCVariationalStrategy.kl_divergence`). For many repeated predictions build the
    posterior once with :meth:`dtc_posterior`.

    Example:
        >>> import torch
        >>> x = torch.rand(100, 2, dtype=torch.float64); y = x.sum(-1).sin()
        >>> model = DTCApproximateGP(x[:10], x, y, noise=0.1)
        >>> opt = torch.optim.Adam(model.parameters(), lr=0.05)
        >>> start = model.titsias_bound().item()
        >>> for _ in range(20):
        ...     opt.zero_grad(); loss = -model.titsias_bound(); loss.backward(); opt.step()
        >>> model.titsias_bound().item() > start
        True
    """

    def __init__(
        self,
        inducing_points: Tensor,
        train_x: Tensor,
        train_y: Tensor,
        noise: float = 0.01,
        covar_module: gpytorch.kernels.Kernel | None = None,
        mean_module: gpytorch.means.Mean | None = None,
        learn_inducing_locations: bool = False,
    ) -> None:
        train_x, train_y = _check_data(train_x, train_y)
        Z = _as_matrix(inducing_points, "inducing_points")
        check_matrix(Z, "inducing_points", d=train_x.shape[-1], min_rows=1)
        if Z.dim() != 2:
            raise InputDataError(f"inducing_points: expected shape (m, d), got {tuple(Z.shape)}")
        if Z.dtype != train_x.dtype or Z.device != train_x.device:
            raise InputDataError(f"inducing_points: expected dtype {train_x.dtype} on {train_x.device}, got {Z.dtype} "
                                 f"on {Z.device}")
        noise = check_positive(noise, "noise")
        if noise <= MIN_NOISE:
            raise InputDataError(f"noise: expected a value > {MIN_NOISE}, got {noise!r}")
        strategy = DTCVariationalStrategy(self, Z, learn_inducing_locations=learn_inducing_locations)
        super().__init__(strategy)
        self.covar_module = covar_module if covar_module is not None else ScaleKernel(RBFKernel())
        self.mean_module = mean_module if mean_module is not None else ConstantMean()
        self.likelihood = GaussianLikelihood(noise_constraint=GreaterThan(MIN_NOISE))
        self.register_buffer("train_inputs_", train_x)
        self.register_buffer("train_targets", train_y)
        self.to(train_x)
        self.likelihood.noise = torch.tensor(noise, dtype=train_x.dtype, device=train_x.device)

    # ------------------------------------------------------------------ data
    @property
    def train_inputs(self) -> tuple[Tensor]:
        """``(train_x,)`` as in GPyTorch's ``ExactGP``."""
        return (self.train_inputs_,)

    def set_train_data(self, inputs: Tensor, targets: Tensor) -> None:
        """Replace the training data (the closed-form ``q*(u)`` follows automatically)."""
        x, y = _check_data(inputs, targets, d=self.train_inputs_.shape[-1], ref=self.train_inputs_)
        self.train_inputs_ = x
        self.train_targets = y

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``, all entries or none: a bad state dict raises
        :class:`~torchbkb.errors.InputDataError` and changes nothing."""
        return load_state_dict_atomically(self, torch.nn.Module.load_state_dict, state_dict, strict, assign=assign)

    # ------------------------------------------------------------------ GPyTorch API
    def forward(self, x: Tensor) -> MultivariateNormal:
        """The GP prior ``N(m(x), K(x, x))`` (GPyTorch convention)."""
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def dtc_posterior(self) -> DTCPosterior:
        """The :class:`torchbkb.DTCPosterior` of the current hyperparameters on the residuals ``y - m(X)``
        (no gradient to hyperparameters)."""
        with torch.no_grad():
            Z = self.variational_strategy.inducing_points.detach()
            emb = NystromEmbedding(self.covar_module, Z)
            X, y = self.train_inputs_, self.train_targets
            resid = y - self.mean_module(X)
            return DTCPosterior(emb, noise=float(self.likelihood.noise)).fit(X, resid)

    def titsias_bound(self) -> Tensor:
        """The collapsed variational bound (Titsias 2009), differentiable in every hyperparameter::

            F = log N(y | m(X), Q_XX + σ² I) - tr(K_XX - Q_XX) / (2σ²),   Q_XX = K_XZ K_ZZ⁻¹ K_ZX

        Returns:
            `()` tensor; maximize it (``loss = -model.titsias_bound()``).
        """
        t = self.variational_strategy._collapsed_terms()
        n = t["r"].shape[-1]
        s2 = t["noise"]
        logdet = 2.0 * torch.log(torch.diagonal(t["LB"])).sum()
        fit = -0.5 * (t["r"] * t["r"]).sum() / s2 + 0.5 * (t["c"] * t["c"]).sum()
        trace = (t["kdiag"].sum() - s2 * (t["A"] * t["A"]).sum()) / (2.0 * s2)
        bound = -0.5 * n * math.log(2 * math.pi) - 0.5 * logdet - 0.5 * n * torch.log(s2) + fit - trace
        return bound.to(self.train_inputs_.dtype)


class TitsiasVariationalDistribution(_VariationalDistribution):
    """``q*(u)`` in closed form; it has no free parameters (it is recomputed from the data and the
    current hyperparameters each time it is read).

    Example:
        >>> import torch
        >>> x = torch.rand(50, 1, dtype=torch.float64); y = torch.sin(6 * x[:, 0])
        >>> model = DTCApproximateGP(x[:8], x, y, noise=0.01)
        >>> q = model.variational_strategy._variational_distribution()     # N(m*, S*) over the 8 inducing values
        >>> q.mean.shape, q.covariance_matrix.shape
        (torch.Size([8]), torch.Size([8, 8]))
    """

    def __init__(self, strategy: DTCVariationalStrategy, num_inducing_points: int):
        super().__init__(num_inducing_points=num_inducing_points)
        object.__setattr__(self, "_strategy", strategy)  # back-reference, not a submodule

    def forward(self) -> MultivariateNormal:
        return self._strategy._optimal_q_u()

    def initialize_variational_distribution(self, prior_dist: MultivariateNormal) -> None:
        """Nothing to initialize: the distribution is the closed-form optimum."""


class DTCVariationalStrategy(_VariationalStrategy):
    """Variational strategy with ``q(u)`` fixed to the Titsias optimum; predictive = DTC posterior.

    Args:
        model: the :class:`DTCApproximateGP` (it provides the data, kernel, mean and likelihood).
        inducing_points: `(m, d)`.
        learn_inducing_locations: register ``inducing_points`` as a parameter.

    Example:
        >>> import torch
        >>> x = torch.rand(50, 1, dtype=torch.float64); y = torch.sin(6 * x[:, 0])
        >>> model = DTCApproximateGP(x[:8], x, y, noise=0.01)
        >>> strategy = model.variational_strategy
        >>> prior, post = strategy(x[:3], prior=True), strategy(x[:3])      # p(f) and the DTC q(f)
        >>> bool((post.variance < prior.variance).all())
        True
    """

    def __init__(self, model: DTCApproximateGP, inducing_points: Tensor, learn_inducing_locations: bool = False):
        dist = TitsiasVariationalDistribution(self, inducing_points.shape[-2])
        super().__init__(model, inducing_points, dist, learn_inducing_locations=learn_inducing_locations)
        self.variational_params_initialized.fill_(1)

    @property
    def prior_distribution(self) -> MultivariateNormal:
        """``p(u) = N(m(Z), K_ZZ)``."""
        Z = self.inducing_points
        return MultivariateNormal(self.model.mean_module(Z), self.model.covar_module(Z))

    @property
    def variational_distribution(self) -> MultivariateNormal:
        """The closed-form ``q*(u)`` (recomputed, never cached)."""
        return self._optimal_q_u()

    def __call__(self, x: Tensor, prior: bool = False, **kwargs) -> MultivariateNormal:
        if prior:
            return self.model.forward(x)
        return self.forward(x)

    def forward(self, x: Tensor, *args, **kwargs) -> MultivariateNormal:
        """DTC predictive distribution at `(*batch, q, d)` ``x``: mean `(*batch, q)`, covariance
        ``K_xx - Z_x Z_xᵀ + σ² Z_x V⁻¹ Z_xᵀ`` as a lazy `(*batch, q, q)` operator (cheap diagonal).

        In training mode the same distribution is built from :meth:`optimal_whitened_q` held fixed, so that
        GPyTorch's ``VariationalELBO`` has the value *and* the hyperparameter gradients of the collapsed bound.
        """
        if self.training:
            check_finite(x.detach(), "x")
            return self._whitened_predictive(x)
        model = self.model
        post = model.dtc_posterior()
        post.embedding.check_input(x, "x")
        Zx = post.embedding(x)  # (*b, q, r): differentiable w.r.t. x
        dt = Zx.dtype
        with torch.no_grad():
            root = safe_cholesky(post.lam * post.V_inv, name="σ² V⁻¹").to(dt)  # (r, r)
        mean = model.mean_module(x) + (Zx @ post.weights.to(dt).unsqueeze(-1)).squeeze(-1)
        Kxx = model.covar_module(x)  # lazy (*b, q, q)
        # no root decomposition of Kxx
        covar = SumLinearOperator(Kxx, LowRankRootLinearOperator(Zx @ root), LowRankRootLinearOperator(Zx).mul(-1.0))
        return MultivariateNormal(mean, covar)

    def kl_divergence(self) -> Tensor:
        """``KL(q*(u) ‖ p(u))`` computed in whitened coordinates with ``q*`` held fixed (no gradient).

        With ``u = m(Z) + L w`` (``L Lᵀ = K_ZZ``), ``p(w) = N(0, I)`` does not depend on the hyperparameters and
        ``q*(w) = N(μ_w, B⁻¹)`` is the optimum, so by the envelope theorem the ELBO's gradient is the collapsed
        bound's when ``q*`` is held fixed (:meth:`forward` in training mode does the same).
        """
        mu, LB = self.optimal_whitened_q()
        m = mu.shape[-1]
        eye = torch.eye(m, dtype=LB.dtype, device=LB.device)
        LB_inv = torch.linalg.solve_triangular(LB, eye, upper=False)
        trace = (LB_inv * LB_inv).sum()  # tr(B⁻¹)
        logdet = -2.0 * torch.log(torch.diagonal(LB)).sum()  # log det B⁻¹
        kl = 0.5 * (trace + (mu * mu).sum() - m - logdet)
        return kl.to(self.inducing_points.dtype)

    def optimal_whitened_q(self) -> tuple[Tensor, Tensor]:
        """``(μ_w, L_B)`` of the optimal ``q*(w) = N(μ_w, B⁻¹)``, ``B = L_B L_Bᵀ``, detached (compute dtype)."""
        with torch.no_grad():
            t = self._collapsed_terms()
            mu = torch.linalg.solve_triangular(t["LB"].transpose(-1, -2), t["c"].unsqueeze(-1), upper=True).squeeze(-1)
        return mu, t["LB"]

    def _whitened_predictive(self, x: Tensor) -> MultivariateNormal:
        """``f(x) = m(x) + a(x)ᵀ w`` with ``a = L⁻¹ k_Z(x)`` differentiable and ``w ~ q*(w)`` fixed."""
        model = self.model
        mu, LB = self.optimal_whitened_q()
        Z = self.inducing_points
        L = safe_cholesky(model.covar_module(Z).to_dense(), name="K_ZZ")  # (m, m), with gradients
        dt = L.dtype
        Kzx = model.covar_module(Z, x).to_dense().to(dt)  # (*b, m, q)
        a = torch.linalg.solve_triangular(L, Kzx, upper=False)  # (*b, m, q)
        root = torch.linalg.solve_triangular(LB.transpose(-1, -2), torch.eye(LB.shape[-1], dtype=dt, device=LB.device),
                                             upper=True)
        at = a.transpose(-1, -2).to(x.dtype)  # (*b, q, m)
        mean = model.mean_module(x) + (at @ mu.to(x.dtype).unsqueeze(-1)).squeeze(-1)
        covar = SumLinearOperator(model.covar_module(x), LowRankRootLinearOperator(at @ root.to(x.dtype)),
                                  LowRankRootLinearOperator(at).mul(-1.0))
        return MultivariateNormal(mean, covar)

    # ------------------------------------------------------------------ closed-form pieces
    def _collapsed_terms(self) -> dict:
        """Differentiable pieces shared by the bound and ``q*(u)`` (float64 for small ``m``).

        ``L Lᵀ = K_ZZ``, ``A = L⁻¹ K_ZX / σ`` `(m, n)`, ``B = I + A Aᵀ = L_B L_Bᵀ``, ``r = y - m(X)``,
        ``c = L_B⁻¹ A r / σ``.
        """
        model = self.model
        X, y = model.train_inputs_, model.train_targets
        Z = self.inducing_points
        L = safe_cholesky(model.covar_module(Z).to_dense(), name="K_ZZ")  # (m, m) compute dtype
        dt = L.dtype
        s2 = model.likelihood.noise.reshape(()).to(dt)
        s = s2.sqrt()
        Kzx = model.covar_module(Z, X).to_dense().to(dt)  # (m, n)
        A = torch.linalg.solve_triangular(L, Kzx, upper=False) / s
        m = A.shape[0]
        B = torch.eye(m, dtype=dt, device=A.device) + A @ A.transpose(-1, -2)
        LB = safe_cholesky(B, name="I + A Aᵀ")
        r = (y - model.mean_module(X)).to(dt)  # (n,)
        Ar = A @ r  # (m,)
        c = torch.linalg.solve_triangular(LB, Ar.unsqueeze(-1), upper=False).squeeze(-1) / s
        kdiag = model.covar_module(X, diag=True).to(dt)
        return {"L": L, "A": A, "LB": LB, "r": r, "c": c, "noise": s2, "kdiag": kdiag, "Ar": Ar, "sigma": s}

    def _optimal_q_u(self) -> MultivariateNormal:
        """``q*(u) = N(m(Z) + L B⁻¹ A r / σ, L B⁻¹ Lᵀ)``."""
        t = self._collapsed_terms()
        L, LB = t["L"], t["LB"]
        W = torch.linalg.solve_triangular(LB, L.transpose(-1, -2), upper=False)  # L_B⁻¹ Lᵀ, (m, m)
        S = W.transpose(-1, -2) @ W  # L B⁻¹ Lᵀ
        mean = L @ torch.cholesky_solve(t["Ar"].unsqueeze(-1), LB).squeeze(-1) / t["sigma"]
        Z = self.inducing_points
        dt = Z.dtype
        mean = self.model.mean_module(Z) + mean.to(dt)
        return MultivariateNormal(mean, (0.5 * (S + S.transpose(-1, -2))).to(dt))


# ---------------------------------------------------------------------- helpers
def _as_matrix(t, name: str) -> Tensor:
    if isinstance(t, Tensor) and t.dim() == 1:
        return t.unsqueeze(-1)  # (n,) -> (n, 1)
    if not isinstance(t, Tensor):
        raise InputDataError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def _check_data(x, y, d: int | None = None, ref: Tensor | None = None) -> tuple[Tensor, Tensor]:
    x = _as_matrix(x, "train_x")
    check_matrix(x, "train_x", d=d, min_rows=1)
    if x.dim() != 2:
        raise InputDataError(f"train_x: expected shape (n, d), got {tuple(x.shape)}")
    if ref is not None and (x.dtype != ref.dtype or x.device != ref.device):
        raise InputDataError(f"train_x: expected dtype {ref.dtype} on {ref.device}, got {x.dtype} on {x.device}")
    if not isinstance(y, Tensor) or y.shape != x.shape[:-1]:
        got = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
        raise InputDataError(f"train_y: expected shape ({x.shape[0]},), got {got}")
    if y.dtype != x.dtype or y.device != x.device:
        raise InputDataError(f"train_y: expected dtype {x.dtype} on {x.device}, got {y.dtype} on {y.device}")
    check_finite(y, "train_y")
    return x.detach(), y.detach()
