"""Online kernel regression on adversarial streams (paper 004: Jézéquel, Gaillard, Rudi).

* :class:`PKAWV` -- Kernel-AWV projected on Taylor features (:class:`TaylorEmbedding`) or on a
  Nyström subspace grown by :class:`KORSDictionary`, ``O(D²)`` / ``O(m²)`` per round;
* baselines: :class:`KernelAWV` (exact, ``O(t²)`` per round), :class:`OnlineKRR`, :class:`FOGD`,
  :class:`ProsNKONS` (KONS on a KORS embedding with restarts, 004 Fig. 3);
* :meth:`OnlineLearner.fit_stream` plays a stream and returns a :class:`StreamResult`.

Example:
    >>> import torch
    >>> from torchbkb.online import PKAWV, TaylorEmbedding, taylor_degree
    >>> X = torch.rand(1000, 3, dtype=torch.float64) * 2 - 1
    >>> y = torch.tanh(X.sum(-1))
    >>> res = PKAWV(embedding=TaylorEmbedding(3, degree=3), lam=1.0).fit_stream(X, y)
    >>> res.n_rounds, bool(res.average_loss < 0.05)
    (1000, True)
"""

from torchbkb.online.fogd import FOGD
from torchbkb.online.kernel_awv import KernelAWV, OnlineKRR
from torchbkb.online.kors import KORSDictionary
from torchbkb.online.nystrom_basis import IncrementalNystromBasis
from torchbkb.online.pkawv import PKAWV
from torchbkb.online.pros_n_kons import ProsNKONS
from torchbkb.online.stream import OnlineLearner, StreamResult
from torchbkb.online.taylor import TaylorEmbedding, taylor_degree, taylor_kernel_error_bound, taylor_num_features

__all__ = [
    "PKAWV",
    "ProsNKONS",
    "TaylorEmbedding",
    "taylor_degree",
    "taylor_num_features",
    "taylor_kernel_error_bound",
    "KORSDictionary",
    "IncrementalNystromBasis",
    "KernelAWV",
    "OnlineKRR",
    "FOGD",
    "OnlineLearner",
    "StreamResult",
]
