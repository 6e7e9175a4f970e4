"""torchbkb.datasets: bundled tables, GP samples (exact and RFF), arm sets, named problems."""

import csv
import math

import gpytorch
import numpy as np
import pytest
import torch

from torchbkb.datasets import (
    BOTORCH_PROBLEMS,
    DATASETS,
    anchor_problem,
    botorch_problem,
    gp_sample,
    grid_arms,
    kernel_matrix,
    load,
    random_arms,
    rff_features,
)
from torchbkb.datasets.tables import DATA_DIR
from torchbkb.errors import InputDataError


# ------------------------------------------------------------------------------------------ tables
@pytest.mark.parametrize(
    "name, kwargs, shape",
    [
        ("abalone", {}, (4177, 8)),
        ("abalone", {"sex": "onehot"}, (4177, 10)),
        ("abalone", {"sex": "drop"}, (4177, 7)),
        ("cadata", {}, (20640, 8)),
        ("california_housing", {}, (20640, 8)),
        ("CADATA", {}, (20640, 8)),
    ],
)
def test_load_shapes_and_standardization(name, kwargs, shape):
    arms, rewards = load(name, **kwargs)
    assert tuple(arms.shape) == shape and tuple(rewards.shape) == (shape[0],)
    assert arms.dtype == rewards.dtype == torch.float64
    assert torch.isfinite(arms).all() and torch.isfinite(rewards).all()
    z = arms[:, 3:] if kwargs.get("sex") == "onehot" else arms  # the one-hot block is left 0/1
    assert torch.allclose(z.mean(0), torch.zeros(z.shape[1], dtype=z.dtype), atol=1e-10)
    assert torch.allclose(z.std(0, unbiased=False), torch.ones(z.shape[1], dtype=z.dtype), atol=1e-10)
    assert abs(float(rewards.mean())) < 1e-10 and abs(float(rewards.std(unbiased=False)) - 1.0) < 1e-10


def test_alias_is_the_same_table():
    a, ra = load("cadata")
    b, rb = load("california_housing")
    assert torch.equal(a, b) and torch.equal(ra, rb)


def _raw_abalone():
    with open(DATA_DIR / "abalone.csv", newline="") as f:
        rows = list(csv.reader(f))[1:]
    return [r[0] for r in rows], np.array([[float(v) for v in r[1:]] for r in rows])


def test_abalone_encoding_and_raw_rewards():
    sex, num = _raw_abalone()
    arms, rings = load("abalone", standardize_rewards=False)
    assert torch.equal(rings, torch.tensor(num[:, -1]))  # reward = rings, untouched
    assert float(rings.min()) == 1.0 and float(rings.max()) == 29.0
    # ordinal: one column taking 3 values in the LIBSVM order M=1 < F=2 < I=3 (then z-scored)
    col = arms[:, 0]
    by_sex = {s: torch.unique(col[[i for i, c in enumerate(sex) if c == s]]) for s in "MFI"}
    assert all(v.numel() == 1 for v in by_sex.values())
    assert float(by_sex["M"]) < float(by_sex["F"]) < float(by_sex["I"])
    codes = np.array([{"M": 1.0, "F": 2.0, "I": 3.0}[c] for c in sex])
    assert torch.allclose(col, torch.tensor((codes - codes.mean()) / codes.std()))
    # the 7 measurements are the raw columns z-scored
    meas = num[:, :7]
    assert torch.allclose(arms[:, 1:], torch.tensor((meas - meas.mean(0)) / meas.std(0)))
    onehot = load("abalone", sex="onehot")[0][:, :3]
    assert torch.equal(onehot.sum(1), torch.ones(4177, dtype=torch.float64))
    assert onehot[0].tolist() == [1.0, 0.0, 0.0] and sex[0] == "M"
    assert torch.allclose(load("abalone", sex="drop")[0], arms[:, 1:])


def test_cadata_raw_rewards_are_house_values():
    _, value = load("cadata", standardize_rewards=False)
    assert math.isclose(float(value.max()), 5.00001) and float(value.min()) > 0.1
    assert math.isclose(float(value[0]), 4.526)


def test_load_dtype_device(device):
    arms, rewards = load("abalone", dtype=torch.float32, device=device)
    assert arms.dtype == rewards.dtype == torch.float32 and arms.device.type == device.type


