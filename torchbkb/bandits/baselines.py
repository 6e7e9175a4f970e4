"""Model-free baselines: uniform :class:`Random` and :class:`EpsGreedy` (the BBKB paper's Fig. 1 peer).

Example:
    >>> import torch
    >>> from torchbkb.bandits.baselines import EpsGreedy
    >>> arms = torch.rand(5, 1)
    >>> bandit = EpsGreedy(arms, epsilon=0.0, seed=0)    # pure exploitation after the first pull
    >>> first = bandit.ask(); bandit.tell(first, torch.tensor([1.0]))
    >>> bool(bandit.ask() == first)                     # the best empirical mean is the only pulled arm
    True
"""

from __future__ import annotations

import torch

from torchbkb.bandits.base import Bandit
from torchbkb.errors import InputDataError

__all__ = ["Random", "EpsGreedy"]


class Random(Bandit):
    """Pulls an arm uniformly at random at every step.

    Args:
        arms: `(A, d)`.
        seed: generator seed.

    Example:
        >>> import torch
        >>> Random(torch.rand(4, 2), seed=1).ask().shape
        torch.Size([1])
    """

    def _select(self) -> torch.Tensor:
        if bool(self.excluded.any()):
            allowed = self._allowed()
            return allowed[torch.randint(0, int(allowed.numel()), (1,), generator=self.generator).to(allowed.device)]
        return torch.randint(0, self.num_arms, (1,), generator=self.generator).to(self.arms.device)


class EpsGreedy(Bandit):
    """ε-greedy on empirical means: with probability ``ε`` a uniform arm, otherwise the pulled arm with
    the highest mean reward (lowest index on ties). The first arm is uniform, and so is an arm chosen while every
    pulled arm is excluded (uniform among the arms not excluded).

    Args:
        arms: `(A, d)`.
        epsilon: exploration probability in ``[0, 1]``.
        seed: generator seed.

    Example:
        >>> import torch
        >>> b = EpsGreedy(torch.rand(4, 2), epsilon=1.0, seed=0)   # ε = 1 is uniform sampling
        >>> 0 <= int(b.ask()) < 4
        True
    """

    def __init__(self, arms: torch.Tensor, epsilon: float = 0.1, *, seed: int | None = None):
        super().__init__(arms, seed=seed)
        if not 0.0 <= float(epsilon) <= 1.0:
            raise InputDataError(f"epsilon: expected a probability in [0, 1], got {epsilon!r}")
        self.epsilon = float(epsilon)

    def _select(self) -> torch.Tensor:
        explore = float(torch.rand((), generator=self.generator)) < self.epsilon
        allowed = self._allowed() if bool(self.excluded.any()) else None
        if allowed is None:
            uniform = torch.randint(0, self.num_arms, (1,), generator=self.generator).to(self.arms.device)
        else:
            uniform = allowed[torch.randint(0, int(allowed.numel()), (1,), generator=self.generator).to(allowed.device)]
        if explore or self.t == 0:
            return uniform
        means = torch.where(self.counts > 0, self.reward_sums / self.counts.clamp_min(1),
                            torch.full_like(self.reward_sums, -torch.inf))
        means = self._mask_excluded(means)
        best = torch.argmax(means).reshape(1)
        if allowed is not None and bool(means[best] == -torch.inf):  # every pulled arm excluded: none to exploit
            return uniform
        return best
