"""GPyTorch integration: :class:`DTCApproximateGP`, an ``ApproximateGP`` whose closed-form (Titsias-optimal)
variational distribution makes its predictions exactly the DTC posterior.

The subpackage is named ``gpytorch`` but imports the real GPyTorch with absolute imports.
"""

from torchbkb.gpytorch.approximate_gp import DTCApproximateGP, DTCVariationalStrategy, TitsiasVariationalDistribution

__all__ = ["DTCApproximateGP", "DTCVariationalStrategy", "TitsiasVariationalDistribution"]