def test_load_bad_inputs():
    with pytest.raises(InputDataError) as e:
        load("mnist")
    for valid in DATASETS:
        assert valid in str(e.value)
    assert "mnist" in str(e.value)
    with pytest.raises(InputDataError, match="dtype"):
        load("abalone", dtype=torch.int64)
    with pytest.raises(InputDataError, match="sex"):
        load("abalone", sex="binary")
    with pytest.raises(InputDataError):
        load(3)


# ------------------------------------------------------------------------------------- GP samples
@pytest.mark.parametrize("kernel, nu", [("matern12", 0.5), ("matern32", 1.5), ("matern52", 2.5)])
def test_kernel_matrix_matches_gpytorch(kernel, nu):
    X = random_arms(7, 3, seed=1)
    ref = gpytorch.kernels.MaternKernel(nu=nu).double()
    ref.lengthscale = 0.3
    with torch.no_grad():
        K_ref = ref(X, X).to_dense()
    assert torch.allclose(kernel_matrix(kernel, X, X, 0.3), K_ref, atol=1e-10)
    rbf = gpytorch.kernels.RBFKernel().double()
    rbf.lengthscale = 0.3
    with torch.no_grad():
        assert torch.allclose(kernel_matrix("rbf", X, X, 0.3), rbf(X, X).to_dense(), atol=1e-10)


@pytest.mark.parametrize("kernel", ["rbf", "matern12", "matern32", "matern52"])
def test_rff_covariance_approximates_the_kernel(kernel):
    # E[φ(x)ᵀφ(x')] = k(x, x'); with D = 40,000 features the entrywise error has std <= 1/√D·√2 ≈ 0.007.
    X = torch.tensor([[0.0, 0.0], [0.1, 0.0], [0.2, 0.1], [0.0, 0.3], [0.5, 0.5]], dtype=torch.float64)
    ls = 0.2
    phi = rff_features(X, kernel=kernel, lengthscale=ls, num_features=40_000, seed=3)
    K = kernel_matrix(kernel, X, X, ls)
    assert (phi @ phi.T - K).abs().max() < 0.04
    # a wrong scaling of the spectral density (lengthscale off by √2) is far outside that tolerance
    assert (kernel_matrix(kernel, X, X, ls * math.sqrt(2.0)) - K).abs().max() > 0.1


@pytest.mark.parametrize("method", ["exact", "rff"])
def test_sample_covariance_over_seeds(method):
    # The empirical covariance of many draws approximates k: 3,000 draws, std of an entry <= √(2/3000) ≈ 0.026.
    X = torch.tensor([[0.0], [0.15], [0.3], [0.9]], dtype=torch.float64)
    F = torch.stack([gp_sample(X, kernel="matern52", lengthscale=0.3, seed=s, method=method, num_features=256,
                               outputscale=2.0) for s in range(3000)])
    emp = F.T @ F / F.shape[0]
    assert (emp - 2.0 * kernel_matrix("matern52", X, X, 0.3)).abs().max() < 0.2


def test_gp_sample_determinism_dtype_device(device):
    X = random_arms(300, 2, seed=0, dtype=torch.float32, device=device)
    for method in ("exact", "rff"):
        a = gp_sample(X, lengthscale=0.2, seed=5, method=method)
        assert a.dtype == torch.float32 and a.device.type == device.type and a.shape == (300,)
        assert torch.equal(a, gp_sample(X, lengthscale=0.2, seed=5, method=method))
        assert not torch.allclose(a, gp_sample(X, lengthscale=0.2, seed=6, method=method))


def test_gp_sample_auto_switches_to_rff():
    small, big = random_arms(100, 2, seed=0), random_arms(5000, 2, seed=0)
    assert torch.equal(gp_sample(small, seed=1), gp_sample(small, seed=1, method="exact"))
    assert torch.equal(gp_sample(big, seed=1), gp_sample(big, seed=1, method="rff"))


def test_gp_sample_smoothness_follows_lengthscale():
    # neighbours closer than ℓ/10 differ much less than random pairs (a sample, not white noise)
    X = grid_arms(400, 1)
    f = gp_sample(X, lengthscale=0.2, seed=0)
    assert (f[1:] - f[:-1]).abs().max() < 0.2 * float(f.std())


