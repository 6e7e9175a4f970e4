"""Small data are computed exactly outright: up to ``EXACT_BELOW`` points on the CPU, more on an accelerator, where
the exact GP launches fewer kernels than the replay (``EXACT_BELOW_ACCELERATOR`` where float64 runs at full rate)."""

from __future__ import annotations

import pytest
import torch
from botorch.models import SingleTaskGP
from gpytorch.kernels import RBFKernel, ScaleKernel

from torchbkb.botorch import BKBModel
from torchbkb.errors import InputDataError
from torchbkb.botorch.defaults import EXACT_BELOW, EXACT_BELOW_ACCELERATOR, EXACT_BELOW_SLOW_FLOAT64, exact_below

NOISE = 0.05


def _data(n: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, generator=g, dtype=torch.float64)
    Y = torch.sin(4 * X) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return X.to(device), Y.to(device)


def _kernel(device) -> ScaleKernel:
    k = ScaleKernel(RBFKernel()).to(device=device, dtype=torch.float64)
    k.base_kernel.lengthscale = 0.5  # smooth: the replay's dictionary stays far below half the points
    k.outputscale = 1.0
    return k


@pytest.mark.parametrize("capability, expected", [((9, 0), EXACT_BELOW_ACCELERATOR), ((8, 0), EXACT_BELOW_ACCELERATOR),
                                                  ((8, 9), EXACT_BELOW_SLOW_FLOAT64),
                                                  ((7, 5), EXACT_BELOW_SLOW_FLOAT64)])
def test_the_rule_follows_the_device_and_its_float64_rate(monkeypatch, capability, expected):
    """The CPU's threshold on the CPU; on CUDA, the larger one where float64 runs at full rate (H100: 9.0, A100:
    8.0), a smaller one where it does not (L4, L40, RTX 4090: 8.9; T4: 7.5); on other accelerators the smaller."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert exact_below("cuda") == exact_below(torch.device("cuda", 1)) == expected
    assert exact_below("cpu") == exact_below(torch.device("cpu")) == EXACT_BELOW
    assert exact_below("meta") == EXACT_BELOW_SLOW_FLOAT64
    assert EXACT_BELOW < EXACT_BELOW_SLOW_FLOAT64 < EXACT_BELOW_ACCELERATOR


@pytest.mark.parametrize("bad", ["nope", 3.5, None])
def test_a_bad_device_raises_a_typed_error(bad):
    with pytest.raises(InputDataError, match="expected a torch.device"):
        exact_below(bad)


def test_the_threshold_is_inclusive_on_the_cpu():
    X, Y = _data(EXACT_BELOW + 1, "cpu")
    at = BKBModel(X[:EXACT_BELOW], Y[:EXACT_BELOW], kernel=_kernel("cpu"), noise=NOISE, seed=0)
    past = BKBModel(X, Y, kernel=_kernel("cpu"), noise=NOISE, seed=0)
    assert at.is_exact
    assert not past.is_exact and past.num_inducing < (EXACT_BELOW + 1) // 2


def test_between_the_two_thresholds_the_device_decides(device):
    """300 points: the sparse model on the CPU, the exact GP on an accelerator -- SingleTaskGP's posterior there,
    the same hyperparameters; ``exact_fraction=None`` keeps DTC everywhere."""
    n = 300
    X, Y = _data(n, device)
    model = BKBModel(X, Y, kernel=_kernel(device), noise=NOISE, seed=0)
    sparse = BKBModel(X, Y, kernel=_kernel(device), noise=NOISE, seed=0, exact_fraction=None)
    assert EXACT_BELOW < n <= EXACT_BELOW_SLOW_FLOAT64
    assert model.is_exact == (n <= exact_below(device))  # the CPU: no; an accelerator: yes
    assert not sparse.is_exact and sparse.num_inducing < n // 2
    gp = SingleTaskGP(X, Y, covar_module=_kernel(device))
    gp.likelihood.noise = torch.tensor([NOISE], dtype=torch.float64, device=device)
    Xq = torch.linspace(0, 1, 9, dtype=torch.float64, device=device).unsqueeze(-1)
    want, got = gp.posterior(Xq), model.posterior(Xq)
    tol = 1e-9 if model.is_exact else 1e-3  # DTC on a variance-sampled dictionary: close, not equal
    torch.testing.assert_close(got.mean, want.mean, rtol=0, atol=tol)
    torch.testing.assert_close(got.variance, want.variance, rtol=0, atol=tol)


def test_a_model_exact_outright_is_fitted_on_the_exact_evidence(device):
    """Past ``EXACT_FIT`` points the fit maximizes the collapsed bound in rounds -- unless the posterior is the
    exact GP outright (a GPU whose float64 runs at full rate, up to its threshold): then the exact evidence, as
    ``SingleTaskGP``'s."""
    from botorch.fit import fit_gpytorch_mll

    from torchbkb.botorch import DTCMarginalLogLikelihood
    from torchbkb.botorch.defaults import EXACT_FIT

    g = torch.Generator().manual_seed(1)
    X = torch.rand(EXACT_FIT + 100, 3, generator=g, dtype=torch.float64)
    Y = torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(EXACT_FIT + 100, 1, generator=g, dtype=torch.float64)
    model = BKBModel(X.to(device), Y.to(device), seed=0)
    fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model), fit_points=300)
    outright = EXACT_FIT + 100 <= exact_below(device)  # a GPU whose float64 runs at full rate
    assert model.fit_objective == ("exact" if outright else "bound")
    assert model.is_exact == outright
