"""Independent float64 reference formulas used by the tests (written from the papers, not the package)."""

import os
import torch
from torch.utils._python_dispatch import TorchDispatchMode


def gp_sample_problem(A=150, d=2, seed=0, ls=0.25):
    """``(arms, GaussianKernel(ls), f)``: `(A, d)` uniform float64 arms and a standardized draw ``f`` of the GP
    with that kernel on them."""
    from torchbkb.gp.kernels import GaussianKernel

    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, d, generator=g, dtype=torch.float64)
    k = GaussianKernel(ls)
    L = torch.linalg.cholesky(k(arms, arms) + 1e-9 * torch.eye(A, dtype=torch.float64))
    f = L @ torch.randn(A, generator=g, dtype=torch.float64)
    return arms, k, (f - f.mean()) / f.std()


def rbf(A, B, ls):
    """exp(-‖a - b‖² / (2 ls²)) computed directly."""
    d2 = ((A.unsqueeze(-2) - B.unsqueeze(-3)) ** 2).sum(-1)
    return torch.exp(-0.5 * d2 / ls**2)


class ScaledRBF:
    """The kernel ``outputscale · rbf(A, B, lengthscale)``: called, in closed form (float64); :meth:`gpytorch`, as
    GPyTorch's ``ScaleKernel(RBFKernel())`` with its hyperparameters set exactly in the final dtype (a Python float
    would pass through float32)."""

    def __init__(self, lengthscale, outputscale):
        self.lengthscale, self.outputscale = lengthscale, outputscale

    def __call__(self, A, B):
        return self.outputscale * rbf(A, B, self.lengthscale)

    def gpytorch(self, device=None, dtype=torch.float64):
        from gpytorch.kernels import RBFKernel, ScaleKernel

        k = ScaleKernel(RBFKernel()).to(device=device, dtype=dtype)
        k.base_kernel.lengthscale = torch.tensor(self.lengthscale, dtype=dtype)
        k.outputscale = torch.tensor(self.outputscale, dtype=dtype)
        return k


def gpu_defaults(bandit):
    """``bandit`` with a GPU's defaults, on any device: the fixed-capacity update through the update graphs' static
    buffers and, for BBKB, the device loop with its picks replayed from buffers (graphs on CUDA, run eagerly on the
    CPU)."""
    from torchbkb.bandits.pick_graph import PickGraphs
    from torchbkb.bandits.update_graph import UpdateGraphs

    bandit.fixed_capacity = True
    bandit.engine.graphs = UpdateGraphs(devices=("cpu", "cuda"))
    if hasattr(bandit, "device_loop"):
        bandit.device_loop, bandit.pick_graphs = True, PickGraphs(devices=("cpu", "cuda"))
    return bandit


def same_state(a, b) -> bool:
    """Equal state dicts: the same keys and lengths, tensors of the same dtype and shape with the same values (or
    all NaN in both), other values equal (NaN to NaN)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(torch.equal(a, b) or (a.is_floating_point() and (a.isnan() & b.isnan()).all()))
    return a == b or (a != a and b != b)


def exact_gp(K_xx, K_xq, k_qq, y, lam):
    """Exact GP posterior mean and joint covariance (000 Eq. 1-2, GP scale)."""
    n = K_xx.shape[0]
    M = K_xx + lam * torch.eye(n, dtype=K_xx.dtype)
    mean = K_xq.T @ torch.linalg.solve(M, y)
    cov = k_qq - K_xq.T @ torch.linalg.solve(M, K_xq)
    return mean, cov


def titsias_dtc(K_zz, K_xz, K_qz, K_qq, y, tau2):
    """003 Eq. 4-5: DTC mean V_nᵀ(x) Y and covariance, GP scale."""
    Sigma = tau2 * K_zz + K_xz.T @ K_xz
    mean = K_qz @ torch.linalg.solve(Sigma, K_xz.T @ y)
    cov = K_qq - K_qz @ torch.linalg.solve(K_zz, K_qz.T) + tau2 * K_qz @ torch.linalg.solve(Sigma, K_qz.T)
    return mean, cov


def bkb_eq4(K_ss, K_xs, K_qs, k_qq_diag, y, lam):
    """000 Eq. 4 verbatim: z = (K_S^{1/2})⁺ k_S, V = ZᵀZ + λI,
    μ̃ = zᵀ V⁻¹ Zᵀ y,   σ̃² = (k(x,x) - zᵀ ZᵀZ V⁻¹ z) / λ."""
    s, U = torch.linalg.eigh(K_ss)
    keep = s > 1e-12 * s.max()
    root_pinv = U[:, keep] @ torch.diag(s[keep].rsqrt()) @ U[:, keep].T  # (K_S^{1/2})⁺
    Z = K_xs @ root_pinv
    zq = K_qs @ root_pinv
    V = Z.T @ Z + lam * torch.eye(Z.shape[1], dtype=Z.dtype)
    mean = zq @ torch.linalg.solve(V, Z.T @ y)
    var = (k_qq_diag - ((zq @ (Z.T @ Z)) * torch.linalg.solve(V, zq.T).T).sum(-1)) / lam
    return mean, var


def close(a, b, atol=1e-12):
    """Absolute comparison (no relative slack)."""
    return bool(torch.allclose(a, b, rtol=0.0, atol=atol))


def claim(root, name: str) -> int:
    """Atomically number a call by files in ``root`` (pool workers share no memory): the k-th call for
    ``name`` creates ``name.k`` and returns ``k``."""
    k = 0
    while True:
        try:
            os.close(os.open(os.path.join(str(root), f"{name}.{k}"), os.O_CREAT | os.O_EXCL))
            return k
        except FileExistsError:
            k += 1


class LargestOutput(TorchDispatchMode):
    """Within ``with LargestOutput() as rec:``, ``rec.numel`` is the size of the largest tensor any operation
    returned -- how the memory tests show that no `(A, m)` intermediate is formed."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


