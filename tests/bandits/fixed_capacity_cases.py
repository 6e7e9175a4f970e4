"""The fixed-capacity tests' problem and drivers: seeded arms and reward noise, a run's picks with the fixed-capacity
update on or off, and a run that counts the host reads of every ask and tell."""

from __future__ import annotations

import torch

from helpers import HostReads
from torchbkb.gp.kernels import GaussianKernel


def problem(seed: int, device, A: int = 300, twins: bool = False):
    """`(A, 2)` arms on ``device`` and their values ``Σ sin(5 x)``; ``twins``: every point twice, 1e-7 apart."""
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, generator=g, dtype=torch.float64)
    if twins:  # every point twice, 1e-7 apart: a dictionary holding both has a K_S singular to rounding
        arms = torch.cat([arms[: A // 2], arms[: A // 2] + 1e-7])
    return arms.to(device), torch.sin(5 * arms).sum(-1).to(device)


def reward_noise(seed: int, skip: int = 0) -> torch.Generator:
    """The reward noise of run ``seed``, past the draws of its first ``skip`` one-arm steps."""
    g = torch.Generator().manual_seed(100 + seed)
    for _ in range(skip):
        torch.randn((1,), generator=g, dtype=torch.float64)
    return g


def drive(b, f, T: int, g: torch.Generator, picks: list[int], stop_at: int | None = None) -> list[int]:
    """Ask and tell ``b`` until ``T`` evaluations (or ``stop_at``), the rewards ``f`` plus noise from ``g``; the picks
    appended to ``picks``."""
    while b.t < T:
        idx = b.ask()
        picks += idx.tolist()
        b.tell(idx, f[idx] + 0.1 * torch.randn(idx.shape, generator=g, dtype=torch.float64).to(f.device))
        if stop_at is not None and b.t >= stop_at:
            break
    return picks


def run_picks(cls, arms, f, *, fixed: bool, T: int, seed: int, stop_at: int | None = None, setup=None, **kw):
    """Picks of a bandit run to ``T`` evaluations (noisy rewards from a seeded generator); ``setup(bandit)`` sets
    what the constructor does not (the engine's compilation, BBKB's device loop)."""
    kw = {"noise": 0.01, "q_bar": 2.0, "beta": 0.5, "seed": seed} | kw
    b = cls(arms, GaussianKernel(0.2), **kw)
    b.fixed_capacity = fixed
    if setup is not None:
        setup(b)
    return drive(b, f, T, reward_noise(seed), [], stop_at), b


def compiled_with(backend):
    """A ``setup`` for :func:`run_picks`: the fixed-capacity update compiled with ``backend``."""
    def setup(b):
        b.engine.compiled, b.engine.backend = True, backend
    return setup


def counted_run(b, f, T: int, g: torch.Generator, *, host_rewards: bool):
    """:func:`drive` counting the host reads of every ``ask`` and of every ``tell`` (given ask's own tensor, and the
    rewards as a host list when ``host_rewards``); returns ``(picks, asks, tells)``. A new pulled arm's kernel row is
    checked in the update's own read where torch scans it: no read of its own."""
    picks, asks, tells = [], [], []
    while b.t < T:
        with HostReads() as r:
            idx = b.ask()
        asks.append(len(r.calls))
        y = f[idx] + 0.1 * torch.randn(idx.shape, generator=g, dtype=torch.float64).to(f.device)
        y = y.cpu().tolist() if host_rewards else y
        picks += b.pending.tolist()
        with HostReads() as r:
            b.tell(idx, y)
        tells.append(len(r.calls))
    return picks, asks, tells
