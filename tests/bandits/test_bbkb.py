import math

import pytest
import torch

from bbkb_cases import LS, arms_and_values, make_bbkb, run_batches
from helpers import close
from torchbkb import BBKB, BKB, DTCPosterior, ExactPosterior, NystromEmbedding
from torchbkb.bandits.batch_selection import select_batch
from torchbkb.bandits.confidence import bbkb_beta
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny operations: one intra-op thread (tests/conftest.py)


def test_batch_bound_one_gives_batches_of_one_and_bkb_choices(dtype, device):
    arms, f = arms_and_values(dtype=dtype, device=device)
    bb = make_bbkb(arms, batch_bound=1.0, beta=0.3)
    bk = BKB(arms, GaussianKernel(LS), noise=0.01, q_bar=2.0, beta=0.3, seed=1)
    batches = run_batches(bb, f, 60)
    run_batches(bk, f, 60)
    assert all(len(b) == 1 for b in batches) and bb.batch_sizes == [1] * 60
    assert bb.history["index"] == bk.history["index"]  # 001: updating at every step BBKB is BKB
    assert torch.equal(bb.dictionary, bk.dictionary)


def test_first_batch_is_one_uniform_arm_and_seeds_the_dictionary():
    arms, f = arms_and_values()
    b = make_bbkb(arms)
    first = b.ask()
    assert len(first) == 1 and b.last_selection is None
    b.tell(first, f[first])
    assert b.dictionary.tolist() == first.tolist() and b.num_resparsifications == 1


def _reference_batch(bandit, arms):
    """Algorithm 1 lines 4-8 from scratch: a DTC posterior on S_fb refitted with the picks hallucinated,
    every arm rescored after every pick (no lazy shortcut, no cached quantities of the bandit)."""
    pulled = (bandit.counts > 0).nonzero().squeeze(1)
    counts = bandit.counts[pulled].to(arms.dtype)
    y = (bandit.reward_sums[pulled] / bandit.counts[pulled]).to(arms.dtype)
    S = arms[bandit.rows.order]
    post = DTCPosterior(NystromEmbedding(GaussianKernel(LS), S), noise=bandit.lam).fit(arms[pulled], y, counts)
    mean_fb, rls_fb = post(arms)[0], post.rls(arms)
    picks, in_batch, level = [], [], 1.0
    while True:
        rls_t = post.rls(arms)
        assert close(post(arms)[0], mean_fb, 1e-9)  # the mean stays frozen
        ucb = mean_fb + bandit.beta * rls_t.clamp_min(0).sqrt()
        i = int(torch.argmax(ucb))
        picks.append(i)
        in_batch.append(float(rls_t[i]))
        level += float(rls_fb[i])
        if level > bandit.batch_bound:
            return picks, in_batch, rls_fb
        post.update(arms[i : i + 1])  # y=None: hallucinated rank-one update of V


@pytest.mark.parametrize("seed", [0, 1])
def test_in_batch_variances_equal_a_refit_with_the_hallucinated_picks(seed):
    arms, f = arms_and_values(seed=seed)
    b = make_bbkb(arms, batch_bound=3.0, beta=0.5, seed=seed)
    run_batches(b, f, 40)
    checked = 0
    for _ in range(200):
        if checked == 3:
            break
        batch = b.ask()
        if len(batch) >= 3:
            picks, in_batch, rls_fb = _reference_batch(b, arms)
            assert batch.tolist() == picks
            assert close(b.last_selection.rls_in_batch, torch.tensor(in_batch, dtype=torch.float64), 1e-8)
            assert close(b.last_selection.rls_start, rls_fb[batch], 1e-8)
            checked += 1
        b.tell(batch, f[batch])
    assert checked == 3


def test_resampling_uses_the_batch_start_variances_and_pull_counts(monkeypatch):
    arms, f = arms_and_values()
    b = make_bbkb(arms, batch_bound=3.0)
    run_batches(b, f, 30)
    seen = []
    original = b.sampler.resample
    monkeypatch.setattr(b.sampler, "resample",
                        lambda rls, counts, **kw: seen.append((rls, counts)) or original(rls, counts, **kw))
    for _ in range(3):
        idx = b.ask()
        rls_fb = b.scores()[1].clone()
        b.tell(idx, f[idx])
        pulled = (b.counts > 0).nonzero().squeeze(1)  # the candidates: every pulled arm, this batch's included
        rls, counts = seen[-1]
        assert torch.equal(counts, b.counts[pulled]) and close(rls, rls_fb[pulled].double(), 0.0)
        assert set(b.dictionary.tolist()) <= set(pulled.tolist())


