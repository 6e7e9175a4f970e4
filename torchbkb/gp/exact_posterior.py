"""The exact GP posterior with incremental Cholesky growth -- the reference and GP-UCB's engine.

For pulled points ``X`` (``n`` rows, row ``i`` standing for ``c_i`` pulls with mean reward ``y_i``)::

    K̂ = K_XX + λ C⁻¹ = L Lᵀ,    μ(x) = k_X(x)ᵀ K̂⁻¹ y,    var(x) = k(x, x) - ‖L⁻¹ k_X(x)‖²

(GP scale; ``rls = var / λ`` is the papers' ``σ²``). The state -- ``X``, ``L``, ``L⁻¹ y``, the noise ``λ/c_i`` --
is an :class:`~torchbkb.gp.exact_gp_state.ExactGPState` (:attr:`ExactPosterior.state`), the one object that holds
an exact GP's state for the bandits and for BoTorch's :class:`~torchbkb.botorch.BKBModel`; this class adds the pull
counts and the watched arms. :meth:`ExactPosterior.update` appends rows to ``L`` in ``O(n²)`` each, never
refactorizing. :meth:`ExactPosterior.watch` keeps the mean and variance of a fixed point set (GP-UCB's arms) current
by rank-one updates of ``Q = L⁻¹ K_{X,A}`` -- ``O(A·n)`` per new point instead of a refit.

Example:
    >>> import torch
    >>> from torchbkb import ExactPosterior
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(10, 2, dtype=torch.float64); y = X.sum(-1)
    >>> post = ExactPosterior(GaussianKernel(0.5), noise=0.01).fit(X[:6], y[:6])
    >>> arms = torch.rand(50, 2, dtype=torch.float64)
    >>> post.watch(arms)
    >>> post.update(X[6:], y[6:])                       # Cholesky growth, watched set updated too
    >>> ref = ExactPosterior(GaussianKernel(0.5), noise=0.01).fit(X, y)
    >>> all(torch.allclose(a, b) for a, b in zip(post.watched(), ref(arms)))
    True
"""

from __future__ import annotations

import torch
from torch import nn

from torchbkb.errors import (
    InputDataError, NumericsError, check_finite, check_matrix, check_positive, check_same_device_dtype,
    nonfinite_values_error,
)
from torchbkb.gp.exact_gp_state import ExactGPState
from torchbkb.gp.kernels import as_kernel
from torchbkb.gp.observations import check_targets, check_values
from torchbkb.gp.linalg import compute_dtype
from torchbkb.utils.host_copy import cached_float

__all__ = ["ExactPosterior"]


