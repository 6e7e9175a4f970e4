"""beta="practical": the widths of the authors' code (batch-bkb, bkb_lib.py), recomputed by hand.

BKB:  βₜ = √λ F + ξ √(Σ_i n_i σ̃²ₜ(x_i) log t + log 1/δ)              (BKB._update_beta)
BBKB: β  = √λ F + ξ √(C̃ L + log 1/δ),  L += Σ_batch log(1 + σ̃²_fb)    (Batch_BKB.update; the
      initialization with one arm contributes Σ n σ̃² log 1 = 0)
The variances come from independent float64 formulas (000 Eq. 4 on the bandit's dictionary, the exact GP),
not from the bandit.
"""

import math

import pytest
import torch

from helpers import bkb_eq4, exact_gp, rbf
from torchbkb import BBKB, BKB, GPBUCB, GPUCB
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

LS, LAM, F, DELTA, XI = 0.25, 0.05, 2.0, 0.05, 0.3

pytestmark = pytest.mark.usefixtures("one_thread")


def _problem(A=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(A, 2, generator=g, dtype=torch.float64)
    f = torch.sin(5 * X[:, 0]) * torch.cos(3 * X[:, 1]) + 0.1 * torch.randn(A, generator=g, dtype=torch.float64)
    return X, f


def _bkb_width(deff, t):
    log_t = math.log(t) if t > 1 else 0.0
    return math.sqrt(LAM) * F + XI * math.sqrt(deff * log_t + math.log(1 / DELTA))


def _dtc_rls(X, bandit):
    """σ̃² of every arm under 000 Eq. 4 on the bandit's dictionary and history (one row per pull)."""
    S = X[bandit.dictionary]
    rows = X[torch.tensor(bandit.history["index"])]
    y = torch.tensor(bandit.history["reward"], dtype=torch.float64)
    _, rls = bkb_eq4(rbf(S, S, LS), rbf(rows, S, LS), rbf(X, S, LS), torch.ones(X.shape[0], dtype=torch.float64), y,
                     LAM)
    return rls


def _exact_rls(X, rows):
    """σ² / λ of every arm under the exact GP on ``rows`` (arm indices, one per observation)."""
    if not rows:
        return torch.ones(X.shape[0], dtype=torch.float64) / LAM
    R = X[torch.tensor(rows)]
    _, cov = exact_gp(rbf(R, R, LS), rbf(R, X, LS), rbf(X, X, LS), torch.zeros(len(rows), dtype=torch.float64), LAM)
    return cov.diagonal() / LAM


def test_bkb_practical_width_is_the_authors_formula_on_eq4_variances():
    X, f = _problem()
    bandit = BKB(X, GaussianKernel(LS), noise=LAM, beta="practical", F=F, delta=DELTA, noise_std=XI, seed=3, q_bar=3.0)
    for _ in range(40):
        if bandit.t:
            rls = _dtc_rls(X, bandit)
            deff = float((bandit.counts.double() * rls).sum())
            expected = _bkb_width(deff, bandit.t)
        else:
            expected = _bkb_width(0.0, 0)
        i = bandit.ask()
        assert math.isclose(bandit.beta, expected, rel_tol=1e-9)
        if bandit.t:
            mean = bandit.scores()[0]
            assert int(i) == int(torch.argmax(mean + expected * rls.sqrt()))
        bandit.tell(i, f[i])


def test_gpucb_practical_width_uses_the_exact_variances():
    X, f = _problem(seed=2)
    bandit = GPUCB(X, GaussianKernel(LS), noise=LAM, beta="practical", F=F, delta=DELTA, noise_std=XI, seed=0)
    for _ in range(25):
        rls = _exact_rls(X, bandit.history["index"])
        deff = float((bandit.counts.double() * rls).sum())
        i = bandit.ask()
        assert math.isclose(bandit.beta, _bkb_width(deff, bandit.t), rel_tol=1e-9)
        bandit.tell(i, f[i])


@pytest.mark.parametrize("cls, seeds, C, T, batch_start_rls", [
    (BBKB, (1, 2), 3.0, 150, lambda X, b: _dtc_rls(X, b) if b.t else None),  # 000 Eq. 4 on the batch's dictionary
    (GPBUCB, (3, 0), 2.5, 60, lambda X, b: _exact_rls(X, b.history["index"])),
])
def test_batched_practical_width_sums_the_batch_start_variances(cls, seeds, C, T, batch_start_rls):
    X, f = _problem(seed=seeds[0])
    bandit = cls(X, GaussianKernel(LS), noise=LAM, beta="practical", batch_bound=C, F=F, delta=DELTA, noise_std=XI,
                 seed=seeds[1])
    L, first = 0.0, True
    while bandit.t < T:
        rls_fb = batch_start_rls(X, bandit)
        batch = bandit.ask()
        assert math.isclose(bandit.beta, math.sqrt(LAM) * F + XI * math.sqrt(C * L + math.log(1 / DELTA)), rel_tol=1e-9)
        bandit.tell(batch, f[batch])
        if not first:
            L += float(torch.log1p(rls_fb[batch]).sum())
        first = False
    assert math.isclose(bandit.practical_sum, L, rel_tol=1e-9)
    assert max(bandit.batch_sizes) > 1


def test_practical_bbkb_resumes_identically():
    X, f = _problem(seed=4)
    make = lambda: BBKB(X, GaussianKernel(LS), noise=LAM, beta="practical", batch_bound=3.0, seed=5)  # noqa: E731
    a = make()
    while a.t < 60:
        batch = a.ask(); a.tell(batch, f[batch])  # noqa: E702
    b = make()
    b.load_state_dict(a.state_dict())
    for _ in range(5):
        ba, bb = a.ask(), b.ask()
        assert torch.equal(ba, bb) and a.beta == b.beta
        a.tell(ba, f[ba]); b.tell(bb, f[bb])  # noqa: E702


@pytest.mark.parametrize("beta", ["Practical", "authors", ""])
def test_unknown_width_names_are_rejected(beta):
    X, _ = _problem(A=10)
    with pytest.raises(InputDataError, match="'theory' or 'practical'"):
        BKB(X, GaussianKernel(LS), noise=LAM, beta=beta)
