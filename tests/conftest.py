"""Shared fixtures: every core test loops over float32/float64 and over the available devices."""

import pytest
import torch

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
