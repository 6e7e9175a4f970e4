"""How often a BKBModel makes the host wait for the device: a GPU's synchronizations, counted on any device.

A BoTorch iteration builds the model (a dictionary replay: ``⌈log₂ n⌉`` doubling rounds) and scores its candidates
in chunks of 2,048 points; every value the host reads stalls a GPU's queue. The counts below are contracts: a read
added inside a round or a chunk fails them."""

import math

import pytest
import torch

from helpers import DeviceReads
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.botorch import BKBModel, sample_dictionary
from torchbkb.botorch.defaults import exact_below
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

F64 = torch.float64


def _model(n: int, seed: int = 0) -> BKBModel:
    """No outcome transform: BoTorch's ``Standardize`` reads a value of its own per posterior."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 4, generator=g, dtype=F64)
    return BKBModel(X, torch.sin(6 * X).sum(-1, keepdim=True), kernel=GaussianKernel(1.0), noise=0.05, seed=seed,
                    outcome_transform=None)


def test_a_replay_reads_the_device_at_most_four_times_a_round():
    n = 2_000
    model = _model(n)
    with DeviceReads() as reads:
        engine = model.engine
    assert not engine.is_exact  # the sparse posterior: every round of the replay ran
    # per round (⌈log₂ n⌉ + 1 of them): the chosen rows (nonzero), V's Cholesky check, the sparsity forecast; the
    # data are checked once
    assert len(reads.names) <= 4 * (math.ceil(math.log2(n)) + 1), reads.names


def test_a_posterior_chunk_reads_the_device_once():
    model = _model(2_000)
    Xq = torch.rand(2_048, 1, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    model.posterior(Xq)  # the first call derives the scoring operator once
    for ask in (model.posterior, model.eval()):  # BoTorch's posterior and the model(X) idiom
        with DeviceReads() as reads:
            out = ask(Xq)
        # the query's finiteness and the hyperparameters' snapshot, in one read; nothing per point or dictionary row
        assert reads.names == ["aten::_local_scalar_dense"], reads.names
        assert out.mean.shape[:2] == (2_048, 1)


@pytest.mark.parametrize("change", ["none", "hyperparameter", "nan"])
def test_one_read_still_tells_a_stale_posterior_and_a_bad_query(change):
    model = _model(300)
    Xq = torch.rand(5, 1, 4, generator=torch.Generator().manual_seed(2), dtype=F64)
    before = model.posterior(Xq).mean
    if change == "hyperparameter":
        with torch.no_grad():
            model.covar_module.lengthscale.data.copy_(torch.tensor(0.5, dtype=F64))  # no version bump
    if change == "nan":
        bad = Xq.clone()
        bad[3, 0, 2] = float("nan")
        for ask in (model.posterior, model):
            with pytest.raises(InputDataError, match="X: expected finite values, got 1 NaN/inf"):
                ask(bad)
        assert torch.equal(model.posterior(Xq).mean, before)  # the model answers as it did
        return
    after = model.posterior(Xq).mean
    assert torch.equal(after, before) == (change == "none")


def test_a_query_with_nan_still_raises_once_checked_by_the_model_only():
    model = _model(300)
    Xq = torch.rand(5, 1, 4, dtype=F64)
    Xq[3, 0, 2] = float("nan")
    with pytest.raises(InputDataError, match="X: expected finite values"):
        model.posterior(Xq)


@pytest.mark.parametrize("row", [0, 1, 37, 299])
def test_a_replay_over_data_with_nan_raises_wherever_the_row_is(row):
    X = torch.rand(300, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    X[row, 1] = float("nan")
    with pytest.raises(InputDataError, match="finite"):
        sample_dictionary(GaussianKernel(0.3), X, 0.1, generator=torch.Generator().manual_seed(0))


def test_dtc_posterior_reads_its_noise_once_and_follows_every_change_of_it():
    X = torch.rand(40, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    post = DTCPosterior(NystromEmbedding(GaussianKernel(0.4), X[:10]), noise=0.1).fit(X, X.sum(-1))
    Xq = torch.rand(7, 2, dtype=F64)
    assert post.lam == 0.1
    post(Xq)  # the first call derives the scoring operator (once per fit)
    with DeviceReads() as reads:
        mean, var = post(Xq, validate=False)
    assert reads.names == []  # λ cached, the query not checked: no read at all
    assert torch.equal(var, post(Xq)[1]) and torch.equal(mean, post(Xq)[0])
    with torch.no_grad():
        post.noise.fill_(0.2)  # an in-place write
    assert post.lam == 0.2
    post.load_state_dict({**post.state_dict(), "noise": torch.tensor(0.3, dtype=F64)})
    assert post.lam == 0.3
    post.noise = torch.tensor(0.4, dtype=F64)  # a new tensor
    assert post.lam == 0.4


@pytest.mark.parametrize("n", [100, 2_000])
def test_conditioning_reads_the_device_four_times(n):
    """The new points and outcomes (one read each), the hyperparameters' snapshot, and then the exact GP's Cholesky
    check or the sparse update's features (their values in one read): not once per check."""
    model = _model(n)
    g = torch.Generator().manual_seed(3)
    model.posterior(torch.rand(4, 4, generator=g, dtype=F64))
    X, Y = torch.rand(3, 4, generator=g, dtype=F64), torch.rand(3, 1, generator=g, dtype=F64)
    with DeviceReads() as reads:
        new = model.condition_on_observations(X, Y)
    assert new.is_exact == model.is_exact == (n <= exact_below(X.device))
    assert len(reads.names) == 4, reads.names


def test_a_fixed_q_batch_waits_on_the_device_a_few_times_a_pick():
    """``optimize_acqf_bbkb(q=...)``'s lazy greedy: per pick one read of the pool's argmax a refresh round, the mask of
    the stale bounds a round, one read of the pick's variance -- about four a pick (each check was its own read
    before: about fourteen), none per candidate."""
    from helpers import HostReads
    from torchbkb.botorch import optimize_acqf_bbkb

    model = _model(2_000)
    choices = torch.rand(20_000, 4, generator=torch.Generator().manual_seed(4), dtype=F64)
    optimize_acqf_bbkb(model, choices, q=5, beta=1.0)  # the scoring operator, derived once
    q = 50
    with HostReads() as host, DeviceReads() as device:
        batch, _ = optimize_acqf_bbkb(model, choices, q=q, beta=1.0)
    masks = [name for name in device.names if name != "aten::_local_scalar_dense"]  # the rest are host.calls too
    assert batch.shape == (q, 4)
    assert len(host.calls) + len(masks) <= 5 * q, (len(host.calls), masks)


def test_an_evaluation_of_the_bound_waits_a_few_times():
    """One evaluation of ``DTCMarginalLogLikelihood`` in a fit (``model(X)`` in training mode, then the bound): the
    inputs, the mean and noise, the bound's own inputs (each set of checks in one read) and the dictionary's Cholesky
    -- not a read per check (about twice as many before)."""
    from helpers import HostReads
    from torchbkb.botorch import DTCMarginalLogLikelihood

    model = _model(2_000)
    mll = DTCMarginalLogLikelihood(model.likelihood, model)
    model.train()
    mll(model(*model.train_inputs), model.train_targets)  # the first evaluation replays the dictionary
    with HostReads() as host, DeviceReads() as device:
        mll(model(*model.train_inputs), model.train_targets)
    masks = [name for name in device.names if name != "aten::_local_scalar_dense"]
    assert len(host.calls) + len(masks) <= 5, (host.calls, masks)
