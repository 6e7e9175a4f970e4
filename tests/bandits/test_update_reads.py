"""How often a sketched bandit's eager update makes the host wait for a GPU: CUDA only, where a read is a
synchronization (``torch.cuda.set_sync_debug_mode``); a CPU tensor is the host's own.

The eager update is what a GPU runs past the fixed-capacity update's row limit: 10⁶ arms and more. A step reads the
device three times: the picks (``ask``); the kept arms of the resample, with a newly pulled arm's cached kernel row's
finiteness; and the Cholesky flags of ``V`` -- or, when the dictionary changed, of ``K_S`` and ``V`` together. When
the update prunes, the arms that pass the UCB bound are a fourth. The draws reach the device queued, and the new
dictionary is compared with the last one on the host. Two kinds of step read more (a step or two of 30): the
float64 accuracy check, when the dictionary has grown by a quarter, and, without the pulled-row cache, a point
entering the dictionary, whose row the row cache computes and checks on its own."""

import warnings

import pytest
import torch

from torchbkb import BKB
from torchbkb.gp.kernels import GaussianKernel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _steps_reads(b: BKB, values: torch.Tensor, steps: int) -> list[tuple[int, bool]]:
    """``steps`` ask/tell steps with rewards from the host (a black box's): each step's synchronizations and whether
    its update changed the dictionary."""
    out = []
    for _ in range(steps):
        before = b.embeddings_computed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                idx = b.ask()
                b.tell(idx, values[torch.tensor(b.pending_ids)])
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum(1 for w in caught if "synchroniz" in str(w.message).lower())
        out.append((syncs, b.embeddings_computed != before))
    return out


@pytest.mark.parametrize("prune", [False, True])
@pytest.mark.parametrize("row_cache_bytes", [0, 256 * 2**20])
def test_an_eager_step_reads_the_device_three_times_and_once_more_to_prune(prune, row_cache_bytes):
    g = torch.Generator().manual_seed(0)
    arms = torch.rand(20_000, 8, generator=g, dtype=torch.float64)
    values = torch.sin(6 * arms).sum(-1)  # on the host
    b = BKB(arms.cuda(), GaussianKernel(0.5), noise=0.01, beta=0.5, seed=0, prune=prune,
            row_cache_bytes=row_cache_bytes)
    b.fixed_capacity = False  # the eager update, as past the row limit
    _steps_reads(b, values, 80)  # warm-up
    reads = _steps_reads(b, values, 30)
    base = 4 if prune else 3
    assert min(s for s, _ in reads) >= 2, reads  # counted at all
    assert sum(s > base for s, _ in reads) <= 2, reads  # the accuracy check