def test_lazy_and_eager_selection_give_identical_runs():
    arms, f = arms_and_values(A=400)
    lazy, eager = make_bbkb(arms, lazy=True), make_bbkb(arms, lazy=False)
    assert run_batches(lazy, f, 300) == run_batches(eager, f, 300)
    assert torch.equal(lazy.dictionary, eager.dictionary)
    assert lazy.ucb_evaluations < eager.ucb_evaluations / 5  # lazy touches far fewer arms


def test_batch_sizes_grow_on_a_smooth_problem():
    arms = torch.linspace(0, 1, 500, dtype=torch.float64)[:, None]
    f = torch.exp(-((arms[:, 0] - 0.7) ** 2) / 0.05)
    b = BBKB(arms, GaussianKernel(0.15), noise=0.01, beta=0.2, batch_bound=2.0, seed=0)
    run_batches(b, f, 2000)
    sizes = b.batch_sizes
    third = len(sizes) // 3
    early, late = sizes[:third], sizes[-third:]
    assert sum(late) / len(late) > 5 * sum(early) / len(early)
    assert max(sizes) >= 100 and b.num_resparsifications == len(sizes)
    assert float(f.max() - f[b.history["index"][-100:]].min()) < 1e-2  # and it exploits the optimum


def test_dictionary_of_all_pulled_arms_is_gp_bucb_with_the_sum_rule():
    # q̄ huge: every pulled arm stays in S, the DTC posterior is the exact GP (001: "we recover GP-BUCB")
    arms, f = arms_and_values(A=120)
    b = make_bbkb(arms, q_bar=1e9, batch_bound=4.0, beta=0.4)
    run_batches(b, f, 25)
    batch = b.ask()
    pulled = (b.counts > 0).nonzero().squeeze(1)
    assert torch.equal(b.dictionary, pulled)
    y = (b.reward_sums[pulled] / b.counts[pulled]).to(arms.dtype)
    exact = ExactPosterior(GaussianKernel(LS), b.lam).fit(arms[pulled], y, b.counts[pulled].to(arms.dtype))
    mean_fb, var_fb = exact(arms)
    level = 1.0
    for k, i in enumerate(batch.tolist()):
        var_t = exact(arms)[1]
        assert abs(float(var_t[i]) / b.lam - float(b.last_selection.rls_in_batch[k])) < 1e-6
        assert i == int(torch.argmax(mean_fb + b.beta * (var_t / b.lam).sqrt()))
        level += float(var_fb[i]) / b.lam
        exact.update(arms[i], None)
    assert level > 4.0


def test_theory_width_is_batch_bound_times_bbkb_beta():
    arms, f = arms_and_values()
    b = make_bbkb(arms, beta="theory", batch_bound=3.0, F=2.0, delta=0.05)
    log_sum = 0.0
    for _ in range(8):
        idx = b.ask()
        expected = bbkb_beta(log_sum, noise_std=0.1, lam=0.01, F=2.0, delta=0.05)
        assert b.beta_tilde == pytest.approx(expected, rel=1e-12) and b.beta == pytest.approx(3.0 * expected, rel=1e-12)
        rls_fb = b.scores()[1][idx].double()  # σ̃²_fb of the picks (the batch-start variances)
        log_sum += float(torch.log1p(3 * rls_fb).sum())
        b.tell(idx, f[idx])
    assert b.log_sum == pytest.approx(log_sum, rel=1e-12)


def test_float_beta_is_the_in_batch_multiplier_itself():
    arms, f = arms_and_values()
    for C in (1.5, 4.0):
        b = make_bbkb(arms, beta=0.7, batch_bound=C)
        run_batches(b, f, 10)
        b.ask()
        assert b.beta == 0.7 and math.isnan(b.beta_tilde)


def test_max_batch_size_caps_batches():
    arms, f = arms_and_values()
    b = make_bbkb(arms, batch_bound=50.0, max_batch_size=4)
    run_batches(b, f, 80)
    assert max(b.batch_sizes) == 4


