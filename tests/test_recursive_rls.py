"""Recursive RLS (Musco & Musco Algorithm 2, 003 Lemma 3.8) and λ_max of the Nyström residual."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import rbf
from torchbkb import nystrom_lambda_max, recursive_rls
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel
from torchbkb.sampling.recursive_rls import ridge_scores
from torchbkb.gp.kernels import as_kernel


def _pts(n, d=2, seed=100, dtype=torch.float64):
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# ----------------------------------------------------------------------------- λ_max
def _reference_lambda_max(X, S, ls):
    """Independent: top eigenvalue of K_X - K_XS K_S⁻¹ K_SX (S well separated, K_S invertible)."""
    K_xs, K_ss = rbf(X, S, ls), rbf(S, S, ls)
    R = rbf(X, X, ls) - K_xs @ torch.linalg.solve(K_ss, K_xs.T)
    return float(torch.linalg.eigvalsh(0.5 * (R + R.T))[-1])


def test_lambda_max_matches_the_definition_dense_and_lanczos():
    X = _pts(120)
    S = X[:8]
    ref = _reference_lambda_max(X, S, 0.3)
    k = GaussianKernel(0.3)
    assert nystrom_lambda_max(X, k, S, method="dense") == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert nystrom_lambda_max(X, k, S, method="lanczos", tol=1e-10) == pytest.approx(ref, rel=1e-7)
    # empty dictionary: the top eigenvalue of K_X; full dictionary: nothing left
    top = float(torch.linalg.eigvalsh(rbf(X, X, 0.3))[-1])
    assert nystrom_lambda_max(X, k, None, method="lanczos") == pytest.approx(top, rel=1e-6)
    assert nystrom_lambda_max(X, k, X[:0], method="lanczos") == pytest.approx(top, rel=1e-6)
    assert nystrom_lambda_max(X, k, X, method="lanczos") < 1e-9


def test_lambda_max_float32(dtype):
    X64 = _pts(90)
    ref = _reference_lambda_max(X64, X64[:6], 0.3)
    got = nystrom_lambda_max(X64.to(dtype), GaussianKernel(0.3), X64[:6].to(dtype), method="lanczos")
    assert got == pytest.approx(ref, rel=1e-6 if dtype == torch.float64 else 1e-3)


def test_lanczos_never_forms_n_by_n(monkeypatch):
    """The sparse path: kernel blocks of at most chunk_size rows, factorizations of at most max(m, max_iter)."""
    n, chunk, m = 300, 64, 10
    X = _pts(n)
    blocks = []
    base = GaussianKernel(0.3)

    def kern(A, B):
        blocks.append((A.shape[-2], B.shape[-2]))
        return base(A, B)

    sizes = []
    for name in ["eigh", "eigvalsh", "cholesky", "cholesky_ex", "solve", "inv", "svd", "qr"]:
        fn = getattr(torch.linalg, name)

        def spy(A, *args, _fn=fn, **kw):
            sizes.append(max(A.shape[-2:]))
            return _fn(A, *args, **kw)

        monkeypatch.setattr(torch.linalg, name, spy)
    val = nystrom_lambda_max(X, as_kernel(kern, diag=base.diag), X[:m], method="lanczos", chunk_size=chunk, max_iter=40)
    assert val > 0
    assert sizes and max(sizes) <= 40
    assert max(min(b) for b in blocks) <= chunk  # no block is n x n
    assert all(not (r == n and c == n) for r, c in blocks)


# ----------------------------------------------------------------------------- the sampler
def test_scores_are_ridge_leverage_scores_when_the_dictionary_is_everything():
    """(k_ii - k_iᵀ (K + τ²I)⁻¹ k_i)/τ² = [K (K + τ²I)⁻¹]_ii (weights 1)."""
    X = _pts(60)
    lam = 0.05
    K = rbf(X, X, 0.3)
    exact = torch.diagonal(K @ torch.linalg.inv(K + lam * torch.eye(60, dtype=torch.float64)))
    got = ridge_scores(as_kernel(GaussianKernel(0.3)), X, X, torch.ones(60, dtype=torch.float64), lam, 16)
    assert torch.allclose(got, exact, atol=1e-10)


def test_weighted_scores_follow_algorithm_2_line_5():
    """(3/2λ)(K - KŜ(ŜᵀKŜ + λI)⁻¹ŜᵀK)_ii with the weighted sampling matrix Ŝ = S·W, formed densely."""
    X = _pts(40)
    lam = 0.02
    sel = torch.tensor([1, 5, 9, 20, 33])
    w = torch.tensor([1.0, 1.5, 2.0, 1.2, 3.0], dtype=torch.float64)
    Shat = torch.zeros(40, 5, dtype=torch.float64)
    Shat[sel, torch.arange(5)] = w
    K = rbf(X, X, 0.3)
    inner = torch.linalg.solve(Shat.T @ K @ Shat + lam * torch.eye(5, dtype=torch.float64), Shat.T @ K)
    ref = torch.diagonal(K - K @ Shat @ inner) / lam
    got = ridge_scores(as_kernel(GaussianKernel(0.3)), X, X[sel], w, lam, 7)
    assert torch.allclose(got, ref, atol=1e-10)


def test_small_sets_are_kept_whole():
    X = _pts(20)
    res = recursive_rls(X, GaussianKernel(0.3), 0.01, base_size=20, seed=0)
    assert res.levels == 0 and torch.equal(res.indices, torch.arange(20))
    assert torch.all(res.weights == 1) and torch.all(res.probabilities == 1)
    theory = recursive_rls(X, GaussianKernel(0.3), 0.01, oversample="theory", seed=0)  # 20 <= 192 log(300)
    assert theory.levels == 0 and theory.indices.numel() == 20


def test_theory_constants_recurse_and_meet_lemma_3_8():
    X = _pts(1300, d=1, seed=7)
    delta = 0.03  # base case 192·log(3/δ) ≈ 884 < 1300: one level of recursion
    res = recursive_rls(X, GaussianKernel(0.3), 1.0, oversample="theory", delta=delta, seed=1)
    assert res.levels >= 1
    assert 0 < res.indices.numel() <= 1300  # the worst-case constants keep nearly everything
    assert torch.all(res.weights >= 1) and torch.allclose(res.weights, res.probabilities.rsqrt())
    assert nystrom_lambda_max(X, GaussianKernel(0.3), X[res.indices]) <= 1.0


@pytest.mark.parametrize("d,ls,lam", [(1, 0.1, 0.01), (2, 0.3, 0.01), (2, 0.2, 0.1)])
def test_lambda_max_below_noise_in_most_runs(d, ls, lam):
    """Lemma 3.8 with the practical constants: λ_max <= τ² in at least 9 runs out of 10, with m < n."""
    k = GaussianKernel(ls)
    ok, sizes = 0, []
    for s in range(10):
        X = _pts(200, d=d, seed=1000 + s)
        res = recursive_rls(X, k, lam, seed=s)
        ok += nystrom_lambda_max(X, k, X[res.indices], method="lanczos", tol=1e-4) <= lam
        sizes.append(res.indices.numel())
    assert ok >= 9
    assert sum(sizes) / len(sizes) < 200


def test_reproducible_generator_advances_and_float32(dtype):
    X = _pts(150, dtype=dtype)
    a = recursive_rls(X, GaussianKernel(0.2), 0.01, seed=5)
    b = recursive_rls(X, GaussianKernel(0.2), 0.01, seed=5)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)
    g = torch.Generator().manual_seed(5)
    c = recursive_rls(X, GaussianKernel(0.2), 0.01, generator=g)
    assert torch.equal(c.indices, a.indices)
    d = recursive_rls(X, GaussianKernel(0.2), 0.01, generator=g)  # the state moved on
    assert not torch.equal(g.get_state(), torch.Generator().manual_seed(5).get_state())
    assert d.indices.numel() > 0
    assert a.indices.dtype == torch.long and a.indices.unique().numel() == a.indices.numel()
    assert bool((a.indices[1:] > a.indices[:-1]).all())


def test_inclusion_probabilities_are_honest():
    """Horvitz-Thompson: at the top level x_i is kept with probability p_i, so Σ_{kept} 1/p_i = Σ_{kept} w_i²
    is an unbiased estimate of n whatever the (random) leverage estimates were."""
    X = _pts(80, d=1, seed=3)
    k = GaussianKernel(0.15)
    est = []
    for s in range(200):
        res = recursive_rls(X, k, 0.05, oversample=0.5, base_size=30, seed=s)
        assert res.levels >= 1
        est.append(float((res.weights**2).sum()))
    est = torch.tensor(est, dtype=torch.float64)
    se = float(est.std()) / math.sqrt(est.numel())
    assert abs(float(est.mean()) - 80) <= 5 * se + 1e-9
    assert float(est.std()) > 0  # really random: some p_i < 1


# ----------------------------------------------------------------------------- bad inputs
@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(
        [
            (dict(X=torch.rand(5)), "X"),
            (dict(X=torch.rand(2, 5, 2)), "X"),
            (dict(X=torch.tensor([[0.0, float("nan")]])), "finite"),
            (dict(X=torch.zeros(0, 2)), "at least 1"),
            (dict(noise=0.0), "noise"),
            (dict(noise=-1.0), "noise"),
            (dict(oversample="lots"), "oversample"),
            (dict(oversample=0.0), "oversample"),
            (dict(oversample=True), "oversample"),
            (dict(delta=0.5), "delta"),
            (dict(delta=0.0), "delta"),
            (dict(base_size=0), "base_size"),
            (dict(base_size=2.5), "base_size"),
            (dict(chunk_size=0), "chunk_size"),
            (dict(generator="g"), "generator"),
        ]
    )
)
def test_bad_inputs_raise_and_do_not_consume_randomness(case):
    kw, msg = case
    args = dict(X=torch.rand(10, 2, dtype=torch.float64), noise=0.1)
    args.update(kw)
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    X, noise = args.pop("X"), args.pop("noise")
    args.setdefault("generator", g)
    with pytest.raises(InputDataError, match=msg):
        recursive_rls(X, GaussianKernel(0.3), noise, **args)
    assert torch.equal(state, g.get_state())


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(method="qr"), "method"),
        (dict(tol=0.0), "tol"),
        (dict(atol=-1.0), "atol"),
        (dict(max_iter=0), "max_iter"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(inducing_points=torch.rand(3, 3, dtype=torch.float64)), "trailing dimension"),
        (dict(inducing_points=torch.rand(3, 2, dtype=torch.float32)), "dtype"),
    ],
)
def test_lambda_max_bad_inputs(kw, msg):
    X = torch.rand(10, 2, dtype=torch.float64)
    S = kw.pop("inducing_points", X[:2])
    with pytest.raises(InputDataError, match=msg):
        nystrom_lambda_max(X, GaussianKernel(0.3), S, **kw)
