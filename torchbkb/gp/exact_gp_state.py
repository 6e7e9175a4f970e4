"""The state of an exact GP posterior: the one object that holds it, for the bandits and for BoTorch.

:class:`~torchbkb.ExactPosterior` (GP-UCB's and GP-BUCB's engine) grows it one row at a time, in place;
:class:`~torchbkb.botorch.BKBModel` computes with it when its dictionary is (nearly) complete, conditioning it on
fantasies. The state is a sequence of blocks of observations, each whitened against the ones before it (a block
Cholesky factorization)::

    U_1(x) = k(x, X_1) L_1⁻ᵀ,    U_j(x) = (k(x, X_j) - U_<j(x) B_jᵀ) C_j⁻ᵀ,    B_j = U_<j(X_j)
    C_j C_jᵀ = k(X_j, X_j) + N_j - B_j B_jᵀ,    β_j = C_j⁻¹ (y_j - B_j β_<j)
    mean(x) = Σ_j U_j(x) β_j,    cov(x, x') = k(x, x') - Σ_j U_j(x) U_j(x')ᵀ

so conditioning on new observations (BoTorch's fantasies) appends one block in ``O(q·N² + q³)`` and stays
differentiable in the new points and values (``L_1 = C_1`` is the Cholesky factor of the first block;
``N_j`` is the diagonal observation noise, heteroskedastic allowed). Observations without an autograd graph and
of the state's own batch shape are merged into the one factor instead (``[[L, 0], [B, C]]`` is the Cholesky
factor of the grown matrix): a model conditioned point by point keeps one triangular solve per query, not one
per conditioning. One unbatched block without a graph also grows in place (:meth:`ExactGPState.grow_`, one row of
the factor in ``O(n²)`` into reserved capacity), takes new noise for its last row or new targets for some rows, and
forgets its last rows -- what a bandit's hallucinated batch needs.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(10, 2, dtype=torch.float64); y = X.sum(-1)
    >>> full = ExactGPState(GaussianKernel(0.5), X, y, torch.full((10,), 0.01, dtype=torch.float64))
    >>> part = ExactGPState(GaussianKernel(0.5), X[:7], y[:7], torch.full((7,), 0.01, dtype=torch.float64))
    >>> grown = part.condition(X[7:], y[7:], torch.full((3,), 0.01, dtype=torch.float64))
    >>> Xq = torch.rand(4, 2, dtype=torch.float64)
    >>> all(torch.allclose(a, b) for a, b in zip(full.joint(Xq), grown.joint(Xq)))
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from torchbkb.errors import InputDataError, NumericsError, TorchBKBError
from torchbkb.gp.kernels import as_kernel
from torchbkb.gp.stable_scoring import whiten_rows
from torchbkb.gp.linalg import compute_dtype, safe_cholesky

__all__ = ["ExactGPState"]


class ExactGPState(nn.Module):
    """Exact zero-mean GP posterior with per-point Gaussian noise, grown block by block.

    Args:
        kernel: a GPyTorch kernel or a callable ``(X1, X2) -> Tensor`` (not copied).
        X: `(*b, n, d)` observed inputs (``n = 0``: the prior, unbatched, to grow in place).
        y: `(*b, n)` observed values (prior mean already removed).
        noise: `(*b, n)` positive noise variances.

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> s = ExactGPState(GaussianKernel(1.0), torch.zeros(1, 1), torch.ones(1), torch.full((1,), 0.1))
        >>> s(torch.zeros(1, 1))[0]                       # 1 / (1 + 0.1)
        tensor([0.9091])
    """

    def __init__(self, kernel: Callable, X: Tensor, y: Tensor, noise: Tensor):
        super().__init__()
        self.kernel = as_kernel(kernel)
        n = X.shape[-2]
        dt = compute_dtype(X.dtype, max(n, 1))
        if n == 0:
            L = X.new_zeros((*X.shape[:-2], 0, 0), dtype=dt)
            beta = X.new_zeros((*X.shape[:-2], 0), dtype=dt)
        else:
            K = self.kernel(X, X).to(dt)
            L = safe_cholesky(K + torch.diag_embed(noise.to(dt)), name="K + noise")  # (*b, n, n)
            beta = whiten_rows(L, y.to(dt).unsqueeze(-2)).squeeze(-2)  # L⁻¹ y
        self._blocks = [{"X": X, "C": L, "beta": beta, "y": y, "noise": noise}]
        self._reserved: dict | None = None  # capacity buffers of the one block (grow_), its entries views of them

    # ------------------------------------------------------------------ data
    @property
    def train_X(self) -> Tensor:
        """`(*b, N, d)` every observed input, block after block."""
        return _cat([b["X"] for b in self._blocks], trailing=2)

    @property
    def train_y(self) -> Tensor:
        """`(*b, N)` the observed values."""
        return _cat([b["y"] for b in self._blocks], trailing=1)

    @property
    def train_noise(self) -> Tensor:
        """`(*b, N)` the observation noise variances."""
        return _cat([b["noise"] for b in self._blocks], trailing=1)

    @property
    def batch_shape(self) -> torch.Size:
        """Broadcast batch shape of all blocks."""
        return self.train_X.shape[:-2]

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        self._blocks = [
            {k: (fn(v) if isinstance(v, Tensor) and v.is_floating_point() else v) for k, v in b.items()}
            for b in self._blocks
        ]
        self._reserved = None  # the block's entries are its own tensors now; capacity is reserved again on growth
        return out

    # ------------------------------------------------------------------ growing in place
    @property
    def num_train(self) -> int:
        """``N``, the number of observations."""
        return sum(int(b["X"].shape[-2]) for b in self._blocks)

    @property
    def factor(self) -> Tensor:
        """`(N, N)` the lower Cholesky factor ``L`` of ``K + N`` of a one-block state (compute dtype)."""
        return self._one_block("factor")["C"]

    @property
    def whitened_targets(self) -> Tensor:
        """`(N,)` ``β = L⁻¹ y`` of a one-block state (compute dtype)."""
        return self._one_block("whitened_targets")["beta"]

    def grow_(self, x: Tensor, y: Tensor | None, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Observe ``y`` (0-d; ``None``: the posterior mean at ``x``, a hallucination that leaves the mean as it is)
        at `(d,)` ``x`` with noise ``noise`` (0-d, compute dtype), in place: one row of the factor in ``O(N²)``, no
        refactorization, into capacity reserved by doubling. A one-block unbatched state without a graph.

        Returns:
            ``(l, δ, β_x)``: the new row ``l = L⁻¹ k_X(x)`` `(N,)`, its diagonal
            ``δ = √(k(x, x) + noise - ‖l‖²)`` and whitened target ``β_x = (y - lᵀβ)/δ`` (0-d each):
            what points watched by the caller need.

        Raises:
            NumericsError: ``δ² <= 0`` (state unchanged).
        """
        block = self._one_block("grow_")
        n, L, dt = int(block["X"].shape[-2]), block["C"], block["C"].dtype
        x2 = x.unsqueeze(0)  # (1, d)
        kx = self.kernel(block["X"], x2).to(dt)[:, 0] if n else x.new_zeros((0,), dtype=dt)  # (N,)
        l = torch.linalg.solve_triangular(L, kx.unsqueeze(-1), upper=False).squeeze(-1) if n else kx
        d2 = self.kernel.diag(x2).to(dt)[0] + noise - (l * l).sum()
        if not bool(d2 > 0):
            err = NumericsError(f"ExactGPState.grow_: expected a positive Schur complement, got {float(d2):.3e}")
            err.nonfinite = not bool(torch.isfinite(d2))  # NaN/inf kernel values at x
            raise err
        delta = d2.sqrt()
        mean_x = (l * block["beta"]).sum()
        beta_x = torch.zeros((), dtype=dt, device=x.device) if y is None else (y.to(dt) - mean_x) / delta
        buf = self._reserve(n + 1)
        buf["X"][n], buf["C"][n, :n], buf["C"][n, n], buf["beta"][n] = x, l, delta, beta_x
        buf["y"][n] = mean_x if y is None else y
        buf["noise"][n] = noise
        self._view(n + 1)
        return l, delta, beta_x

    def renoise_last_(self, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Give the last observation the noise ``noise`` (0-d), in place: only its diagonal entry of the factor
        changes (``O(N)``). The last row must carry no observed residual (``β_N = 0``: a hallucination), whose target
        is the mean of the rows before it whatever its noise. Returns ``(δ_old, δ_new)`` (0-d each).

        Raises:
            TorchBKBError: no observation, or ``β_N != 0``; NumericsError: ``δ² <= 0`` (state unchanged either way).
        """
        block = self._one_block("renoise_last_")
        n = int(block["X"].shape[-2])
        if n == 0 or bool(block["beta"][n - 1] != 0):
            raise TorchBKBError("ExactGPState.renoise_last_: expected a last row without observed residual, got "
                                + ("none" if n == 0 else "an observed one"))
        L, dt = block["C"], block["C"].dtype
        l = L[n - 1, : n - 1]
        d2 = self.kernel.diag(block["X"][n - 1 : n]).to(dt)[0] + noise - (l * l).sum()
        if not bool(d2 > 0):
            raise NumericsError(f"ExactGPState.renoise_last_: expected a positive Schur complement, got "
                                f"{float(d2):.3e}")
        old, new = L[n - 1, n - 1].clone(), d2.sqrt()
        buf = self._reserve(n)
        buf["C"][n - 1, n - 1], buf["noise"][n - 1] = new, noise
        return old, new

    def retarget_(self, rows: Tensor, y: Tensor) -> Tensor:
        """Give the observations ``rows`` `(k,)` the targets ``y`` `(k,)`, in place: ``β`` is solved again in
        ``O(N²)`` (the factor does not depend on the targets); the others keep ``L β`` (what they were conditioned
        on, to rounding). Returns the new ``β`` `(N,)`."""
        block = self._one_block("retarget_")
        n, L = int(block["X"].shape[-2]), block["C"]
        y_all = L @ block["beta"]  # (N,): the current targets (hallucinated rows: their pseudo-targets)
        y_all[rows] = y.to(device=L.device, dtype=L.dtype)
        beta = torch.linalg.solve_triangular(L, y_all.unsqueeze(-1), upper=False).squeeze(-1)
        buf = self._reserve(n)
        buf["beta"][:n], buf["y"][:n] = beta, y_all
        return beta

    def truncate_(self, n: int) -> None:
        """Forget every observation past the first ``n`` (``0 <= n <= N``), in place; the first ``n`` are untouched."""
        N = int(self._one_block("truncate_")["X"].shape[-2])
        if isinstance(n, bool) or int(n) != n or not 0 <= int(n) <= N:
            raise InputDataError(f"n: expected an integer in [0, {N}], got {n!r}")
        self._reserve(N)
        self._view(int(n))

    def _one_block(self, name: str) -> dict:
        block = self._blocks[0]
        if len(self._blocks) != 1 or block["C"].dim() != 2 or any(t.requires_grad for t in self.state_tensors()):
            raise TorchBKBError(f"ExactGPState.{name}: expected one unbatched block without an autograd graph, got "
                                f"{len(self._blocks)} blocks of batch shape {tuple(self.batch_shape)}")
        return block

    def _reserve(self, need: int) -> dict:
        """The capacity buffers of the one block, holding at least ``need`` rows (doubled and copied when short)."""
        block, buf = self._blocks[0], self.__dict__.get("_reserved")
        if buf is not None and buf["C"].shape[0] >= need:
            return buf
        n, cap = int(block["X"].shape[-2]), max(16, 2 * need)
        buf = {"X": block["X"].new_zeros((cap, block["X"].shape[-1])), "C": block["C"].new_zeros((cap, cap))}
        buf.update({k: block[k].new_zeros((cap,)) for k in ("beta", "y", "noise")})
        buf["X"][:n], buf["C"][:n, :n] = block["X"], block["C"]
        for k in ("beta", "y", "noise"):
            buf[k][:n] = block[k]
        self._reserved = buf
        self._view(n)
        return buf

    def _view(self, n: int) -> None:
        buf = self._reserved
        self._blocks = [{"X": buf["X"][:n], "C": buf["C"][:n, :n], "beta": buf["beta"][:n], "y": buf["y"][:n],
                         "noise": buf["noise"][:n]}]

    # ------------------------------------------------------------------ prediction
    def features(self, X: Tensor) -> list[Tensor]:
        """The whitened cross-covariances ``[U_1(X), U_2(X), ...]``, each `(*b, q, n_j)` (compute dtype)."""
        first = self._blocks[0]
        dt = first["C"].dtype
        U = [whiten_rows(first["C"], self.kernel(X, first["X"]).to(dt))]  # rows L⁻¹ k(X_1, x): one triangular solve
        for block in self._blocks[1:]:
            R = self.kernel(X, block["X"]).to(dt) - _cat(U, trailing=2, dim=-1) @ block["B"].transpose(-1, -2)
            U.append(torch.linalg.solve_triangular(block["C"].transpose(-1, -2), R, upper=True, left=False))
        return U

    def forward(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior mean and variance at `(*b, q, d)` ``X``, each `(*b', q)` in ``X``'s dtype."""
        U = self.features(X)
        mean = sum((u @ b["beta"].unsqueeze(-1)).squeeze(-1) for u, b in zip(U, self._blocks))
        var = self.kernel.diag(X).to(U[0].dtype) - sum((u * u).sum(-1) for u in U)
        return mean.to(X.dtype), var.clamp_min(0.0).to(X.dtype)

    def joint(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior mean `(*b', q)` and joint covariance `(*b', q, q)` at `(*b, q, d)` ``X``."""
        U = self.features(X)
        mean = sum((u @ b["beta"].unsqueeze(-1)).squeeze(-1) for u, b in zip(U, self._blocks))
        cov = self.kernel(X, X).to(U[0].dtype)
        if not torch.is_grad_enabled() and cov.dim() == 2 and cov.shape[-1] > 256:
            for u in U:  # a large (q, q) block is memory-bound: one pass each and no transposed copy (the kernel
                cov = torch.addmm(cov, u, u.T, alpha=-1.0)  # and U Uᵀ are symmetric to rounding)
            return mean.to(X.dtype), cov.to(X.dtype)
        cov = cov - sum(u @ u.transpose(-1, -2) for u in U)
        return mean.to(X.dtype), (0.5 * (cov + cov.transpose(-1, -2))).to(X.dtype)

    def training_variances(self) -> Tensor:
        """`(*b, n)` posterior variances at the first block's points, ``N - N² diag((K + N)⁻¹)`` in ``O(n²)``."""
        first = self._blocks[0]
        L = first["C"]
        Linv = torch.linalg.solve_triangular(L, torch.eye(L.shape[-1], dtype=L.dtype, device=L.device), upper=False)
        N = first["noise"].to(L.dtype)
        return (N - N * N * (Linv * Linv).sum(-2)).clamp_min(0.0)  # diag((K + N)⁻¹) = column norms of L⁻¹

    def whiten(self, v: Tensor) -> list[Tensor]:
        """``[w_1, w_2, ...]`` with ``Σ_j U_j(x) w_j = k(x, X) (K + N)⁻¹ v`` for `(*s, *b, N)` values ``v`` at the
        observed inputs (the blocks' forward substitution); each `(*s, *b, n_j)` (compute dtype)."""
        out: list[Tensor] = []
        start = 0
        for block in self._blocks:
            n = block["X"].shape[-2]
            vj = v[..., start : start + n].to(block["C"].dtype)
            start += n
            if not out:
                out.append(whiten_rows(block["C"], vj.unsqueeze(-2)).squeeze(-2))
                continue
            prev = _cat(out, trailing=1)
            r = vj - (block["B"] @ prev.unsqueeze(-1)).squeeze(-1)
            out.append(torch.linalg.solve_triangular(block["C"], r.unsqueeze(-1), upper=False).squeeze(-1))
        return out

    # ------------------------------------------------------------------ conditioning
    def condition(self, X: Tensor, y: Tensor, noise: Tensor) -> ExactGPState:
        """A new state that also observed ``y`` `(*b', q)` at ``X`` `(*b', q, d)` with noise `(*b', q)`;
        differentiable in ``X`` and ``y``; this state is unchanged (blocks are shared)."""
        U = self.features(X)
        dt = U[0].dtype
        B = _cat(U, trailing=2, dim=-1)  # (*b, q, N)
        beta_prev = _cat([b["beta"] for b in self._blocks], trailing=1)  # (*b, N)
        S = self.kernel(X, X).to(dt) + torch.diag_embed(noise.to(dt)) - B @ B.transpose(-1, -2)
        C = safe_cholesky(0.5 * (S + S.transpose(-1, -2)), name="conditional covariance")  # (*b, q, q)
        r = y.to(dt) - (B @ beta_prev.unsqueeze(-1)).squeeze(-1)
        beta = torch.linalg.solve_triangular(C, r.unsqueeze(-1), upper=False).squeeze(-1)
        new = ExactGPState.__new__(ExactGPState)
        nn.Module.__init__(new)
        new.kernel, new._reserved = self.kernel, None
        self._reserved = None  # the blocks may be shared now: growing this state in place copies them first
        first = self._blocks[0]
        graph = any(t.requires_grad for t in (B, C, beta, X, y, noise))
        same = B.shape[:-2] == first["C"].shape[:-2] == X.shape[:-2] == y.shape[:-1] == noise.shape[:-1]
        if len(self._blocks) == 1 and not graph and same:
            n, k = first["C"].shape[-1], C.shape[-1]
            L = first["C"].new_zeros(*first["C"].shape[:-2], n + k, n + k)
            L[..., :n, :n], L[..., n:, :n], L[..., n:, n:] = first["C"], B, C
            cat = torch.cat
            new._blocks = [
                {
                    "X": cat([first["X"], X], -2),
                    "C": L,
                    "beta": cat([first["beta"], beta], -1),
                    "y": cat([first["y"], y], -1),
                    "noise": cat([first["noise"], noise], -1),
                }
            ]
        else:
            new._blocks = [*self._blocks, {"X": X, "B": B, "C": C, "beta": beta, "y": y, "noise": noise}]
        return new

    def mean_and_root(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Mean `(*b', q)` and ``U`` `(*b', q, N)` at `(*b, q, d)` ``X``, the joint covariance being
        ``k(X, X) - U Uᵀ`` (in ``X``'s dtype)."""
        U = self.features(X)
        mean = sum((u @ b["beta"].unsqueeze(-1)).squeeze(-1) for u, b in zip(U, self._blocks))
        return mean.to(X.dtype), _cat(U, trailing=2, dim=-1).to(X.dtype)

    def state_tensors(self) -> list[Tensor]:
        """Every tensor of the state (to ask whether one carries an autograd graph)."""
        return [v for b in self._blocks for v in b.values() if isinstance(v, Tensor)]


def _cat(tensors: list[Tensor], trailing: int, dim: int | None = None) -> Tensor:
    """Concatenate along ``dim`` (default: the first of the ``trailing`` core dimensions) after broadcasting
    the batch dimensions."""
    if len(tensors) == 1:
        return tensors[0]
    batch = torch.broadcast_shapes(*(t.shape[:-trailing] for t in tensors))
    return torch.cat([t.expand(*batch, *t.shape[-trailing:]) for t in tensors], dim=-trailing if dim is None else dim)