@pytest.mark.parametrize("mid_batch", [False, True])
def test_checkpoint_resume_is_an_identical_continuation(mid_batch):
    arms, f = arms_and_values(A=250)
    a = make_bbkb(arms, beta="theory", batch_bound=3.0, F=1.0)
    run_batches(a, f, 60)
    if mid_batch:
        idx = a.ask()
        while len(idx) < 2:  # need a batch of >= 2 to stop in the middle of it
            a.tell(idx, f[idx])
            idx = a.ask()
        a.tell(idx[:1], f[idx[:1]])
    state = a.state_dict()
    b = make_bbkb(arms, beta="theory", batch_bound=3.0, F=1.0, seed=123)  # a different seed: all restored
    b.load_state_dict(state)
    if mid_batch:
        assert b.pending.tolist() == a.pending.tolist()
        rest = a.pending
        a.tell(rest, f[rest])
        b.tell(rest, f[rest])
    run_batches(a, f, 200)
    run_batches(b, f, 200)
    assert a.history == b.history and a.batch_sizes == b.batch_sizes
    assert torch.equal(a.dictionary, b.dictionary) and a.log_sum == b.log_sum
    assert torch.equal(a.scores()[0], b.scores()[0]) and torch.equal(a.scores()[1], b.scores()[1])


def test_discarded_picks_are_left_out_consistently():
    arms, f = arms_and_values()
    b = make_bbkb(arms, batch_bound=4.0)
    run_batches(b, f, 30)
    idx = b.ask()
    while len(idx) < 3:
        b.tell(idx, f[idx])
        idx = b.ask()
    t0, log0 = b.t, b.log_sum
    b.tell(idx[1:], f[idx[1:]])
    b.discard(idx[:1])
    assert b.t == t0 + len(idx) - 1 and int(b.counts.sum()) == b.t
    rls_fb = b.last_selection.rls_start[1:].double()
    assert b.log_sum == pytest.approx(log0 + float(torch.log1p(3 * rls_fb).sum()), rel=1e-9)
    run_batches(b, f, b.t + 20)  # continues normally


def test_a_fully_discarded_first_batch_draws_again():
    arms, f = arms_and_values()
    b = make_bbkb(arms)
    first = b.ask()
    b.discard(first)
    assert b.t == 0 and b.dictionary_size == 0
    second = b.ask()
    b.tell(second, f[second])
    assert b.dictionary.tolist() == second.tolist()


def test_counters_and_timers():
    arms, f = arms_and_values()
    b = make_bbkb(arms)
    run_batches(b, f, 100)
    assert b.num_resparsifications == len(b.batch_sizes) and sum(b.batch_sizes) >= 100
    assert b.time_in_batch > 0 and b.time_resparsify > 0
    assert b.dictionary_size == b.dictionary.numel() > 0 and b.embeddings_computed <= b.num_resparsifications


def test_float32_follows_float64():
    arms, f = arms_and_values()
    b64, b32 = make_bbkb(arms), make_bbkb(arms.float())
    run_batches(b64, f, 150)
    run_batches(b32, f.float(), 150)
    r64 = float(f.max() - f[b64.history["index"][-30:]].mean())
    r32 = float(f.max() - f[b32.history["index"][-30:]].mean())
    assert r64 < 0.05 and r32 < 0.05
    assert b32.scores()[1].dtype == torch.float32


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(batch_bound=0.5), "batch_bound"),
        (dict(batch_bound=float("nan")), "batch_bound"),
        (dict(batch_bound=float("inf")), "batch_bound"),
        (dict(batch_bound="big"), "batch_bound"),
        (dict(max_batch_size=0), "max_batch_size"),
        (dict(max_batch_size=2.5), "max_batch_size"),
        (dict(batch_size=0), "q"),
        (dict(batch_size=21), "q"),
        (dict(batch_size=2.5), "q"),
        (dict(beta="large"), "beta"),
        (dict(beta=-1.0), "beta"),
        (dict(q_bar=0.0), "q_bar"),
        (dict(noise=-0.1), "noise"),
    ],
)
def test_bad_arguments(kw, msg):
    arms, _ = arms_and_values(A=20)
    with pytest.raises(InputDataError, match=msg):
        make_bbkb(arms, **kw)


