"""One owner of the DTC state: a :class:`DTCFit` is fitted, updated and scored by the formulas (float64), is never
written in place, and every DTC posterior -- points, an arm set, BKBModel's engine -- holds its fit as one, so a
loaded state dict, a move or a shallow copy never leaves anything derived from an old fit behind."""

import copy
import pickle

import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import close
from torchbkb import BKB, DTCPosterior, NystromEmbedding
from torchbkb.errors import InputDataError
from torchbkb.gp.dtc_fit import FIT_TENSORS, DTCFit
from torchbkb.gp.functional import ridge_solve, scoring_operator
from torchbkb.gp.kernels import GaussianKernel

F64 = torch.float64
LAM = 0.05


def _problem(n=25, m=6, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=F64)
    y = torch.sin(5 * X.sum(-1))
    counts = torch.randint(1, 4, (n,), generator=g).to(F64)
    emb = NystromEmbedding(GaussianKernel(0.4), X[:m])
    return emb, X, y, counts


def _fit_of(emb, X, y, counts):
    Z = emb(X).to(F64)
    return DTCFit.from_features(emb.projection, lambda i, j: Z[i:j], X.shape[0], counts, y, LAM, dtype=F64,
                                batch=torch.Size(), device=X.device, step=7)


def test_a_fit_is_the_ridge_formula_whichever_way_it_is_made():
    emb, X, y, counts = _problem()
    Z = emb(X)  # (n, r)
    ZtZ, Zty = (Z.T * counts) @ Z, Z.T @ (counts * y)
    V_inv, w = ridge_solve(ZtZ, Zty, LAM)
    by_features = _fit_of(emb, X, y, counts)
    by_rows = DTCFit.from_kernel_rows(emb.projection, Z.T, counts, counts * y, LAM)
    for fit in (by_features, by_rows):
        assert close(fit.V_inv, V_inv, 1e-10) and close(fit.weights, w, 1e-10)
        assert close(fit.ZtZ, ZtZ, 1e-12) and close(fit.Zty, Zty, 1e-12)
        M, a = fit.operator(LAM)
        M_ref, a_ref = scoring_operator(emb.projection, V_inv, w, LAM)
        assert close(M, M_ref, 1e-8) and close(a, a_ref, 1e-8)
    Xq = torch.rand(9, 2, dtype=F64)
    K, kdiag = emb.kernel(Xq, emb.inducing_points), emb.kernel_diag(Xq)
    Zq = emb(Xq)
    rls_ref = (kdiag - (Zq * Zq).sum(-1)) / LAM + ((Zq @ V_inv) * Zq).sum(-1)
    for mean, rls in (by_rows.score_rows(K, kdiag, LAM, 4), by_features.score_features(Zq, kdiag, LAM, 4)):
        assert close(mean, Zq @ w, 1e-8) and close(rls, rls_ref, 1e-8)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 7), hallucinated=st.booleans(), refactor_every=st.integers(1, 10), seed=st.integers(0, 99))
def test_an_update_is_the_refit_on_every_row_and_leaves_the_old_fit_as_it_was(k, hallucinated, refactor_every, seed):
    emb, X, y, counts = _problem(n=20 + k, seed=seed)
    old = _fit_of(emb, X[:20], y[:20], counts[:20])
    before = {name: t.clone() for name, t in old.tensors().items()}
    Z = emb(X[20:])
    new, downdate = old.updated(Z, None if hallucinated else y[20:], counts[20:], LAM, refactor_every=refactor_every)
    y_all = torch.cat([y[:20], Z @ old.weights]) if hallucinated else y  # a hallucinated reward is the mean
    ref = _fit_of(emb, X, y_all, counts)
    assert close(new.V_inv, ref.V_inv, 1e-8) and close(new.ZtZ, ref.ZtZ, 1e-10)
    if hallucinated:
        assert new.weights is old.weights  # the mean stays exactly
    else:
        assert close(new.weights, ref.weights, 1e-8)
    assert all(torch.equal(t, before[name]) for name, t in old.tensors().items())  # never written in place
    assert new.since_refactor == (0 if k > 4 or k >= refactor_every else k)
    assert (downdate is None) == (k != 1)
    if k == 1:  # every quadratic form follows: zᵀ V_new⁻¹ z = zᵀ V_old⁻¹ z - coef (zᵀ u)²
        q = emb(torch.rand(5, 2, dtype=F64))
        quad = lambda V: ((q @ V) * q).sum(-1)  # noqa: E731
        assert close(quad(new.V_inv), quad(old.V_inv) - downdate.coef * (q @ downdate.direction) ** 2, 1e-8)


def test_what_a_fit_derives_is_derived_once_per_lambda_and_kept_for_the_last_one():
    emb, X, y, counts = _problem()
    fit = _fit_of(emb, X, y, counts)
    made = []
    assert fit.derived("x", LAM, lambda: made.append(1) or "value") == fit.derived("x", LAM, made.clear) == "value"
    assert made == [1]
    M1, _ = fit.operator(LAM)
    assert fit.operator(LAM)[0] is M1
    M2, _ = fit.operator(2 * LAM)  # a changed noise: derived again, in the old one's place
    assert M2 is not M1 and close(M2, scoring_operator(emb.projection, fit.V_inv, fit.weights, 2 * LAM)[0])
    assert fit.operator(2 * LAM)[0] is M2 and fit.operator(LAM)[0] is not M1  # a noise trained step by step: no growth
    assert fit.moved(lambda t: t, emb.projection) is fit  # nothing moved: the same fit, with what it derived


