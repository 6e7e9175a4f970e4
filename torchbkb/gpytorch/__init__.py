"""GPyTorch integration: :class:`DTCApproximateGP`, an ``ApproximateGP`` whose closed-form (Titsias-optimal)
variational distribution makes its predictions exactly the DTC posterior.

The subpackage is named ``gpytorch`` but imports the real GPyTorch with absolute imports.
"""

try:
    import gpytorch as _gpytorch  # noqa: F401
except ImportError as err:  # an optional dependency: say which extra brings it
    raise ImportError("torchbkb.gpytorch: expected GPyTorch installed (pip install 'torchbkb[gpytorch]'), got "
                      "none") from err

from torchbkb.gpytorch.approximate_gp import DTCApproximateGP, DTCVariationalStrategy, TitsiasVariationalDistribution

__all__ = ["DTCApproximateGP", "DTCVariationalStrategy", "TitsiasVariationalDistribution"]