def test_bad_tell_leaves_state_unchanged():
    arms, f = arms_and_values()
    b = make_bbkb(arms)
    run_batches(b, f, 20)
    idx = b.ask()
    before = b.state_dict()
    with pytest.raises(InputDataError):
        b.tell(idx, f[idx][:-1] if len(idx) > 1 else f[idx].repeat(2))
    with pytest.raises(InputDataError, match="finite"):
        b.tell(idx, torch.full((len(idx),), float("nan"), dtype=f.dtype))
    after = b.state_dict()
    assert before["history"] == after["history"] and before["pending"] == after["pending"]
    assert torch.equal(before["counts"], after["counts"])
    assert before["algorithm"]["log_sum"] == after["algorithm"]["log_sum"]


def test_batches_read_features_on_demand_and_equal_selection_on_the_full_embedding():
    """BBKB's in-batch selection computes z(a) only for the arms it reads (:class:`FeatureRows`); the batches
    are those of :func:`select_batch` on the full `(A, r)` embedding, and long batches are runs of one arm."""
    arms = torch.linspace(0, 1, 400, dtype=torch.float64)[:, None]
    f = torch.exp(-((arms[:, 0] - 0.7) ** 2) / 0.05)
    b = BBKB(arms, GaussianKernel(0.15), noise=0.01, beta=0.2, batch_bound=2.0, max_batch_size=300, seed=0)
    run_batches(b, f, 300)
    longest = 0
    for _ in range(30):
        rows = b.feature_rows()
        some = torch.tensor([0, 17, 399, 17])
        assert rows.shape == b.arm_features().shape and close(rows[some], b.arm_features()[some], 1e-10)
        full = select_batch(b.arm_features(), b.scores()[0], b.scores()[1], b.V_inverse(), b.current_beta(),
                            b.batch_bound, b.max_batch_size)
        batch = b.ask()
        assert batch.tolist() == full.indices.tolist()
        longest = max(longest, len(batch))
        b.tell(batch, f[batch])
    assert longest >= 20


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cap", [None, 4])
def test_a_prior_variance_too_small_for_the_stop_rule_ends_the_batch(cap):
    """A kernel with prior variance 1e-100 next to λ = 0.01 (σ̃²_fb ≈ 0 next to C̃): without a cap each pick ends its
    batch instead of a practically endless batch; with a cap the batch runs to the cap."""
    arms, f = arms_and_values(A=40)
    base = GaussianKernel(0.2)
    b = BBKB(arms, lambda x1, x2: 1e-100 * base(x1, x2), noise=0.01, q_bar=2.0, beta=0.3, batch_bound=2.0,
             max_batch_size=cap, seed=1)
    while b.t < 20:
        idx = b.ask()
        b.tell(idx, f[idx])
    assert b.batch_sizes[0] == 1 and set(b.batch_sizes[1:]) == {1 if cap is None else cap}


def test_reward_sums_of_repeated_arms_are_the_same_at_every_run(device):
    """Batches that repeat arms: the reward sums are the told rewards' sums, bitwise the same in two runs on every
    device (CUDA's ``index_add_`` would add a repeated arm's rewards with atomics, in no fixed order), and on the CPU
    the in-order float64 sums."""
    arms = torch.rand(50, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(device)
    sums, expected, repeats = [], [0.0] * 50, 0
    for run in range(2):
        b = BBKB(arms, GaussianKernel(0.3), noise=0.1, beta=0.5, batch_bound=20.0, seed=0)
        g = torch.Generator().manual_seed(1)
        while b.t < 300:
            idx = b.ask()
            ids = idx.tolist()
            y = 1e3 * torch.randn(idx.shape, generator=g, dtype=torch.float64) + 0.1
            if run == 0:
                repeats += len(ids) - len(set(ids))
                for i, v in zip(ids, y.tolist()):
                    expected[i] += v
            b.tell(idx, y.to(device))
        sums.append(b.reward_sums.cpu())
    assert repeats > 50
    assert torch.equal(sums[0], sums[1])
    if device.type == "cpu":
        assert sums[0].tolist() == expected
    assert close(sums[0], torch.tensor(expected, dtype=torch.float64), 1e-9)
