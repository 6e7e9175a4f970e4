"""The scoring chunk: sized for the device by default, the user's chunk used as given, the same choices either way."""

import pytest
import torch

from torchbkb import BBKB, BKB
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel
from torchbkb.gp.nystrom import DEFAULT_CHUNK
from torchbkb.gp.scoring_chunk import GPU_BLOCK_BYTES, scoring_chunk


def _run(cls, arms, chunk_size, steps=25, **kw):
    values = torch.sin(5 * arms).sum(-1)
    b = cls(arms, GaussianKernel(0.4), noise=0.05, beta=0.5, seed=3, chunk_size=chunk_size, **kw)
    g = torch.Generator(device=arms.device).manual_seed(0)
    picks = []
    for _ in range(steps):
        idx = b.ask()
        b.tell(idx, values[idx] + 0.1 * torch.randn(idx.shape, generator=g, dtype=arms.dtype, device=arms.device))
        picks.append(idx.cpu())
    return torch.cat(picks), b


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_the_device_sized_chunk_and_any_given_chunk_make_the_same_choices(cls, device):
    arms = torch.rand(700, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    default, b = _run(cls, arms, None)
    assert b.score_chunk_size is None and b.chunk_size == DEFAULT_CHUNK
    for chunk in (7, 256, DEFAULT_CHUNK):
        given, b = _run(cls, arms, chunk)
        assert b.score_chunk_size == chunk
        assert torch.equal(default, given)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "16", float("nan")])
def test_a_bad_chunk_is_refused_with_a_typed_error(bad):
    arms = torch.rand(50, 2, dtype=torch.float64)
    with pytest.raises(InputDataError, match="chunk_size: expected None or an integer >= 1"):
        BKB(arms, GaussianKernel(0.4), noise=0.05, beta=0.5, chunk_size=bad)


def test_the_chunk_is_cache_sized_on_the_cpu_and_block_sized_on_a_gpu():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert scoring_chunk(None, 10, cpu, torch.float64) == DEFAULT_CHUNK
    for m, dtype, size in [(52, torch.float64, 8), (52, torch.float32, 4), (1000, torch.float64, 8)]:
        c = scoring_chunk(None, m, cuda, dtype)
        assert c * m * size <= max(GPU_BLOCK_BYTES, DEFAULT_CHUNK * m * size) and c >= DEFAULT_CHUNK
    assert scoring_chunk(None, 52, cuda, torch.float64) == GPU_BLOCK_BYTES // (52 * 8)
    assert scoring_chunk(None, 10**6, cuda, torch.float64) == DEFAULT_CHUNK  # never below the CPU's chunk
    assert scoring_chunk(300, 52, cuda, torch.float64) == 300  # the user's chunk, as given
