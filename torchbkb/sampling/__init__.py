"""Dictionary sampling: ridge-leverage-score resampling (BKB's :class:`RLSDictionary`), recursive RLS sampling
and BKB's variance sampling replayed over a given training set (:func:`sample_dictionary`, used by ``BKBModel``).

Example:
    >>> import torch
    >>> from torchbkb.gp import GaussianKernel
    >>> from torchbkb.sampling import sample_dictionary
    >>> X = torch.rand(200, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> S = sample_dictionary(GaussianKernel(0.2), X, noise=0.01, generator=torch.Generator().manual_seed(0))
    >>> 0 < S.shape[0] < 200
    True
"""

from torchbkb.sampling.dictionary_replay import draw_dictionary, sample_dictionary
from torchbkb.sampling.recursive_rls import RecursiveRLSResult, nystrom_lambda_max, recursive_rls
from torchbkb.sampling.rls_dictionary import RLSDictionary

__all__ = ["RLSDictionary", "recursive_rls", "RecursiveRLSResult", "nystrom_lambda_max", "sample_dictionary",
           "draw_dictionary"]
