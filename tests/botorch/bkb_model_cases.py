"""The BKBModel tests' kernel (a GPyTorch scaled RBF set exactly in the final dtype), its closed form, data and model
on a given dictionary."""

import torch

from helpers import ScaledRBF
from torchbkb.botorch import BKBModel

LS, OS, LAM = 0.3, 1.7, 0.05


#: ``OS · rbf(LS)``: ``krbf(A, B)`` in closed form, ``gpytorch_kernel(device, dtype)`` as GPyTorch's
krbf = ScaledRBF(LS, OS)
gpytorch_kernel = krbf.gpytorch


def model_data(n=30, d=2, seed=0):
    """``(X, Y, Xq)``: `(n, d)` inputs, `(n, 1)` noisy outcomes and `(7, d)` queries."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = (torch.sin(5 * X.sum(-1)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)).unsqueeze(-1)
    Xq = torch.rand(7, d, generator=g, dtype=torch.float64)
    return X, Y, Xq


def dictionary_model(X, Y, S, device="cpu", dtype=torch.float64, **kw):
    """A BKBModel on ``(X, Y)`` with the dictionary ``S`` and noise ``LAM`` (no outcome transform unless given)."""
    kw.setdefault("outcome_transform", None)
    return BKBModel(X.to(device, dtype), Y.to(device, dtype), kernel=gpytorch_kernel(device, dtype), noise=LAM,
                    inducing_points=S.to(device, dtype), **kw)
