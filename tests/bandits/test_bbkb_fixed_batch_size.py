"""BBKB with a fixed batch size (``batch_size``): distinct arms, GP-BUCB's batches, an exact continuation."""

import pytest
import torch

from bbkb_cases import LS, arms_and_values, make_bbkb, run_batches
from torchbkb.gp.kernels import GaussianKernel

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny operations: one intra-op thread (tests/conftest.py)


@pytest.mark.parametrize("prune", [True, False])
def test_a_fixed_batch_size_gives_distinct_batches_of_that_size(prune):
    arms, f = arms_and_values(A=400)
    b = make_bbkb(arms, batch_size=12, prune=prune)
    batches = run_batches(b, f, 121)
    assert batches[0] == batches[0][:1] and all(len(x) == 12 == len(set(x)) for x in batches[1:])
    ref = make_bbkb(arms, batch_size=12, prune=not prune)
    assert run_batches(ref, f, 121) == batches  # pruning changes the work, never the batches


def test_fixed_batches_are_gp_bucb_batches_with_every_pulled_arm_in_the_dictionary():
    arms, f = arms_and_values(A=200)
    b = make_bbkb(arms, batch_size=8, q_bar=1e9, beta=0.5)  # every pulled arm joins the dictionary
    run_batches(b, f, 25)
    idx = b.ask()
    pulled = (b.counts > 0).nonzero().squeeze(1)
    assert torch.equal(b.dictionary.sort().values, pulled.sort().values)
    lam, k = 0.01, GaussianKernel(LS)
    X, n = arms[pulled], b.counts[pulled].to(torch.float64)
    y = b.reward_sums[pulled] / n
    K = k(X, X) + lam * torch.diag(1.0 / n)
    L = torch.linalg.cholesky(K)
    Ka = k(arms, X)
    mu = Ka @ torch.cholesky_solve(y.unsqueeze(-1), L).squeeze(-1)
    W = torch.linalg.solve_triangular(L, Ka.T, upper=False)
    Sig = k(arms, arms) - W.T @ W
    picks = []
    for _ in range(8):
        ucb = mu + 0.5 * (Sig.diagonal().clamp_min(0) / lam).sqrt()
        ucb[picks] = -torch.inf
        p = int(ucb.argmax())
        picks.append(p)
        Sig = Sig - Sig[:, p : p + 1] @ Sig[p : p + 1, :] / (Sig[p, p] + lam)
    assert idx.tolist() == picks


def test_fixed_batch_checkpoint_resume_is_an_identical_continuation():
    arms, f = arms_and_values(A=250)
    a = make_bbkb(arms, batch_size=10)
    run_batches(a, f, 31)
    b = make_bbkb(arms, batch_size=10, seed=99)
    b.load_state_dict(a.state_dict())
    assert run_batches(a, f, 101) == run_batches(b, f, 101)
