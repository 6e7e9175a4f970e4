"""Finite-arm bandit algorithms with an ask/tell protocol (see :mod:`torchbkb.bandits.base`)."""

from torchbkb.bandits.base import Bandit, KernelBandit
from torchbkb.bandits.baselines import EpsGreedy, Random
from torchbkb.bandits.bkb import BKB
from torchbkb.bandits.bbkb import BBKB
from torchbkb.bandits.gpbucb import GPBUCB
from torchbkb.bandits.gpucb import GPUCB
from torchbkb.bandits.sbpe import SBPE, sbpe_batch_sizes
from torchbkb.bandits.thompson_bkb import ThompsonBKB

__all__ = ["Bandit", "KernelBandit", "Random", "EpsGreedy", "GPUCB", "BKB", "BBKB", "GPBUCB", "SBPE",
           "sbpe_batch_sizes", "ThompsonBKB"]
