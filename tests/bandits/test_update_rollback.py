"""An update that raises leaves a sketched bandit as it was, and names the arms whose kernel rows hold NaN/inf, which
leave the pulled set: whether the rows are cached, streamed, or computed past the pulled-row cache, the same run."""

from __future__ import annotations

import copy

import pytest
import torch

from torchbkb import BBKB, BKB
from torchbkb.bandits import kernel_rows
from torchbkb.bandits.kernel_row_cache import KernelRowCache
from torchbkb.errors import NumericsError
from torchbkb.gp.kernel_row_posterior import KernelRowPosterior
from torchbkb.gp.kernels import GaussianKernel, as_kernel

ARMS = torch.rand(150, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
F = torch.sin(5 * ARMS[:, 0]) + ARMS[:, 1]
CACHES = {"pulled rows cached": {}, "no pulled-row cache": {"row_cache_bytes": 0},
          "dictionary rows streamed": {"kernel_cache_bytes": 0},
          "neither": {"row_cache_bytes": 0, "kernel_cache_bytes": 0}}


class Holey:
    """A symmetric kernel that is NaN between the arms past 0.9 and those below 0.1 (in the first coordinate)."""

    def __call__(self, X1, X2):
        K = torch.exp(-torch.cdist(X1, X2) ** 2 / 0.08)
        a, b = X1[..., :, None, 0], X2[..., None, :, 0]
        return K.masked_fill(((a > 0.9) & (b < 0.1)) | ((a < 0.1) & (b > 0.9)), float("nan"))

    def diag(self, X):
        return torch.ones(X.shape[:-1], dtype=X.dtype)


def _holey_bandit(cls, fixed: bool, device="cpu", **caches):
    bandit = cls(ARMS.to(device), as_kernel(Holey(), diag=Holey().diag), noise=0.01, beta=0.3, seed=0, **caches)
    bandit.fixed_capacity = fixed
    return bandit


def _bad_row(a: int) -> bool:
    return not bool(torch.isfinite(Holey()(ARMS[a : a + 1], ARMS)).all())


def _run(bandit, steps: int = 45, before_tell=None):
    """``steps`` batches asked and told; the errors' arms, in order, excluded as they come (BBKB with a GPU's
    defaults runs a batch's update at the next ``ask``, which then raises)."""
    picks, errors = [], []
    while len(picks) < steps:
        try:
            i = bandit.ask()
        except NumericsError as err:
            errors.append(err.arms)
            bandit.excluded[list(err.arms)] = True
            continue
        picks.append(i.tolist())
        saved = None if before_tell is None else copy.deepcopy(bandit)
        try:
            bandit.tell(i, F.to(i.device)[i])
        except NumericsError as err:
            errors.append(err.arms)
            if before_tell is not None:
                before_tell(saved, bandit)
            bandit.excluded[list(err.arms)] = True  # the user's way on: never the named arms again
        try:
            mean, rls = bandit.scores()
        except NumericsError as err:  # a read-out runs the update BBKB defers on a GPU: it raises then
            errors.append(err.arms)
            bandit.excluded[list(err.arms)] = True
            mean, rls = bandit.scores()
        assert bool(torch.isfinite(mean).all() and torch.isfinite(rls).all())
    return picks, errors, bandit.dictionary.tolist()


@pytest.mark.parametrize("cls", [BKB, BBKB])
@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("scan", ["numpy", "torch"])
def test_every_row_cache_makes_the_same_run_with_a_nan_kernel(cls, fixed, scan, monkeypatch, device):
    """Rows checked as an arm is pulled (the pulled-row cache), as it enters the dictionary (past that cache), in
    streamed chunks or in the fixed-capacity update's rows: the same picks, the same errors naming the same arms
    (each with a non-finite row), the same dictionary -- every failed update spends its draws. Past the pulled-row
    cache, an arm with a NaN row used to stay pulled and fail almost every later update (67 errors in 80 steps)."""
    if scan == "torch":
        monkeypatch.setattr(kernel_rows, "HOST_DTYPES", ())
    runs = {name: _run(_holey_bandit(cls, fixed, device, **caches)) for name, caches in CACHES.items()}
    picks, errors, dictionary = runs["pulled rows cached"]
    assert 5 <= len(errors) <= 25 and all(len(arms) >= 1 and all(map(_bad_row, arms)) for arms in errors)
    assert not any(map(_bad_row, dictionary))
    for name, run in runs.items():
        assert run == (picks, errors, dictionary), name


def _same_state(saved, bandit) -> None:
    """Everything an update writes is as it was before the ``tell`` that raised."""
    assert torch.equal(bandit.dictionary, saved.dictionary)
    assert bandit.rows.order == saved.rows.order and bandit.streams_kernel_rows == saved.streams_kernel_rows
    rows, old = bandit.rows.rows(), saved.rows.rows()
    if isinstance(rows, torch.Tensor):
        assert torch.equal(rows, old)
    post, was = bandit.row_posterior, saved.row_posterior
    for name in ("mean", "rls", "W", "V_inv", "M", "scored"):
        a, b = getattr(post, name), getattr(was, name)
        assert (a is None and b is None) or torch.equal(a, b), name
    assert bandit.pruning.state() == saved.pruning.state()
    assert (bandit.embeddings_computed, bandit.arms_scored_total) == (saved.embeddings_computed,
                                                                      saved.arms_scored_total)


@pytest.mark.parametrize("cls", [BKB, BBKB])
@pytest.mark.parametrize("caches", list(CACHES))
def test_an_update_that_raises_leaves_the_bandit_as_it_was(cls, caches):
    checked = []
    _run(_holey_bandit(cls, False, **CACHES[caches]), steps=30,
         before_tell=lambda saved, bandit: checked.append(_same_state(saved, bandit)))
    assert len(checked) >= 3


@pytest.mark.parametrize("cls", [BKB, BBKB])
@pytest.mark.parametrize("streamed", [False, True])
def test_a_numerics_error_after_the_rows_were_written_is_rolled_back(cls, streamed, monkeypatch):
    """A factorization failing after the dictionary's rows were brought up to date (written over in place, when
    cached): the rows are computed again as they were, the state is the old one, no arm is dropped, and the next
    update goes on from there."""
    bandit = cls(ARMS, GaussianKernel(0.2), noise=0.01, beta=0.3, seed=1,
                 kernel_cache_bytes=0 if streamed else None)
    for _ in range(12):
        i = bandit.ask()
        bandit.tell(i, F[i])
    real, calls, rebuilt = KernelRowPosterior.score, [], []
    set_dictionary = KernelRowCache.set_dictionary

    def failing(self, *args, **kwargs):
        calls.append(1)
        raise NumericsError("V: expected a positive definite matrix, got a failed factorization")

    def spied(self, dictionary, order=None, blocks=None, **kwargs):  # a restore computes the old rows again
        rebuilt.append(blocks is not None)
        return set_dictionary(self, dictionary, order, blocks, **kwargs)

    monkeypatch.setattr(KernelRowCache, "set_dictionary", spied)

    failed = 0
    for _ in range(6):  # until an update changes the dictionary, then fails
        i = bandit.ask()
        saved = copy.deepcopy(bandit)
        monkeypatch.setattr(KernelRowPosterior, "score", failing)
        try:
            bandit.tell(i, F[i])
        except NumericsError as err:
            assert err.arms == ()
            _same_state(saved, bandit)
            failed += 1
        monkeypatch.setattr(KernelRowPosterior, "score", real)
    assert failed == 6 and len(calls) == 6
    assert sum(rebuilt) == (0 if streamed else 6)  # cached rows were written over in place, and computed again
    i = bandit.ask()
    bandit.tell(i, F[i])  # every pull fitted now, none dropped
    assert bandit.posterior.num_train == int((bandit.counts > 0).sum())


def test_a_row_that_fails_its_check_changes_no_cached_row():
    """An entering point's row is computed and checked before any slot is written: a NaN row leaves the slots, their
    rows and the order as they were (it used to move the last row into a leaving point's slot first)."""
    def kernel(X1, X2):  # NaN in the rows of the arms past 0.9 (arm 0 among them)
        return GaussianKernel(0.3)(X1, X2).masked_fill(X1[:, :1] > 0.9, float("nan"))

    cache = KernelRowCache(kernel, ARMS, row_cache_bytes=0)
    cache.set_dictionary(torch.tensor([1, 2, 3, 4]))
    order, rows = list(cache.order), cache.rows().clone()
    with pytest.raises(NumericsError, match=r"rows of arms \[0\]") as err:
        cache.set_dictionary(torch.tensor([0, 1, 4]))  # 2 and 3 leave, 0 enters: a slot filled, one compacted
    assert err.value.arms == (0,)
    assert cache.order == order and torch.equal(cache.rows(), rows)
    assert cache.nonfinite_rows([1, 0, 4, 0]) == [0, 0]


def test_restore_brings_back_rows_written_over_in_place():
    cache = KernelRowCache(GaussianKernel(0.3), ARMS, row_cache_bytes=0)
    cache.set_dictionary(torch.tensor([1, 2, 3, 4, 5]))
    cache.set_dictionary(torch.tensor([1, 3, 6, 7]))  # blocks of two: rows computed together
    order, rows, blocks = list(cache.order), cache.rows().clone(), cache.blocks()
    saved = cache.snapshot()
    cache.set_dictionary(torch.tensor([1, 8]))  # written in place
    assert cache.order != order
    cache.restore(saved)
    assert cache.order == order and cache.blocks() == blocks
    assert torch.equal(cache.rows(), rows)  # each row from the block it was computed in: the same bits
