"""The observations a :class:`~torchbkb.botorch.BKBModel` holds, in its transformed space.

A model is built on training data; ``condition_on_observations`` (BoTorch's fantasies) and ``hallucinate`` (BBKB's
pending points) add blocks to it. Every block is stored detached, so that a model whose hyperparameters change
rebuilds its posterior from all its data; blocks are never expanded to a common batch shape until read.

Example:
    >>> import torch
    >>> X = torch.rand(5, 2, dtype=torch.float64)
    >>> data = ModelData(X, X.sum(-1), None)
    >>> grown = data.append(torch.rand(3, 4, 2, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64), None)
    >>> grown.X.shape, grown.batch_shape, data.X.shape              # the original is unchanged
    (torch.Size([3, 9, 2]), torch.Size([3]), torch.Size([5, 2]))
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["ModelData", "DataBlock"]


class DataBlock(NamedTuple):
    """Observations `X` `(*b, k, d)`, outcomes `y` `(*b, k)` (transformed, not centered) and noise variances
    `(*b, k)` or ``None`` (the model's learned noise); ``hallucinated`` blocks hold the posterior mean as outcome."""

    X: Tensor
    y: Tensor
    noise: Tensor | None
    hallucinated: bool


class ModelData:
    """An immutable sequence of :class:`DataBlock`; the first is the training data the model was built on.

    Args:
        X: `(*b, n, d)` transformed training inputs.
        y: `(*b, n)` transformed training outcomes.
        noise: `(*b, n)` known noise variances (transformed outcomes), or ``None``.
    """

    def __init__(self, X: Tensor, y: Tensor, noise: Tensor | None):
        self.blocks: tuple[DataBlock, ...] = (DataBlock(X.detach(), y.detach(), _detach(noise), False),)

    def append(self, X: Tensor, y: Tensor, noise: Tensor | None, hallucinated: bool = False) -> ModelData:
        """A new :class:`ModelData` with one more block (this one is unchanged); tensors are stored detached."""
        new = ModelData.__new__(ModelData)
        new.blocks = (*self.blocks, DataBlock(X.detach(), y.detach(), _detach(noise), hallucinated))
        return new

    @property
    def batch_shape(self) -> torch.Size:
        """The broadcast batch shape of every block."""
        shapes = [s for b in self.blocks for s in (b.X.shape[:-2], b.y.shape[:-1])]
        shapes += [b.noise.shape[:-1] for b in self.blocks if b.noise is not None]
        return torch.broadcast_shapes(*shapes)

    @property
    def num_points(self) -> int:
        """``n``, the number of points in every block together."""
        return sum(int(b.X.shape[-2]) for b in self.blocks)

    @property
    def X(self) -> Tensor:
        """`(*batch, n, d)` every input, block after block."""
        return _cat([b.X for b in self.blocks], self.batch_shape, 2)

    @property
    def y(self) -> Tensor:
        """`(*batch, n)` every outcome."""
        return _cat([b.y for b in self.blocks], self.batch_shape, 1)

    @property
    def has_noise(self) -> bool:
        """Whether some block carries its own noise variances."""
        return any(b.noise is not None for b in self.blocks)

    def noise(self, default: Tensor, hallucinated: bool = True) -> Tensor:
        """`(*batch, n)` every point's noise variance, ``default`` (broadcast against `(*batch, k)`) where a block
        has none; without the hallucinated blocks if ``hallucinated`` is false."""
        parts = [b.noise if b.noise is not None else default.expand(*b.y.shape) for b in self._select(hallucinated)]
        batch = torch.broadcast_shapes(self.batch_shape, *(p.shape[:-1] for p in parts))
        return _cat(parts, batch, 1)

    def observed(self) -> tuple[Tensor, Tensor]:
        """``(X, y)`` of the observed blocks (hallucinated ones left out), `(*batch, n', d)` and `(*batch, n')`."""
        blocks = self._select(False)
        return _cat([b.X for b in blocks], self.batch_shape, 2), _cat([b.y for b in blocks], self.batch_shape, 1)

    def observed_noise(self) -> Tensor | None:
        """The observed blocks' noise (as :meth:`noise`) when every one of them carries it, else ``None``."""
        blocks = self._select(False)
        if any(b.noise is None for b in blocks):
            return None
        return _cat([b.noise for b in blocks], self.batch_shape, 1)

    def hallucinated_inputs(self) -> list[Tensor]:
        """The inputs of the hallucinated blocks, in order."""
        return [b.X for b in self.blocks if b.hallucinated]

    def map_blocks(self, fn) -> ModelData:
        """A new :class:`ModelData` of ``fn(block)`` for every block (``fn`` returns ``(X, y, noise)``)."""
        new = ModelData.__new__(ModelData)
        new.blocks = tuple(DataBlock(*(_detach(t) for t in fn(b)), b.hallucinated) for b in self.blocks)
        return new

    def apply(self, fn) -> ModelData:
        """A copy with ``fn`` applied to every floating tensor (``nn.Module._apply``: ``.to()``, ``.double()``)."""
        return self.map_blocks(lambda b: (fn(b.X), fn(b.y), None if b.noise is None else fn(b.noise)))

    def _select(self, hallucinated: bool) -> list[DataBlock]:
        return [b for b in self.blocks if hallucinated or not b.hallucinated]


def _detach(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()


def _cat(parts: list[Tensor], batch: torch.Size, trailing: int) -> Tensor:
    """Concatenate along the first of the ``trailing`` core dimensions after expanding every batch to ``batch``."""
    if len(parts) == 1 and parts[0].shape[:-trailing] == batch:
        return parts[0]
    return torch.cat([p.expand(*batch, *p.shape[-trailing:]) for p in parts], dim=-trailing)
