"""The sparse posterior S-BPE fits on a set of points: a recursive-RLS dictionary, its embedding and the DTC fit.

The uncertainty design redraws it over its picks at every refresh, and S-BPE over each batch for its elimination.
When kernel values among the points are NaN/inf, the error names the points at fault, so the caller can leave
them out.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(40, 2, dtype=torch.float64)
    >>> indices, emb, post = sketched_fit(X, torch.sin(X[:, 0]), GaussianKernel(0.5).double(), 0.01,
    ...                                   names=list(range(40)), oversample=2.0, base_size=None, delta=0.01,
    ...                                   generator=torch.Generator().manual_seed(0), chunk_size=1024)
    >>> emb.num_inducing == indices.numel(), post.num_train
    (True, 40)
"""

from __future__ import annotations

import torch

from torchbkb.bandits.kernel_rows import nonfinite_kernel_rows
from torchbkb.errors import NumericsError, nonfinite_rows_error
from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.gp.kernels import KernelAdapter
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.sampling.recursive_rls import recursive_rls

__all__ = ["sketched_fit"]


def sketched_fit(X: torch.Tensor, y: torch.Tensor, kernel: KernelAdapter, noise: float, *, names: list[int],
                 oversample: float | str, base_size: int | None, delta: float, generator: torch.Generator,
                 chunk_size: int) -> tuple[torch.Tensor, NystromEmbedding, DTCPosterior]:
    """The sparse posterior of `(n, d)` ``X`` with rewards `(n,)` ``y``: a recursive-RLS dictionary of ``X``, its
    embedding and the DTC fit (the design's refresh and S-BPE's elimination). Returns ``(indices, embedding,
    posterior)``, ``indices`` the dictionary's rows of ``X``. When the draw, ``K_S`` or the fit fails on kernel
    values NaN/inf among ``X``, the :class:`~torchbkb.errors.NumericsError` names ``names[i]`` (its ``arms``) for
    each such row ``i`` of ``k(X, X)``."""
    try:
        res = recursive_rls(X, kernel, noise, oversample=oversample, base_size=base_size, delta=delta,
                            generator=generator, chunk_size=chunk_size)
        emb = NystromEmbedding(kernel, X[res.indices], chunk_size=chunk_size)
        return res.indices, emb, DTCPosterior(emb, noise=noise, chunk_size=chunk_size).fit(X, y)
    except NumericsError:
        bad = nonfinite_kernel_rows(kernel, X, chunk_size=chunk_size)
        if bad:
            raise nonfinite_rows_error(sorted({names[i] for i in bad})) from None
        raise
