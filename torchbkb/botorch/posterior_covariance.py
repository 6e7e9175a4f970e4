"""A joint posterior covariance as a lazy ``LinearOperator``: the prior's kernel operator plus low-rank terms.

BoTorch reads marginals (``posterior(X).variance``, Ax's predictions over 4,096-point chunks) through the
covariance's diagonal. For a large ``q`` the covariance ``K_qq + Σ c R Rᵀ`` is kept as a sum of operators, so that
its diagonal costs ``O(q·r)`` and no `(q, q)` block is formed unless a caller asks for it (sampling, ``to_dense``):
the same structure as ``SingleTaskGP``'s own posterior covariance.

Example:
    >>> import torch
    >>> from linear_operator import to_linear_operator
    >>> R = torch.rand(300, 4, dtype=torch.float64)
    >>> prior = to_linear_operator(torch.eye(300, dtype=torch.float64) * 5)
    >>> cov = lazy_covariance(prior, [(R, -1.0)], None)
    >>> bool(torch.allclose(cov.diagonal(), 5 - (R * R).sum(-1)))
    True
"""

from __future__ import annotations

import torch
from linear_operator import LinearOperator
from linear_operator.operators import DiagLinearOperator, MatmulLinearOperator, SumLinearOperator
from torch import Tensor

__all__ = ["LAZY_JOINT", "lazy_covariance"]

#: Past this many points a model's joint posterior covariance is lazy (below it, a dense `(q, q)` block is cheap and
#: what acquisition functions over a few points read anyway).
LAZY_JOINT = 128


def lazy_covariance(prior: LinearOperator, roots: list[tuple[Tensor, float]], noise: Tensor | None) -> LinearOperator:
    """``prior + Σ c R Rᵀ (+ diag(noise))`` as a ``LinearOperator`` of the broadcast batch shape.

    Args:
        prior: `(*b, q, q)` the prior covariance operator.
        roots: ``[(R, c), ...]``, ``R`` `(*b', q, r)` and ``c`` a float.
        noise: `(*b'', q)` variances added on the diagonal, or ``None``.

    Returns:
        A `(*batch, q, q)` ``LinearOperator``; its ``diagonal()`` never forms a `(q, q)` block.
    """
    shapes = [prior.shape[:-2], *(R.shape[:-2] for R, _ in roots)]
    if noise is not None:
        shapes.append(noise.shape[:-1])
    batch = torch.broadcast_shapes(*shapes)
    q = prior.shape[-1]
    terms = [prior.expand(*batch, q, q) if prior.shape[:-2] != batch else prior]
    for R, c in roots:
        R = R.expand(*batch, *R.shape[-2:])  # (*batch, q, r)
        terms.append(MatmulLinearOperator(R * c, R.transpose(-1, -2)))
    if noise is not None:
        terms.append(DiagLinearOperator(noise.expand(*batch, q)))
    return SumLinearOperator(*terms)
