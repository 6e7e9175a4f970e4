import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import tol
from helpers import close, exact_gp, rbf
from torchbkb import ExactPosterior
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

LS = 0.25


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    y = torch.cos(4 * X[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y, torch.rand(20, 2, generator=g, dtype=torch.float64)


def test_matches_formula(dtype, device):
    X, y, Xq = _data()
    lam = 0.03
    post = ExactPosterior(GaussianKernel(LS), lam).to(device).fit(X.to(device, dtype), y.to(device, dtype))
    m_ref, cov_ref = exact_gp(rbf(X, X, LS), rbf(X, Xq, LS), rbf(Xq, Xq, LS), y, lam)
    mean, var = post(Xq.to(device, dtype))
    assert mean.dtype == dtype
    assert (close(mean.double().cpu(), m_ref, 10 * tol(dtype))
            and close(var.double().cpu(), cov_ref.diagonal(), 10 * tol(dtype)))
    jm, jc = post.joint(Xq.to(device, dtype))
    assert close(jc.double().cpu(), cov_ref, 10 * tol(dtype))
    assert close(post.rls(Xq.to(device, dtype)).double().cpu(), cov_ref.diagonal() / lam, 1e3 * tol(dtype))


def test_growth_equals_refit_and_watch_tracks_arms():
    X, y, Xq = _data(n=60)
    post = ExactPosterior(GaussianKernel(LS), 0.01).fit(X[:5], y[:5])
    post.watch(Xq)
    for i in range(5, 60):
        post.update(X[i], y[i])
    ref = ExactPosterior(GaussianKernel(LS), 0.01).fit(X, y)
    assert close(post.L, ref.L, 1e-9)
    for a, b in zip(post(Xq), ref(Xq)):
        assert close(a, b, 1e-9)
    for a, b in zip(post.watched(), ref(Xq)):
        assert close(a, b, 1e-9)


def test_counts_equal_repeated_rows():
    X, y, Xq = _data(n=6)
    c = torch.tensor([1.0, 2.0, 3.0, 1.0, 1.0, 2.0], dtype=torch.float64)
    rep = c.long()
    a = ExactPosterior(GaussianKernel(LS), 0.1).fit(X, y, c)
    b = ExactPosterior(GaussianKernel(LS), 0.1).fit(X.repeat_interleave(rep, 0), y.repeat_interleave(rep))
    for u, v in zip(a(Xq), b(Xq)):
        assert close(u, v, 1e-10)


def test_hallucination_freezes_mean_and_shrinks_variance_exactly():
    X, y, Xq = _data()
    post = ExactPosterior(GaussianKernel(LS), 0.05).fit(X[:20], y[:20])
    post.watch(Xq)
    m0 = post.mean(Xq)
    post.update(X[20:25])  # y=None
    assert close(post.mean(Xq), m0, 1e-10) and close(post.watched()[0], m0, 1e-10)
    # exact variance with the pending points in the design (rewards do not matter for the variance)
    ref = ExactPosterior(GaussianKernel(LS), 0.05).fit(X[:25], torch.zeros(25, dtype=torch.float64))
    assert close(post(Xq)[1], ref(Xq)[1], 1e-10) and close(post.watched()[1], ref(Xq)[1], 1e-10)


def test_log_det_is_sum_of_log_one_plus_sequential_variances():
    X, y, _ = _data(n=15)
    lam = 0.1
    post = ExactPosterior(GaussianKernel(LS), lam).fit(X[:0], y[:0])
    acc = 0.0
    for i in range(15):
        acc += float(torch.log1p(post.rls(X[i : i + 1])[0]))
        post.update(X[i], y[i])
    K = rbf(X, X, LS)
    ref = torch.logdet(torch.eye(15, dtype=torch.float64) + K / lam)
    assert float(post.log_det()) == pytest.approx(float(ref), abs=1e-9)
    assert acc == pytest.approx(float(ref), abs=1e-9)


def test_batch_queries():
    X, y, Xq = _data()
    post = ExactPosterior(GaussianKernel(LS), 0.05).fit(X, y)
    mb, vb = post(Xq.reshape(4, 5, 2))
    assert mb.shape == (4, 5) and close(vb.reshape(-1), post(Xq)[1], 1e-12)


def _bad_cases():
    X, y, _ = _data(n=5)
    nan = X.clone()
    nan[0, 0] = float("nan")
    return [
        ((nan, y, None), "NaN/inf"),
        ((X, y[:3], None), r"y: expected shape \(5,\)"),
        ((X, torch.full_like(y, float("inf")), None), "y: expected finite"),
        ((X.float(), y.float(), None), "expected dtype torch.float64"),
        ((X, y, torch.zeros(5, dtype=torch.float64)), "counts: expected positive"),
        ((X[:, :1], y, None), "trailing dimension d=2"),
        ((X[None], y[None], None), r"expected shape \(n, d\)"),
    ]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(_bad_cases()))
def test_bad_updates_leave_state_unchanged(case):
    (X, y, counts), msg = case
    Xg, yg, Xq = _data(n=10, seed=2)
    post = ExactPosterior(GaussianKernel(LS), 0.05).fit(Xg, yg)
    post.watch(Xq)
    before = (post.L.clone(), post.Liy.clone(), post.watched()[1].clone(), post.num_train)
    with pytest.raises(InputDataError, match=msg):
        post.update(X, y, counts)
    assert torch.equal(before[0], post.L) and torch.equal(before[1], post.Liy)
    assert torch.equal(before[2], post.watched()[1]) and before[3] == post.num_train


def test_unfitted_and_bad_noise():
    with pytest.raises(InputDataError, match="fit"):
        ExactPosterior(GaussianKernel(1.0), 0.1)(torch.rand(2, 2))
    with pytest.raises(InputDataError, match="noise"):
        ExactPosterior(GaussianKernel(1.0), -0.1)


def test_observe_gives_hallucinated_rows_their_rewards_like_a_refit():
    X, y, Xq = _data(n=30)
    c = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0], dtype=torch.float64)
    post = ExactPosterior(GaussianKernel(LS), 0.05).fit(X[:20], y[:20])
    post.watch(Xq)
    post.update(X[20:25], None, c)  # hallucinated, mean frozen
    post.update(X[25:27], y[25:27])  # observed rows after the hallucinated ones
    post.observe(torch.tensor([22, 20, 24, 21, 23]), y[[22, 20, 24, 21, 23]])
    counts = torch.cat([torch.ones(20, dtype=torch.float64), c, torch.ones(2, dtype=torch.float64)])
    ref = ExactPosterior(GaussianKernel(LS), 0.05).fit(X[:27], y[:27], counts)
    for a, b in zip(post(Xq), ref(Xq)):
        assert close(a, b, 1e-9)
    for a, b in zip(post.watched(), ref(Xq)):
        assert close(a, b, 1e-9)
    before = post.Liy.clone()
    with pytest.raises(InputDataError, match=r"rows: expected positions in \[0, 27\)"):
        post.observe(torch.tensor([27]), y[:1])
    with pytest.raises(InputDataError, match="y: expected shape"):
        post.observe(torch.tensor([1, 2]), y[:1])
    assert torch.equal(before, post.Liy)


