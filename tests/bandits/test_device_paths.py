"""The eager update's device path -- torch scanning the new kernel rows and their finiteness read with the dictionary
drawn, ``K_S``'s and ``V``'s Cholesky flags read together -- makes the CPU path's choices bit for bit. The CPU takes
it where NumPy cannot scan the rows (a GPU; here ``HOST_DTYPES`` emptied, as ``--cuda-defaults`` does): a
well-conditioned dictionary takes the Cholesky whitening from the merged read, a singular one falls back to
``eigh`` as the CPU's update does."""

import pytest
import torch

from fixed_capacity_cases import problem, run_picks
from torchbkb import BBKB, BKB
from torchbkb.bandits import kernel_rows


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
