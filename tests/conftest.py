"""Shared fixtures: every core test loops over float32/float64 and over the available devices."""

import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]

# CI sets HYPOTHESIS_PROFILE=ci (.ci/run): the same draws at every run, so a property that fails on one draw in
# thousands fails every run or none, never a landing at random. Elsewhere each run draws anew (the default).
settings.register_profile("ci", derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ALL_DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.fixture(params=ALL_DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["f32", "f64"])
def dtype(request):
    return request.param


def tol(dtype):
    """Comparison tolerance for results computed in ``dtype``."""
    return 1e-9 if dtype == torch.float64 else 2e-3


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (a module opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``):
    bandit operations are tiny, and a second thread only adds synchronization (much slower on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def dask_client():
    """A Dask ``LocalCluster`` of two one-thread worker processes for the module's tests (skipped without
    ``distributed``); the workers import torchbkb and the test modules (objectives are pickled by reference)."""
    distributed = pytest.importorskip("distributed")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")] + ([old] if old else []))
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       silence_logs=50)
    client = distributed.Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