def test_truncate_undoes_rows_and_growth_continues():
    X, y, Xq = _data(n=30)
    post = ExactPosterior(GaussianKernel(LS), 0.05).fit(X[:10], y[:10])
    post.watch(Xq)
    post.update(X[10:18])  # hallucinated
    post.update(X[18:20], y[18:20])
    post.truncate(10)
    post.update(X[20:30], y[20:30])
    keep = torch.cat([torch.arange(10), torch.arange(20, 30)])
    ref = ExactPosterior(GaussianKernel(LS), 0.05).fit(X[keep], y[keep])
    assert post.num_train == 20
    for a, b in zip(post.watched(), ref(Xq)):
        assert close(a, b, 1e-9)
    for a, b in zip(post(Xq), ref(Xq)):
        assert close(a, b, 1e-9)
    with pytest.raises(InputDataError, match=r"n: expected an integer in \[0, 20\]"):
        post.truncate(21)


def test_repeat_last_equals_a_second_hallucinated_row():
    g = torch.Generator().manual_seed(4)
    X = torch.rand(12, 2, generator=g, dtype=torch.float64)
    y = torch.sin(3 * X[:, 0])
    arms = torch.rand(40, 2, generator=g, dtype=torch.float64)
    k = GaussianKernel(0.4)
    a = ExactPosterior(k, noise=0.05).fit(X[:8], y[:8])
    b = ExactPosterior(k, noise=0.05).fit(X[:8], y[:8])
    a.watch(arms)
    b.watch(arms)
    for _ in range(3):  # x hallucinated 3 times: one row with count 3, or three rows
        b.update(X[9], None)
    a.update(X[9], None)
    a.repeat_last()
    a.repeat_last()
    assert a.num_train == 9 and b.num_train == 11
    for u, v in zip(a.watched(), b.watched()):
        assert torch.allclose(u, v, rtol=0, atol=1e-12)
    for u, v in zip(a(arms), b(arms)):
        assert torch.allclose(u, v, rtol=0, atol=1e-12)
    # the rewards arrive: the merged row gets their mean
    r = torch.tensor([0.3, -0.1, 0.7], dtype=torch.float64)
    a.observe(torch.tensor([8]), r.mean().reshape(1))
    b.observe(torch.tensor([8, 9, 10]), r)
    for u, v in zip(a.watched(), b.watched()):
        assert torch.allclose(u, v, rtol=0, atol=1e-12)


def test_repeat_last_rejects_an_observed_row_and_an_empty_posterior():
    k = GaussianKernel(0.4)
    X = torch.rand(5, 2, dtype=torch.float64)
    post = ExactPosterior(k, noise=0.05).fit(X, torch.ones(5, dtype=torch.float64))
    post.watch(X)
    before = [t.clone() for t in post.watched()] + [post.L.clone()]
    with pytest.raises(InputDataError, match="hallucinated"):
        post.repeat_last()
    after = list(post.watched()) + [post.L]
    assert all(torch.equal(u, v) for u, v in zip(before, after))
    empty = ExactPosterior(k, noise=0.05).fit(X[:0], X.new_zeros(0))
    with pytest.raises(InputDataError, match="at least one row"):
        empty.repeat_last()
