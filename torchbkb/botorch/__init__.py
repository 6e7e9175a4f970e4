"""BoTorch integration: BKB as a drop-in ``Model``, BKB/BBKB upper confidence bounds, BBKB's adaptive batches.

* :class:`BKBModel` -- a ``botorch.models.model.Model`` (DTC posterior on a variance-sampled dictionary,
  joint covariance, rank-one ``condition_on_observations``, transforms); ``BKBModel.from_model(gp)``
  adopts a fitted ``SingleTaskGP``; ``fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))``
  learns its hyperparameters at ``O(n·m²)`` (:class:`DTCMarginalLogLikelihood`).
* :class:`BKBUpperConfidenceBound` -- analytic UCB with BKB's ``β̃ₜ`` (``b = β̃²/λ`` in BoTorch's scale), or
  ``beta="vakili"``: the sparse width of 003 Theorem 3.5 with the measured ``λ_max``.
* :class:`BBKBUpperConfidenceBound` -- the same with ``X_pending`` (hallucinated variance updates), for
  ``optimize_acqf_discrete(q > 1)``.
* :func:`optimize_acqf_bbkb` -- ``q`` distinct BBKB picks (exact fantasies), or 001's adaptive batch, over a
  discrete candidate set.
* :class:`TrustRegionBKB` -- TuRBO-1/TuRBO-m with BKBModel local models (:class:`TrustRegion`: the state).
* :func:`optimize_acqf_thompson` -- a Thompson batch over a huge discrete candidate set, in chunks;
  ``draw_matheron_paths`` (hence ``qJointEntropySearch``, ``get_optimal_samples``) accepts a ``BKBModel``.
* With Ax installed, ``ModelConfig(botorch_model_class=BKBModel)`` works as is (:mod:`.ax_support`).

The subpackage is named ``botorch`` but imports the real BoTorch with absolute imports.
"""

try:
    import botorch as _botorch  # noqa: F401
except ImportError as err:  # an optional dependency: say which extra brings it
    raise ImportError("torchbkb.botorch: expected BoTorch installed (pip install 'torchbkb[botorch]'), got "
                      "none") from err

from torchbkb.botorch.model import BKBModel
from torchbkb.sampling.dictionary_replay import sample_dictionary
from torchbkb.botorch.defaults import default_kernel
from torchbkb.botorch.marginal_likelihood import DTCMarginalLogLikelihood
from torchbkb.botorch.acquisition import (
    BKBUpperConfidenceBound, BBKBUpperConfidenceBound, theory_beta, vakili_theory_beta
)
from torchbkb.botorch.batch import optimize_acqf_bbkb
from torchbkb.botorch.pathwise import BKBSamplePath, draw_bkb_paths
from torchbkb.botorch.thompson import optimize_acqf_thompson
from torchbkb.botorch.trust_region import TrustRegion
from torchbkb.botorch.trust_region_loop import TrustRegionBKB
from torchbkb.botorch.ax_support import AX_AVAILABLE  # registers BKBModel with Ax's fit dispatcher

__all__ = [
    "BKBModel",
    "DTCMarginalLogLikelihood",
    "BKBUpperConfidenceBound",
    "BBKBUpperConfidenceBound",
    "optimize_acqf_bbkb",
    "optimize_acqf_thompson",
    "TrustRegion",
    "TrustRegionBKB",
    "draw_bkb_paths",
    "BKBSamplePath",
    "AX_AVAILABLE",
    "sample_dictionary",
    "default_kernel",
    "theory_beta",
    "vakili_theory_beta",
]
