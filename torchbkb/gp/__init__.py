"""The Gaussian-process layer: kernels, the Nyström embedding, the DTC and exact posteriors, their functional
algebra and the fit every DTC posterior holds (:class:`DTCFit`), the collapsed evidence bound and the linear algebra
under them. It imports nothing else of torchbkb but its errors and utilities.

Example:
    >>> import torch
    >>> from torchbkb.gp import DTCPosterior, GaussianKernel, NystromEmbedding
    >>> emb = NystromEmbedding(GaussianKernel(0.5), torch.rand(4, 2, dtype=torch.float64))
    >>> DTCPosterior(emb, noise=0.1).embedding.num_inducing
    4
"""

from torchbkb.gp.dtc_fit import DTCFit
from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.gp.exact_gp_state import ExactGPState
from torchbkb.gp.exact_posterior import ExactPosterior
from torchbkb.gp.functional import DTCState
from torchbkb.gp.kernel_row_posterior import KernelRowPosterior
from torchbkb.gp.kernels import GaussianKernel, KernelAdapter, as_kernel
from torchbkb.gp.nystrom import NystromEmbedding

__all__ = ["GaussianKernel", "KernelAdapter", "as_kernel", "NystromEmbedding", "DTCPosterior", "ExactPosterior",
           "ExactGPState", "KernelRowPosterior", "DTCState", "DTCFit"]
