"""The eager update's device path -- torch scanning the new kernel rows and their finiteness read with the dictionary
drawn, ``K_S``'s and ``V``'s Cholesky flags read together -- makes the CPU path's choices bit for bit. The CPU takes
it where NumPy cannot scan the rows (a GPU; here ``HOST_DTYPES`` emptied, as ``--cuda-defaults`` does): a
well-conditioned dictionary takes the Cholesky whitening from the merged read, a singular one falls back to
``eigh`` as the CPU's update does."""

import math

import pytest
import torch

from fixed_capacity_cases import problem, reward_noise, run_picks
from torchbkb import BBKB, BKB
from torchbkb.bandits import kernel_rows
from torchbkb.gp.kernels import GaussianKernel


@pytest.mark.parametrize("cls", [BKB, BBKB])
@pytest.mark.parametrize("twins", [False, True])
def test_the_device_path_of_the_eager_update_makes_the_cpus_choices(cls, twins, monkeypatch):
    arms, f = problem(11, "cpu", A=120 if twins else 300, twins=twins)
    kw = {"q_bar": 50.0, "beta": 2.0} if twins else {}
    cpu_picks, cpu = run_picks(cls, arms, f, fixed=False, T=150, seed=11, **kw)
    monkeypatch.setattr(kernel_rows, "HOST_DTYPES", ())
    dev_picks, dev = run_picks(cls, arms, f, fixed=False, T=150, seed=11, **kw)
    assert dev_picks == cpu_picks
    assert torch.equal(dev.dictionary, cpu.dictionary) and dev.embeddings_computed == cpu.embeddings_computed
    for a, b in zip(dev.scores(), cpu.scores()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(dev.V_inverse(), cpu.V_inverse(), rtol=0, atol=0)
    if twins:  # both twins of a point held: K_S singular to rounding, the eigh branch
        held = set(dev.dictionary.tolist())
        assert any(a + 60 in held for a in held if a < 60)


def test_a_streamed_step_reads_its_rows_finiteness_once_a_pass(monkeypatch):
    """Dictionary rows streamed in 20 chunks, torch scanning them: an update reads their finiteness once for ``K_S``
    and the pulled arms' features together, once for all the chunks it scores (a GPU waits once a pass, not once a
    chunk), and the picks are the CPU path's."""
    from helpers import DeviceReads

    arms, f = problem(12, "cpu", A=20_000)
    kw = {"kernel_cache_bytes": 0, "chunk_size": 1024, "prune": False}
    cpu_picks, _ = run_picks(BKB, arms, f, fixed=False, T=60, seed=12, **kw)
    monkeypatch.setattr(kernel_rows, "HOST_DTYPES", ())
    b = BKB(arms, GaussianKernel(0.2), noise=0.01, q_bar=2.0, beta=0.5, seed=12, **kw)
    b.fixed_capacity = False
    g, picks, scalar_reads = reward_noise(12), [], []
    while b.t < 60:
        with DeviceReads() as r:
            idx = b.ask()
            picks += idx.tolist()
            b.tell(idx, f[idx] + 0.1 * torch.randn(idx.shape, generator=g, dtype=torch.float64))
        scalar_reads.append(r.names.count("aten::_local_scalar_dense"))
    assert b.streams_kernel_rows and picks == cpu_picks
    # a changed dictionary: K_S with the pulled rows, the scores (its Cholesky flags come in one tolist); the same
    # dictionary: the pulled rows, V's flag, the scores; 20 chunks a pass read one by one would be over 20
    assert max(scalar_reads[1:]) <= 3 + 3, scalar_reads  # the accuracy check's own three on the steps it runs
    checks = 2 + math.ceil(math.log(b.dictionary_size) / math.log(1.25))  # growths by a quarter, at most
    assert sum(n > 3 for n in scalar_reads[1:]) <= checks, scalar_reads
