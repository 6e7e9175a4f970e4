"""The loop tests' arms, values and a bandit that asks uniform batches."""

import torch

from torchbkb.bandits.base import Bandit

A = 300
ARMS = torch.rand(A, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
F = torch.sin(5 * ARMS[:, 0]) * torch.cos(3 * ARMS[:, 1]) + ARMS[:, 1]


class Batches(Bandit):
    """Asks ``size`` uniform arms (among those not excluded) per batch."""

    def __init__(self, arms, size, seed=0):
        super().__init__(arms, seed=seed)
        self.size = size

    def _select(self):
        allowed = (~self.excluded).nonzero().squeeze(1)
        return allowed[torch.randint(0, allowed.numel(), (self.size,), generator=self.generator)]
