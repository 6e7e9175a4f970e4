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


def pytest_addoption(parser):
    parser.addoption("--cuda-defaults", action="store_true", default=False,
                     help="run only the CPU variants of the device tests, with the settings a CUDA device gets by "
                          "default (see the cuda_defaults fixture)")


def pytest_collection_modifyitems(config, items):
    """With ``--cuda-defaults`` only the CPU variants of the device tests run (the others are deselected)."""
    if not config.getoption("--cuda-defaults"):
        return
    keep = [item for item in items
            if getattr(item, "callspec", None) is not None and item.callspec.params.get("device") == "cpu"]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


@pytest.fixture(params=ALL_DEVICES)
def device(request):
    if request.param == "cpu" and request.config.getoption("--cuda-defaults"):
        request.getfixturevalue("cuda_defaults")
    return torch.device(request.param)


@pytest.fixture
def cuda_defaults(monkeypatch):
    """CPU bandits and models with the settings they get by default on a CUDA device: ``helpers.gpu_defaults`` for
    every sketched bandit built (the fixed-capacity update through the update graphs' buffers, BBKB's device loop with
    replayed picks), torch's paths where the CPU computes on NumPy views, and ``BKBModel``'s exact-outright threshold
    of a full-rate float64 GPU. ``python -m pytest --cuda-defaults tests`` runs the device tests so on a machine
    without a GPU: what a test assumes of the CPU's defaults shows there before a GPU is lent. (Arithmetic is still
    the CPU's: cuBLAS's rounding is not emulated.)"""
    from helpers import gpu_defaults
    from torchbkb.bandits import bbkb, host_in_batch, kernel_rows, pruning, sketched
    from torchbkb.gp import kernel_row_posterior

    sketched_init, bbkb_init = sketched.SketchedKernelBandit.__init__, bbkb.BBKB.__init__

    def sketched_on_cuda(self, *args, **kwargs):
        sketched_init(self, *args, **kwargs)
        if self.arms.device.type == "cpu":  # (BBKB sets its loop after this: patched below)
            gpu_defaults(self)

    def bbkb_on_cuda(self, *args, **kwargs):
        bbkb_init(self, *args, **kwargs)
        if self.arms.device.type == "cpu":
            gpu_defaults(self)

    monkeypatch.setattr(sketched.SketchedKernelBandit, "__init__", sketched_on_cuda)
    monkeypatch.setattr(bbkb.BBKB, "__init__", bbkb_on_cuda)
    for module in (host_in_batch, kernel_row_posterior, kernel_rows, pruning):  # no NumPy views: torch's paths
        monkeypatch.setattr(module, "HOST_DTYPES", ())
    try:
        from torchbkb.botorch import defaults
    except ImportError:  # the core without BoTorch
        return
    monkeypatch.setattr(defaults, "EXACT_BELOW", defaults.EXACT_BELOW_ACCELERATOR)


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
