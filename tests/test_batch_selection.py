import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import close
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.batch_selection import select_batch
from torchbkb.errors import InputDataError
from torchbkb.kernels import GaussianKernel


def _problem(seed=0, A=400, n=300, m=15, lam=1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, generator=g, dtype=torch.float64)
    pulled = torch.randint(0, A, (n,), generator=g)
    y = torch.sin(6 * arms[pulled, 0]) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    post = DTCPosterior(NystromEmbedding(GaussianKernel(0.2), arms[pulled[:m]].to(dtype)), noise=lam)
    post.fit(arms[pulled].to(dtype), y.to(dtype))
    Z = post.embedding(arms.to(dtype))
    kd = torch.ones(A, dtype=dtype)
    mean, rls = post.score_embedded(Z, kd)
    return arms.to(dtype), post, Z, mean, rls


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lazy_and_eager_give_identical_batches(seed, dtype):
    _, post, Z, mean, rls = _problem(seed, dtype=dtype)
    kw = dict(alpha=1.5, batch_bound=4.0, max_batch_size=200)
    lazy = select_batch(Z, mean, rls, post.V_inv, lazy=True, **kw)
    eager = select_batch(Z, mean, rls, post.V_inv, lazy=False, **kw)
    assert lazy.indices.tolist() == eager.indices.tolist()
    assert len(lazy.indices) > 1
    assert lazy.ucb_evaluations < eager.ucb_evaluations


def test_in_batch_variances_equal_a_refit_with_the_picks_hallucinated():
    arms, post, Z, mean, rls = _problem(1)
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=2.0, batch_bound=5.0)
    assert len(sel.indices) >= 4
    for k in range(len(sel.indices)):
        ref = DTCPosterior(post.embedding, noise=post.lam).fit(post.train_X, post.train_y)
        for j in sel.indices[:k]:
            ref.update(arms[j])  # y=None: hallucinated
        assert close(ref.rls(arms[sel.indices[k]][None])[0], sel.rls_in_batch[k], 1e-10)
        assert close(ref.mean(arms), mean, 1e-10)  # the mean is frozen


def test_batch_bound_one_gives_batches_of_one_and_the_ucb_argmax():
    _, post, Z, mean, rls = _problem(2)
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=1.0)
    assert sel.indices.tolist() == [int(torch.argmax(mean + rls.sqrt()))]


def test_termination_rule_and_cap():
    _, post, Z, mean, rls = _problem(3)
    C = 3.0
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=C)
    partial = 1.0 + torch.cumsum(sel.rls_start, 0)
    assert bool((partial[:-1] <= C).all()) and float(partial[-1]) > C  # the last pick crossed C̃
    prod = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=C, stop_rule="product")
    assert len(prod.indices) <= len(sel.indices)  # Weierstrass: 1 + Σ <= Π (1 + ·)
    capped = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=C, max_batch_size=2)
    assert capped.indices.tolist() == sel.indices[:2].tolist()


def test_long_batches_switch_to_the_direct_form_consistently():
    _, post, Z, mean, rls = _problem(4, m=6)
    a = select_batch(Z, mean, rls, post.V_inv, alpha=0.5, batch_bound=1e9, max_batch_size=40, lazy=True)
    b = select_batch(Z, mean, rls, post.V_inv, alpha=0.5, batch_bound=1e9, max_batch_size=40, lazy=False)
    assert a.indices.tolist() == b.indices.tolist() and len(a.indices) == 40 > Z.shape[1]
    assert bool((a.rls_in_batch[1:] <= rls[a.indices[1:]] + 1e-12).all())


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(
        [
            (dict(batch_bound=0.5), "batch_bound"),
            (dict(alpha=-1.0), "alpha"),
            (dict(max_batch_size=0), "max_batch_size"),
            (dict(stop_rule="max"), "stop_rule"),
            (dict(rls="neg"), "non-negative"),
            (dict(mean="short"), r"mean: expected shape"),
            (dict(mean="nan"), "finite"),
            (dict(V_inv="wrong"), r"V_inv: expected shape"),
        ]
    )
)
def test_bad_inputs(case):
    kw, msg = case
    _, post, Z, mean, rls = _problem(0, A=50)
    args = dict(Z=Z, mean=mean, rls=rls, V_inv=post.V_inv, alpha=1.0, batch_bound=2.0)
    args.update(kw)
    if args["rls"] == "neg" if isinstance(args["rls"], str) else False:
        args["rls"] = -rls
    if isinstance(args["mean"], str):
        args["mean"] = mean[:-1] if args["mean"] == "short" else torch.full_like(mean, float("nan"))
    if isinstance(args["V_inv"], str):
        args["V_inv"] = post.V_inv[:-1]
    with pytest.raises(InputDataError, match=msg):
        select_batch(**args)


def test_validate_false_gives_the_same_batch():
    _, post, Z, mean, rls = _problem(5)
    a = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=3.0)
    b = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=3.0, validate=False)
    assert a.indices.tolist() == b.indices.tolist() and torch.equal(a.rls_in_batch, b.rls_in_batch)


@pytest.mark.parametrize("alpha", [0.0, 1.5])
def test_a_winning_arm_with_zero_variance_ends_the_batch(alpha):
    """σ̃²_fb = 0 (rounding can clamp a well-sampled arm there) leaves the sum rule stuck: the batch ends
    instead of repeating that arm forever; an arm with positive variance still repeats under α = 0."""
    _, post, Z, mean, rls = _problem(0)
    top = int(torch.argmax(mean))
    mean = mean.clone()
    mean[top] = mean.max() + 10.0  # the winner whatever the width
    rls = rls.clone()
    rls[top] = 0.0
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=alpha, batch_bound=2.0)
    assert sel.indices.tolist() == [top]
    rls[top] = 0.25
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=0.0, batch_bound=2.0)
    assert sel.indices.tolist() == [top] * 5  # 1 + 4 · 0.25 = 2 <= C̃, the fifth pick crosses it
