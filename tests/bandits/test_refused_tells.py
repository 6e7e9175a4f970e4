"""A refused ``tell`` leaves every bandit as it was, in both update modes, in the middle of a batch too.

Each bandit is warmed up, asked a batch and then told something wrong about it (a NaN, an arm it did not ask, a
mis-shaped tensor, ...). The tell must raise a :class:`~torchbkb.errors.TorchBKBError`, its state must be bitwise
unchanged, and told the right rewards afterwards it must pick what an untouched copy picks. The fixed-capacity update
(with BBKB's device loop) is a GPU's default; here it runs on the CPU with the same code.
"""

import copy
import math

import numpy as np
import pytest
import torch

from helpers import gpu_defaults, same_state
from torchbkb import BBKB, BKB, GPBUCB, GPUCB, ThompsonBKB
from torchbkb.errors import TorchBKBError
from torchbkb.gp.kernels import GaussianKernel

A = 40
ARMS = torch.rand(A, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
F = -((ARMS - 0.4) ** 2).sum(-1)
KERNEL = GaussianKernel(0.3)


BANDITS = {
    "bkb": lambda: BKB(ARMS, KERNEL, noise=0.1, q_bar=2.0, beta=0.3, seed=0),
    "bkb_fixed": lambda: gpu_defaults(BKB(ARMS, KERNEL, noise=0.1, q_bar=2.0, beta=0.3, seed=0)),
    "bbkb": lambda: BBKB(ARMS, KERNEL, noise=0.1, q_bar=2.0, beta=0.3, seed=0),
    "bbkb_fixed": lambda: gpu_defaults(BBKB(ARMS, KERNEL, noise=0.1, q_bar=2.0, beta=0.3, seed=0)),
    "bbkb_q3": lambda: BBKB(ARMS, KERNEL, noise=0.1, q_bar=2.0, beta=0.3, seed=0, batch_size=3),
    "gpbucb": lambda: GPBUCB(ARMS, KERNEL, noise=0.1, beta=0.3, seed=0),
    "gpucb": lambda: GPUCB(ARMS, KERNEL, noise=0.1, beta=0.3, seed=0),
    "thompson": lambda: ThompsonBKB(ARMS, KERNEL, noise=0.1, seed=0),
}


def _bad_tells(i: torch.Tensor, y: torch.Tensor):
    """``(name, indices, rewards, message)`` for the batch ``i`` asked with rewards ``y``."""
    n, ids = i.numel(), i.tolist()
    inf_last = torch.cat([y[:-1], torch.tensor([math.inf], dtype=y.dtype)])
    return [
        ("nan", i, torch.full_like(y, math.nan), "finite"),
        ("inf last", i, inf_last, "finite"),
        ("-inf", i, torch.full_like(y, -math.inf), "finite"),
        ("one reward more", i, torch.cat([y, y[:1]]), "rewards"),
        ("rewards (k, 2)", i, torch.stack([y, y], 1), "rewards"),
        ("float indices", i.double(), y, "integer tensor"),
        ("bool indices", torch.ones(n, dtype=torch.bool), y, "integer tensor"),
        ("indices (k, 2)", torch.stack([i, i], 1), torch.cat([y, y]), r"expected shape \(k,\) or \(k, 1\)"),
        ("indices (1, 1, k)", i[None, None], y, r"expected shape \(k,\) or \(k, 1\)"),
        ("past the arms", torch.full_like(i, A), y, r"in \[0, 40\)"),
        ("negative", torch.full_like(i, -1), y, r"in \[0, 40\)"),
        ("not asked", torch.tensor([(a + 1) % A for a in ids]) if n == 1 else torch.tensor([ids[0]] * (n + 1)),
         y[:1] if n == 1 else torch.cat([y, y[:1]]), "were asked"),
        ("no arm", torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.float64), "at least one"),
        ("string rewards", i, "x", "rewards"),
        ("complex rewards", i, y.to(torch.complex128), "rewards"),
        ("NaN in a list", ids, [math.nan] * n, "finite"),
        ("NaN in NumPy", i, np.full(n, np.nan), "rewards"),
        ("float16 NaN", i, torch.full((n,), math.nan, dtype=torch.float16), "finite"),
        ("overflow", i, torch.full((n,), 1e308, dtype=torch.float64) * 10, "finite"),
    ]


def _steps(b, n: int) -> None:
    for _ in range(n):
        i = b.ask()
        b.tell(i, F[i])


@pytest.fixture(scope="module")
def warmed():
    """Each bandit new and warmed up for 6 batches, then asked one: built once for every bad tell."""
    out = {}
    for name, make in BANDITS.items():
        for warm in (0, 6):
            b = make()
            _steps(b, warm)
            out[name, warm] = (b, b.ask())
    return out


@pytest.mark.parametrize("name", list(BANDITS))
@pytest.mark.parametrize("warm", [0, 6])
def test_a_refused_tell_changes_nothing_and_the_bandit_goes_on_as_an_untouched_copy(warmed, name, warm):
    base, asked = warmed[name, warm]
    for what, idx, y, message in _bad_tells(asked, F[asked]):
        b = copy.deepcopy(base)
        before = copy.deepcopy(b.state_dict())
        with pytest.raises(TorchBKBError, match=message):
            b.tell(idx, y)
        assert same_state(before, b.state_dict()), what
        twin = copy.deepcopy(base)
        for bandit in (b, twin):
            bandit.tell(asked, F[asked])
            _steps(bandit, 3)
        assert torch.equal(b.ask(), twin.ask()), what


@pytest.mark.parametrize("name", ["bbkb", "bbkb_fixed", "gpbucb"])
def test_a_refused_tell_in_the_middle_of_a_batch_keeps_the_part_already_told(name):
    b = BANDITS[name]()
    _steps(b, 4)
    asked = b.ask()
    while asked.numel() < 2:  # a batch of at least two arms, to tell it in parts
        b.tell(asked, F[asked])
        asked = b.ask()
    b.tell(asked[:1], F[asked[:1]])
    before = copy.deepcopy(b.state_dict())
    rest = asked[1:]
    with pytest.raises(TorchBKBError, match="finite"):
        b.tell(rest, torch.full((rest.numel(),), math.nan, dtype=torch.float64))
    assert same_state(before, b.state_dict())
    assert b.pending.tolist() == rest.tolist()
    twin = copy.deepcopy(b)
    for bandit in (b, twin):
        bandit.tell(rest, F[rest])
        _steps(bandit, 2)
    assert torch.equal(b.ask(), twin.ask())