def test_gp_sample_bad_inputs():
    X = random_arms(5, 2)
    for kwargs, msg in [
        ({"kernel": "laplace"}, "kernel"),
        ({"lengthscale": -1.0}, "lengthscale"),
        ({"method": "svd"}, "method"),
        ({"num_features": 0}, "num_features"),
        ({"outputscale": 0.0}, "outputscale"),
    ]:
        with pytest.raises(InputDataError, match=msg):
            gp_sample(X, **kwargs)
    with pytest.raises(InputDataError):
        gp_sample(torch.zeros(5), lengthscale=0.2)
    with pytest.raises(InputDataError):
        gp_sample(torch.full((3, 2), float("nan")))


# ---------------------------------------------------------------------------------------- arm sets
def test_arm_sets():
    G = grid_arms(5, 3, dtype=torch.float32)
    assert G.shape == (125, 3) and G.dtype == torch.float32
    assert torch.unique(G[:, 0]).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert torch.unique(G, dim=0).shape[0] == 125
    R = random_arms(1000, 4, seed=2)
    assert R.shape == (1000, 4) and float(R.min()) >= 0.0 and float(R.max()) < 1.0
    assert torch.equal(R, random_arms(1000, 4, seed=2)) and not torch.equal(R, random_arms(1000, 4, seed=3))
    for bad in [(0, 2), (3, 0), (2.5, 2), (True, 2)]:
        with pytest.raises(InputDataError):
            random_arms(*bad)
        with pytest.raises(InputDataError):
            grid_arms(*bad)
    with pytest.raises(InputDataError, match="dtype"):
        random_arms(3, 2, dtype=torch.int32)


# ---------------------------------------------------------------------------------------- problems
def _branin(x1, x2):
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def test_botorch_problem_is_negated_on_unit_cube():
    p = botorch_problem("branin", A=50, seed=4, noise_std=0.3)
    assert p.arms.shape == (50, 2) and p.noise_std == 0.3 and float(p.arms.min()) >= 0 and float(p.arms.max()) <= 1
    for u, v in zip(p.arms[:5].tolist(), p.values[:5].tolist()):
        assert math.isclose(v, -_branin(-5 + 15 * u[0], 15 * u[1]), rel_tol=1e-12)
    h = botorch_problem("hartmann6", A=2000, seed=0)
    assert h.arms.shape == (2000, 6) and 0 < float(h.values.max()) <= 3.32237
    assert botorch_problem("ackley", A=10, dim=5).arms.shape == (10, 5)
    assert torch.equal(botorch_problem("levy", A=30, seed=1).values, botorch_problem("levy", A=30, seed=1).values)
    obj = p.objective(seed=0)
    assert torch.equal(obj.values, p.values)


def test_botorch_problem_bad_inputs():
    with pytest.raises(InputDataError) as e:
        botorch_problem("hartmann7")
    assert all(n in str(e.value) for n in BOTORCH_PROBLEMS)
    with pytest.raises(InputDataError, match="dim"):
        botorch_problem("branin", dim=3)
    with pytest.raises(InputDataError, match="noise_std"):
        botorch_problem("branin", noise_std=-1.0)


def test_anchor_problem_contract():
    arms, values, noise_std, name = anchor_problem()
    assert name == "anchor" and noise_std == 0.1
    # the documented draw: arms are the first 2,000 uniforms of numpy's default_rng(0)
    assert torch.equal(arms, torch.tensor(np.random.default_rng(0).uniform(size=(1000, 2))))
    assert abs(float(values.mean())) < 1e-12 and abs(float(values.std(unbiased=False)) - 1) < 1e-12
    # a smooth sample at lengthscale 0.2: very close arms have close values, far ones need not
    d = torch.cdist(arms, arms)
    close = (d < 0.01) & (d > 0)
    diff = (values[:, None] - values[None, :]).abs()
    assert float(diff[close].max()) < 0.3 and float(diff.max()) > 3.0
    a32 = anchor_problem(dtype=torch.float32)
    assert a32.arms.dtype == torch.float32 and torch.allclose(a32.values.double(), values, atol=1e-6)
    assert torch.equal(anchor_problem().values, values)