def test_a_posterior_follows_a_loaded_state_dict():
    emb, X, y, counts = _problem()
    a = DTCPosterior(NystromEmbedding(emb.kernel, emb.inducing_points), noise=LAM).fit(X, y, counts)
    b = DTCPosterior(NystromEmbedding(emb.kernel, emb.inducing_points), noise=LAM).fit(X, -y, counts)
    Xq = torch.rand(6, 2, dtype=F64)
    assert not close(a(Xq)[0], b(Xq)[0])  # a's operator is derived before the load
    assert set(FIT_TENSORS) <= set(a.state_dict())  # the fit under its old names
    a.load_state_dict(b.state_dict())
    for u, v in zip(a(Xq), b(Xq)):
        assert torch.equal(u, v)
    a.load_state_dict(b.state_dict(keep_vars=True), strict=False)
    assert torch.equal(a(Xq)[0], b(Xq)[0])


def test_a_bad_state_dict_leaves_the_posterior_as_it_was():
    emb, X, y, counts = _problem()
    post = DTCPosterior(NystromEmbedding(emb.kernel, emb.inducing_points), noise=LAM).fit(X, y, counts)
    Xq = torch.rand(6, 2, dtype=F64)
    before, state = post(Xq), post.state_dict()
    for key, bad in (("V_inv", state["V_inv"][:-1]), ("weights", torch.full_like(state["weights"], float("nan"))),
                     ("ZtZ", None)):
        sd = {k: v.clone() for k, v in state.items()} | {"train_y": -state["train_y"]}
        if bad is None:
            del sd[key]
        else:
            sd[key] = bad
        with pytest.raises(InputDataError, match="state_dict"):
            post.load_state_dict(sd)
        assert all(torch.equal(u, v) for u, v in zip(post(Xq), before))
        assert torch.equal(post.train_y, y)


def test_copies_moves_and_pickles_keep_a_posterior_whole():
    emb, X, y, counts = _problem()
    post = DTCPosterior(NystromEmbedding(emb.kernel, emb.inducing_points), noise=LAM).fit(X[:20], y[:20], counts[:20])
    Xq = torch.rand(6, 2, dtype=F64)
    before = post(Xq)
    for twin in (copy.deepcopy(post), pickle.loads(pickle.dumps(post))):
        assert all(torch.equal(u, v) for u, v in zip(twin(Xq), before))
        twin.update(X[20:], y[20:], counts[20:])  # the twin's update never reaches the original
        assert not torch.equal(twin(Xq)[1], before[1])
        assert all(torch.equal(u, v) for u, v in zip(post(Xq), before))
    V_inv = post.V_inv
    assert post.to(F64).V_inv is V_inv  # a no-op .to() keeps the fit
    post.to(torch.float32)  # the points follow; the float64 fit is never rounded
    assert post.V_inv.dtype == F64 and torch.equal(post.V_inv, V_inv)
    assert close(post(Xq.float())[0].double(), before[0], 1e-3)


def test_a_bandit_s_posterior_is_its_fit_and_no_second_one():
    g = torch.Generator().manual_seed(3)
    arms = torch.rand(120, 2, generator=g, dtype=F64)
    bandit = BKB(arms, GaussianKernel(0.3), noise=0.1, beta=1.0, q_bar=2.0, seed=0)
    for _ in range(12):
        idx = bandit.ask()
        bandit.tell(idx, torch.sin(4 * arms[idx].sum(-1)))
    fit = bandit.row_posterior.fit
    assert isinstance(fit, DTCFit) and bandit.V_inverse() is fit.V_inv
    post = bandit.posterior  # the bandit's DTCPosterior: the same state, taken without a factorization
    assert torch.equal(post.V_inv, fit.V_inv) and torch.equal(post.weights, fit.weights)
    mean, rls = post.score_embedded(bandit.arm_features(), bandit.kdiag)
    means, rlss = bandit.scores()
    assert close(mean, means, 1e-8) and close(rls, rlss, 1e-8)


def test_a_posterior_and_a_model_pickled_before_dtc_fit_load_and_go_on():
    """``tests/data/pickled_before_dtc_fit.torch`` (its README): written by a452ad6, when the fit was four buffers."""
    from pathlib import Path

    saved = torch.load(Path(__file__).parent / "data" / "pickled_before_dtc_fit.torch", weights_only=False)
    post = saved["posterior"]
    mean, var = post(saved["Xq"])
    # the same formulas; another machine's BLAS may round the last bits differently
    assert close(mean, saved["mean"], 1e-12) and close(var, saved["var"], 1e-12)
    assert post.num_train == 27 and post.pending_X.shape[0] == 1
    assert set(FIT_TENSORS) <= set(post.state_dict())
    emb = post.embedding  # the same steps taken today: fit 25 points, add 2, hallucinate 1, add 2 more
    today = DTCPosterior(NystromEmbedding(emb.kernel, emb.inducing_points), noise=post.lam)
    today.fit(post.train_X[:25], post.train_y[:25]).update(post.train_X[25:], post.train_y[25:])
    today.update(post.pending_X)
    X, y = saved["update"]
    for p in (post, today):
        p.update(X, y)  # the old pickle goes on from where it was
    assert all(close(u, v, 1e-10) for u, v in zip(post(saved["Xq"]), today(saved["Xq"])))
    model = saved["model"]
    got = model.posterior(saved["Xm"])
    assert torch.equal(got.mean, saved["model_mean"]) and torch.equal(got.variance, saved["model_var"])