#: The factorizations complexity tests watch: in ``torch.linalg`` and in ``torch``.
LINALG_FACTORIZATIONS = ["cholesky", "cholesky_ex", "eigh", "eigvalsh", "inv", "inv_ex", "solve", "solve_ex", "lstsq",
                         "svd", "qr", "lu_factor", "lu_factor_ex", "solve_triangular", "pinv", "eig"]
TORCH_FACTORIZATIONS = ["cholesky_inverse", "cholesky_solve", "inverse", "pinverse"]


def spy_factorizations(monkeypatch) -> list:
    """Patch every watched factorization to record the trailing `(rows, cols)` of its first argument; returns the
    list the calls append to."""
    sizes = []
    for module, names in ((torch.linalg, LINALG_FACTORIZATIONS), (torch, TORCH_FACTORIZATIONS)):
        for name in names:
            fn = getattr(module, name)

            def spy(A, *args, _fn=fn, **kw):
                sizes.append(tuple(A.shape[-2:]))
                return _fn(A, *args, **kw)

            monkeypatch.setattr(module, name, spy)
    return sizes


class HostReads:
    """Within ``with HostReads() as r:``, ``r.calls`` names every host read of a tensor (``tolist``, ``item``,
    ``bool``, ``int``, ``float``) -- what a GPU waits for, counted on any device."""

    NAMES = ("tolist", "item", "__bool__", "__int__", "__float__")

    def __enter__(self):
        self.calls, self.original = [], {n: getattr(torch.Tensor, n) for n in self.NAMES}

        def counting(name):
            def read(tensor, *args):
                self.calls.append(name)
                return self.original[name](tensor, *args)
            return read

        for name in self.NAMES:
            setattr(torch.Tensor, name, counting(name))
        return self

    def __exit__(self, *exc):
        for name, fn in self.original.items():
            setattr(torch.Tensor, name, fn)


class DeviceReads(TorchDispatchMode):
    """Within ``with DeviceReads() as r:``, ``r.names`` lists every operator that makes the host wait for a GPU
    (a value read, a data-dependent shape such as a boolean mask's, ``torch.equal``) -- counted on any device, inside
    operators too. ``tolist`` is not an operator: :class:`HostReads` counts it."""

    SYNC = ("aten::_local_scalar_dense", "aten::nonzero", "aten::equal", "aten::masked_select", "aten::_unique2",
            "aten::unique_consecutive")

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in self.SYNC:
            self.names.append(name)
        elif name == "aten::index" and any(isinstance(t, torch.Tensor) and t.dtype == torch.bool
                                           for t in args[1] or ()):
            self.names.append("aten::index (a bool mask)")  # its nonzero runs inside the operator
        return func(*args, **(kwargs or {}))


class TorchRows:
    """Reads like an `(A, r)` feature tensor ``Z`` (shape, dtype, device, rows by a long tensor or a slice) without
    being one, so that BBKB's in-batch loop runs on its torch state (``TensorInBatch``) rather than on the host."""

    def __init__(self, Z):
        self.Z, self.shape, self.dtype, self.device = Z, Z.shape, Z.dtype, Z.device

    def __getitem__(self, idx):
        return self.Z[idx]


def batch_strategies(max_cap: int) -> dict:
    """Hypothesis strategies of a BBKB/GP-BUCB batch's settings: a problem seed, the width, ``C̃``, an optional cap,
    the stop rule and whether one arm dominates."""
    from hypothesis import strategies as st

    return dict(seed=st.integers(0, 10_000), alpha=st.floats(0.0, 3.0), C=st.floats(1.0, 30.0),
                cap=st.one_of(st.none(), st.integers(1, max_cap)), stop_rule=st.sampled_from(["sum", "product"]),
                dominant=st.booleans())


class Dispatches(TorchDispatchMode):
    """Counts every operator a block dispatches (views included)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))
