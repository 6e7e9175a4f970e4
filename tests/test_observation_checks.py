"""Observations are checked in one host read: the same errors as checking each value alone, one wait on a GPU.

``check_values`` folds the finiteness of ``X``, ``y`` and ``counts`` and the positivity of ``counts`` into one
transfer; when a check fails it raises what the checks one at a time raise (the first in that order). The reads are
counted at the dispatcher (``helpers.DeviceReads``), on any device.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import DeviceReads
from torchbkb import DTCPosterior, ExactPosterior, NystromEmbedding
from torchbkb.errors import InputDataError, check_finite
from torchbkb.gp.kernels import GaussianKernel
from torchbkb.gp.observations import check_features, check_values

F64 = torch.float64
BAD = [float("nan"), float("inf"), -float("inf")]


def _one_at_a_time(X, y, counts, xname="X", yname="y"):
    """The reference: each value checked alone, in order."""
    check_finite(X, xname)
    if y is not None:
        check_finite(y, yname)
    if counts is not None:
        check_finite(counts, "counts")
        if bool((counts <= 0).any()):
            raise InputDataError(f"counts: expected positive weights, got min {float(counts.min())}")


def _message(fn, *args):
    try:
        fn(*args)
    except InputDataError as err:
        return str(err)
    return None


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 6), with_y=st.booleans(), with_counts=st.booleans(),
       faults=st.lists(st.tuples(st.sampled_from(["X", "y", "counts"]), st.integers(0, 17),
                                 st.sampled_from(BAD + [0.0, -1.0])), max_size=3))
def test_one_read_raises_what_the_checks_one_at_a_time_raise(n, with_y, with_counts, faults):
    g = torch.Generator().manual_seed(n)
    X = torch.rand(n, 3, generator=g, dtype=F64)
    y = torch.rand(n, generator=g, dtype=F64) if with_y else None
    counts = torch.ones(n, dtype=F64) + torch.rand(n, generator=g, dtype=F64) if with_counts else None
    for where, i, value in faults:
        t = {"X": X, "y": y, "counts": counts}[where]
        if t is not None and (where == "counts" or value not in (0.0, -1.0)):  # 0 and -1 are faults of counts only
            t.view(-1)[i % t.numel()] = value
    want = _message(_one_at_a_time, X, y, counts)
    with DeviceReads() as reads:
        got = _message(check_values, X, y, counts)
    assert got == want
    if want is None:
        assert reads.names == ["aten::_local_scalar_dense"]  # one read, whatever was given


def test_features_are_checked_in_one_read_with_their_messages():
    Z, y, counts = torch.rand(4, 3, dtype=F64), torch.rand(4, dtype=F64), torch.full((4,), 2.0, dtype=F64)
    with DeviceReads() as reads:
        assert check_features(Z, y, counts, rank=3) is Z
    assert reads.names == ["aten::_local_scalar_dense"]
    counts[2] = 0.0
    with pytest.raises(InputDataError, match="counts: expected positive weights, got min 0.0"):
        check_features(Z, y, counts, rank=3)
    y[1] = float("nan")
    with pytest.raises(InputDataError, match="y: expected finite values, got 1 NaN/inf entries out of 4"):
        check_features(Z, y, counts, rank=3)


@pytest.mark.parametrize("given", ["x", "x, y", "x, y, counts"])
def test_a_dtc_update_reads_the_device_twice(given):
    """The points' values (one read for ``x``, ``y`` and ``counts``) and the features' (one): not once per check."""
    X = torch.rand(40, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    post = DTCPosterior(NystromEmbedding(GaussianKernel(0.5), X[:8]), noise=0.1).fit(X, torch.sin(X).sum(-1))
    x = torch.rand(3, 2, dtype=F64)
    args = {"x": (x,), "x, y": (x, torch.rand(3, dtype=F64)),
            "x, y, counts": (x, torch.rand(3, dtype=F64), torch.full((3,), 2.0, dtype=F64))}[given]
    with DeviceReads() as reads:
        post.update(*args)
    assert reads.names == ["aten::_local_scalar_dense"] * 2, reads.names


@pytest.mark.parametrize("cls", [DTCPosterior, ExactPosterior])
@pytest.mark.parametrize("bad", ["x", "y", "counts"])
def test_a_bad_value_in_an_update_raises_and_changes_nothing(cls, bad):
    X = torch.rand(30, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    kernel = GaussianKernel(0.5)
    post = cls(NystromEmbedding(kernel, X[:6]), noise=0.1) if cls is DTCPosterior else cls(kernel, noise=0.1)
    post.fit(X, torch.cos(X).sum(-1))
    Xq = torch.rand(5, 2, dtype=F64)
    before = [t.clone() for t in post(Xq)]
    x, y, counts = torch.rand(2, 2, dtype=F64), torch.rand(2, dtype=F64), torch.ones(2, dtype=F64)
    {"x": x, "y": y, "counts": counts}[bad].view(-1)[1] = float("nan")
    with pytest.raises(InputDataError, match=f"{bad}: expected finite values, got 1 NaN/inf entries out of"):
        post.update(x, y, counts)
    assert all(torch.equal(a, b) for a, b in zip(before, post(Xq)))


def test_an_exact_update_reads_its_noise_once_and_follows_every_change_of_it():
    """Per added point only the Schur complement's sign is read (``λ`` is cached per value of ``noise``)."""
    X = torch.rand(30, 2, generator=torch.Generator().manual_seed(2), dtype=F64)
    post = ExactPosterior(GaussianKernel(0.5), noise=0.1).fit(X, X.sum(-1))
    assert post.lam == 0.1
    with DeviceReads() as reads:
        post.update(torch.rand(3, 2, dtype=F64), torch.rand(3, dtype=F64))
    assert len(reads.names) == 1 + 3, reads.names  # the values, then one sign per point
    with torch.no_grad():
        post.noise.fill_(0.2)  # an in-place write
    assert post.lam == 0.2
    post.noise = torch.tensor(0.3, dtype=F64)  # a new tensor
    assert post.lam == 0.3


def test_check_at_once_reads_any_number_of_flags_once_and_defers_to_the_checks():
    from torchbkb.utils.host_copy import check_at_once

    flags = {f"f{i}": torch.tensor(True) for i in range(100)}  # more than the bits of one integer
    ran = []
    with DeviceReads() as reads:
        check_at_once(flags, lambda: ran.append(1))
    assert ran == [] and len(reads.names) == 1
    flags["f73"] = torch.tensor(False)
    check_at_once(flags, lambda: ran.append(1))
    assert ran == [1]  # a false flag: the one-by-one checks run (and raise, in real use)
