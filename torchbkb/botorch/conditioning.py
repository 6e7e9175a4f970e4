"""Conditioning a DTC posterior on new observations, as BoTorch's fantasies need: differentiable, batched.

Example:
    >>> import torch
    >>> from torchbkb import DTCPosterior, NystromEmbedding
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(12, 1, dtype=torch.float64); y = X[:, 0]
    >>> post = DTCPosterior(NystromEmbedding(GaussianKernel(0.3), X[:4]), noise=0.1).fit(X[:10], y[:10])
    >>> new = shallow_module_copy(post)
    >>> dtc_condition(new, X[10:], y[10:], None, torch.Size())
    >>> new.num_train, post.num_train
    (12, 10)
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from torchbkb.gp.dtc_posterior import DTCPosterior

__all__ = ["dtc_condition", "shallow_module_copy"]


def dtc_condition(post: DTCPosterior, X_tf: Tensor, y: Tensor, counts: Tensor | None, batch: torch.Size) -> None:
    """Add observed rows to ``post`` in place by rank-one updates (or one refactorization), keeping the
    autograd graph to ``X_tf`` and ``y``; ``X_tf`` is embedded once for all fantasies.

    Args:
        X_tf: `(*bx, k, d)`; y: `(*by, k)`; counts: `(*bc, k)` weights or None; batch: the broadcast batch shape.
    """
    Z = post.embedding(X_tf, validate=False)  # (*bx, k, r): shared by every fantasy sample; the model checked X, and
    # update_features checks Z (a transform's NaN shows there)
    if counts is None:
        counts = torch.ones(X_tf.shape[:-1], dtype=X_tf.dtype, device=X_tf.device)
    post.update_features(Z, y, counts)  # ZtZ/V⁻¹ keep batch (*bx, *old); Zty/weights get the fantasy dims
    d = X_tf.shape[-1]

    def grow(old: Tensor, new: Tensor, tail: tuple) -> Tensor:
        return torch.cat([old.expand(*batch, *old.shape[-len(tail):]), new.expand(*batch, *new.shape[-len(tail):])],
                         dim=-len(tail))

    post.train_X = grow(post.train_X, X_tf, (None, d))  # (*batch, n + k, d)
    post.train_y = grow(post.train_y, y, (None,))
    post.train_counts = grow(post.train_counts, counts.to(post.train_counts), (None,))
    post.pending_X = post.pending_X.expand(*batch, *post.pending_X.shape[-2:])
    post.pending_counts = post.pending_counts.expand(*batch, post.pending_counts.shape[-1])


def shallow_module_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing submodules and tensors, with its own attribute/buffer/module tables."""
    new = copy.copy(module)
    new.__dict__ = dict(module.__dict__)
    for table in ("_parameters", "_buffers", "_modules"):
        new.__dict__[table] = dict(module.__dict__[table])
    return new