class ExactPosterior(nn.Module):
    """Exact zero-mean GP posterior with noise ``λ``, grown one row at a time.

    Training data are unbatched `(n, d)`; queries may carry batch dimensions `(*b, q, d)`.

    Args:
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> post = ExactPosterior(GaussianKernel(1.0), noise=0.1)
        >>> post.fit(torch.zeros(1, 1), torch.ones(1)).mean(torch.zeros(1, 1))   # 1 / (1 + 0.1)
        tensor([0.9091])
    """

    def __init__(self, kernel, noise: float):
        super().__init__()
        self.kernel = as_kernel(kernel)
        self.register_buffer("noise", torch.tensor(check_positive(noise, "noise"), dtype=torch.float64))
        self.__dict__["state"] = None  # the ExactGPState (not a submodule: no entries of its own in state_dict)
        self._C = None  # (cap,) pull count of each row, compute dtype
        self._watch = None  # dict: X (A, d), Q (cap, A), mean (A,), var (A,)

    # ------------------------------------------------------------------ properties
    @property
    def lam(self) -> float:
        """``λ`` as a Python float, read from the device once per value of :attr:`noise` (a new tensor or an
        in-place write reads it again)."""
        return cached_float(self, self.noise, "_lam_cache")

    @property
    def num_train(self) -> int:
        """Number of rows ``n`` (observed and hallucinated)."""
        return 0 if self.state is None else self.state.num_train

    @property
    def train_X(self) -> torch.Tensor:
        """`(n, d)` the rows conditioned on."""
        self._require_fit()
        return self.state.train_X

    @property
    def L(self) -> torch.Tensor:
        """`(n, n)` lower Cholesky factor of ``K_XX + λ C⁻¹`` (compute dtype)."""
        self._require_fit()
        return self.state.factor

    @property
    def Liy(self) -> torch.Tensor:
        """`(n,)` ``L⁻¹ y`` (hallucinated rows contribute 0)."""
        self._require_fit()
        return self.state.whitened_targets

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        if self.state is not None:
            self.state._apply(fn)
            self._C = fn(self._C)
            if self._watch is not None:
                self._watch = {k: fn(v) if v.is_floating_point() else v for k, v in self._watch.items()}
        return out

    # ------------------------------------------------------------------ fitting
    def fit(self, X: torch.Tensor, y: torch.Tensor, counts: torch.Tensor | None = None) -> ExactPosterior:
        """Condition on ``(X, y)`` from scratch (one ``n × n`` Cholesky).

        Args:
            X: `(n, d)`.
            y: `(n,)`, with ``counts`` the mean reward of each row.
            counts: `(n,)` positive pull counts; default ones.

        Returns:
            ``self``.
        """
        X, y, counts = self._check(X, y, counts, "X", "y", fitting=True)
        n = X.shape[0]
        dtype = compute_dtype(X.dtype, max(n, 1))
        state = ExactGPState(self.kernel, X, y.to(dtype), self.lam / counts.to(dtype))
        self._C = X.new_zeros((max(16, n * 2),), dtype=dtype)  # pull count of each row
        self._C[:n] = counts.to(dtype)
        self.__dict__["state"], self._watch = state, None
        return self

    def watch(self, X: torch.Tensor) -> None:
        """Track the posterior mean and variance of the fixed points ``X`` through every later update.

        Costs one ``O(A·n²)`` solve now and ``O(A·n)`` memory; each added row then costs ``O(A·n)``.

        Args:
            X: `(A, d)` points to watch (e.g. a bandit's arms).

        Raises:
            NumericsError: NaN/inf kernel values (``nonfinite``; what was watched before stays watched).
        """
        self._require_fit()
        check_matrix(X, "X", d=self.train_X.shape[-1])
        if X.dim() != 2:
            raise InputDataError(f"X: expected shape (A, d), got {tuple(X.shape)}")
        check_same_device_dtype(self.train_X, X, "X", "the training data")
        dtype, n, cap = self.L.dtype, self.num_train, self._C.shape[0]
        Q = X.new_zeros((cap, X.shape[0]), dtype=dtype)  # rows of L⁻¹ K_{X_train, A}
        if n:
            Q[:n] = torch.linalg.solve_triangular(self.L, self.kernel(self.train_X, X).to(dtype), upper=False)
        kdiag = self.kernel.diag(X).to(dtype)
        if not bool(torch.isfinite(Q[:n]).all() & torch.isfinite(kdiag).all()):  # nothing is watched then
            raise nonfinite_values_error("ExactPosterior.watch", "kernel values k(X_train, X)")
        self._watch = {
            "X": X,
            "Q": Q,
            "mean": Q[:n].T @ self.Liy,
            "var": kdiag - (Q[:n] ** 2).sum(0),
        }

    def watched(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, var)`` of the watched points, GP scale, `(A,)` each in the compute dtype."""
        if self._watch is None:
            raise InputDataError("watched: expected watch(X) to have been called, got no watched points")
        return self._watch["mean"], self._watch["var"].clamp_min(0.0)

    def update(self, x: torch.Tensor, y: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> None:
        """Append rows by Cholesky growth (``O(n²)`` per row, plus ``O(A·n)`` per row for watched points).

        With ``y=None`` the rows are hallucinated (GP-BUCB): conditioned on their current posterior mean,
        so the mean stays exactly as it was and the variance shrinks as for a real observation.

        Args:
            x: `(k, d)` or `(d,)`.
            y: `(k,)` mean rewards, or ``None``.
            counts: `(k,)` positive counts; default ones.

        Raises:
            NumericsError: a row's Schur complement is not positive, or its kernel values are NaN/inf
                (``nonfinite``); the rows before it are added, it and the rest are not.
        """
        self._require_fit()
        if isinstance(x, torch.Tensor) and x.dim() == 1:
            x = x.unsqueeze(0)
            y = y.reshape(1) if isinstance(y, torch.Tensor) and y.dim() == 0 else y
            counts = counts.reshape(1) if isinstance(counts, torch.Tensor) and counts.dim() == 0 else counts
        x, y, counts = self._check(x, y, counts, "x", "y", fitting=False)
        for j in range(x.shape[0]):
            self._grow(x[j], None if y is None else y[j], counts[j])

    def repeat_last(self) -> None:
        """Hallucinate one more pull of the last row's point (GP-BUCB picking the same arm again).

        The last row must be hallucinated (added by ``update(x, None)``, or any row whose reward equals
        the posterior mean of the rows before it). Its count ``c`` becomes ``c + 1``: only the last
        diagonal entry of ``L`` and the last row of the watched ``Q`` change -- ``O(A)``, where a new
        row would cost ``O(A·n)`` -- and the posterior is exactly that of a second ``update(x, None)``.
        :meth:`observe` later gives the row the mean of the ``c + 1`` rewards.

        Raises:
            InputDataError: no row, or the last row carries an observed residual (state unchanged).
            NumericsError: the new Schur complement is not positive (state unchanged).
        """
        self._require_fit()
        n = self.num_train
        if n == 0:
            raise InputDataError("repeat_last: expected at least one row, got an empty posterior")
        if bool(self.Liy[n - 1] != 0):
            raise InputDataError("repeat_last: expected a hallucinated last row (update(x, None)), got an observed one")
        c_old = self._C[n - 1]
        try:
            d_old, d_new = self.state.renoise_last_(self.lam / (c_old + 1))
        except NumericsError as err:
            raise NumericsError(f"ExactPosterior.repeat_last: {err}") from None
        if self._watch is not None:  # q = (k_A - l Q) / d: only its scale changes
            w = self._watch
            q = w["Q"][n - 1]
            shrink = d_old / d_new
            w["var"] += (q * q) * (1 - shrink * shrink)
            q.mul_(shrink)
        self._C[n - 1] = c_old + 1

    def observe(self, rows: torch.Tensor, y: torch.Tensor) -> None:
        """Give rows already conditioned on (typically hallucinated ones) their observed mean rewards.

        GP-BUCB hallucinates a batch (``update(x, None)``) and receives the rewards later; ``L`` does
        not depend on the rewards, so only ``L⁻¹ y`` is recomputed: ``O(n²)``, plus ``O(A·n)`` for the
        watched points -- no refactorization.

        Args:
            rows: `(k,)` row positions in ``[0, num_train)``.
            y: `(k,)` finite mean rewards (the training dtype).
        """
        self._require_fit()
        n = self.num_train
        rows = torch.as_tensor(rows).reshape(-1)
        if rows.is_floating_point() or rows.dtype == torch.bool:
            raise InputDataError(f"rows: expected integer row positions, got dtype {rows.dtype}")
        rows = rows.to(device=self.L.device, dtype=torch.long)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n):
            raise InputDataError(f"rows: expected positions in [0, {n}), got {rows.tolist()}")
        if not isinstance(y, torch.Tensor) or y.shape != rows.shape:
            got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise InputDataError(f"y: expected shape {tuple(rows.shape)} (one per row), got {got}")
        check_finite(y, "y")
        Liy = self.state.retarget_(rows, y)
        if self._watch is not None:
            self._watch["mean"] = self._watch["Q"][:n].T @ Liy  # (A,): O(A·n)

    def truncate(self, n: int) -> None:
        """Forget every row past the first ``n`` (e.g. hallucinations that will never be observed).

        ``O(A·(num_train - n))`` for the watched points; the first ``n`` rows are untouched.

        Args:
            n: rows to keep, ``0 <= n <= num_train``.
        """
        self._require_fit()
        if isinstance(n, bool) or int(n) != n or not 0 <= int(n) <= self.num_train:
            raise InputDataError(f"n: expected an integer in [0, {self.num_train}], got {n!r}")
        n, old = int(n), self.num_train
        if self._watch is not None and n < old:
            drop = self._watch["Q"][n:old]  # (k, A)
            self._watch["var"] += (drop * drop).sum(0)
            self._watch["mean"] -= drop.T @ self.Liy[n:old]
        self.state.truncate_(n)

    # ------------------------------------------------------------------ prediction
    def forward(self, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and GP-scale variance.

        Args:
            Xq: `(*b, q, d)`.

        Returns:
            ``(mean, var)``, each `(*b, q)` in ``Xq``'s dtype.
        """
        A = self._solve_cross(Xq)  # (*b, n, q)
        mean = (A * self.Liy.unsqueeze(-1)).sum(-2)
        var = self.kernel.diag(Xq).to(A.dtype) - (A * A).sum(-2)
        return mean.to(Xq.dtype), var.clamp_min(0.0).to(Xq.dtype)

    def rls(self, Xq: torch.Tensor) -> torch.Tensor:
        """RLS-scale variance ``σ² = var / λ``, `(*b, q)`."""
        return self.forward(Xq)[1] / self.lam

    def mean(self, Xq: torch.Tensor) -> torch.Tensor:
        """Posterior mean, `(*b, q)`."""
        return self.forward(Xq)[0]

    def joint(self, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint posterior over `(*b, q, d)` points: ``(mean (*b, q), cov (*b, q, q))``, GP scale."""
        A = self._solve_cross(Xq)  # (*b, n, q)
        mean = (A * self.Liy.unsqueeze(-1)).sum(-2)
        cov = self.kernel(Xq, Xq).to(A.dtype) - A.transpose(-1, -2) @ A
        return mean.to(Xq.dtype), (0.5 * (cov + cov.transpose(-1, -2))).to(Xq.dtype)

    def log_det(self) -> torch.Tensor:
        """``log det(I + K_XX / λ)`` for unit counts (the information gain ×2 of GP-UCB)."""
        n = self.num_train
        return 2.0 * torch.log(self.L.diagonal()).sum() - n * torch.log(self.noise.to(self.L.dtype))

    # ------------------------------------------------------------------ internals
    def _solve_cross(self, Xq: torch.Tensor) -> torch.Tensor:
        self._require_fit()
        check_matrix(Xq, "Xq", d=self.train_X.shape[-1])
        check_same_device_dtype(self.train_X, Xq, "Xq", "the training data")
        dtype = self.L.dtype
        n = self.num_train
        if n == 0:
            return Xq.new_zeros((*Xq.shape[:-2], 0, Xq.shape[-2]), dtype=dtype)
        Kxq = self.kernel(self.train_X, Xq).to(dtype)  # (*b, n, q)
        L = self.L.expand(*Kxq.shape[:-2], n, n)
        return torch.linalg.solve_triangular(L, Kxq, upper=False)  # (*b, n, q)

    def _grow(self, x: torch.Tensor, y: torch.Tensor | None, count: torch.Tensor) -> None:
        n, dtype, w = self.num_train, self.L.dtype, self._watch
        kA = None if w is None else self.kernel(x.unsqueeze(0), w["X"]).to(dtype)[0]  # (A,), checked before any change
        if kA is not None and not bool(torch.isfinite(kA).all()):
            raise nonfinite_values_error("ExactPosterior.update", "kernel values k(x, ·) at the watched points")
        try:
            l, dnew, liy = self.state.grow_(x, y, self.lam / count.to(dtype))
        except NumericsError as err:
            new = NumericsError(f"ExactPosterior.update: {err}")
            new.nonfinite = err.nonfinite
            raise new from None
        if n + 1 > self._C.shape[0]:
            self._reserve(2 * (n + 1), n)
        self._C[n] = count.to(dtype)
        if w is not None:
            q = (kA - l @ w["Q"][:n]) / dnew  # (A,): O(A·n)
            w["Q"][n] = q
            w["mean"] += q * liy
            w["var"] -= q * q

    def _reserve(self, cap: int, n: int) -> None:
        """Room for ``cap`` rows in the counts and the watched ``Q``, their first ``n`` kept (the state reserves its
        own)."""
        C = self._C.new_zeros((cap,))
        C[:n] = self._C[:n]
        self._C = C
        if self._watch is not None:
            Q = self._watch["Q"].new_zeros((cap, self._watch["Q"].shape[1]))
            Q[:n] = self._watch["Q"][:n]
            self._watch["Q"] = Q

    def _require_fit(self) -> None:
        if self.state is None:
            raise InputDataError("ExactPosterior: expected fit(X, y) to have been called, got an unfitted posterior")

    def _check(self, X, y, counts, xname, yname, fitting: bool):
        check_matrix(X, xname, d=None if fitting else self.train_X.shape[-1], finite=False)
        if X.dim() != 2:
            raise InputDataError(f"{xname}: expected shape (n, d), got {tuple(X.shape)}")
        if not fitting:
            check_same_device_dtype(self.train_X, X, xname, "the training data")
        given = counts is not None
        y, counts = check_targets(X, y, counts, yname, xname=xname, allow_none_y=not fitting, finite=False)
        check_values(X, y, counts if given else None, xname, yname)  # one host read
        return X.detach(), y, counts
