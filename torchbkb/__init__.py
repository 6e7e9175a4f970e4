"""torchbkb: scalable, provably no-regret Gaussian-process optimization in PyTorch.

Core modules (device- and dtype-agnostic ``nn.Module``s):

* :class:`NystromEmbedding` -- ``z(x) = K_S^{+1/2} k_S(x)``;
* :class:`DTCPosterior` -- the DTC/BKB posterior on a Nyström embedding, with rank-one updates;
* :class:`ExactPosterior` -- the exact GP posterior with incremental Cholesky growth;
* :class:`RLSDictionary` -- ridge-leverage-score (posterior-variance) resampling of the dictionary.

Layers: ``torchbkb.gp`` (kernels, embedding, posteriors, linear algebra) -> ``torchbkb.sampling`` (dictionaries)
-> ``torchbkb.bandits`` (BKB, BBKB, the baselines, widths, batch selection) -> ``torchbkb.experiment`` (the loop,
evaluation, checkpoints, history); ``torchbkb.botorch``, ``torchbkb.gpytorch``, ``torchbkb.online`` and
``torchbkb.datasets`` sit on top. Module paths from before the grouping still import (:mod:`torchbkb.legacy_paths`).
"""

from torchbkb.errors import (
    CheckpointError,
    InfrastructureError,
    InputDataError,
    NumericsError,
    NumericsWarning,
    TheoryWarning,
    ObjectiveError,
    ObjectiveOutputError,
    TorchBKBError,
)
from torchbkb.gp.kernels import GaussianKernel, KernelAdapter, as_kernel
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.gp.exact_posterior import ExactPosterior
from torchbkb.sampling.rls_dictionary import RLSDictionary
from torchbkb.bandits import confidence
from torchbkb.bandits import BKB, GPUCB, Bandit, EpsGreedy, Random
from torchbkb.bandits import BBKB, GPBUCB, ThompsonBKB
from torchbkb.experiment.history import History
from torchbkb.objectives import ArmObjective
from torchbkb.experiment.loop import run
from torchbkb.sampling.recursive_rls import RecursiveRLSResult, nystrom_lambda_max, recursive_rls
from torchbkb.bandits.design import UncertaintyExplorer, linf_error, uncertainty_design
from torchbkb.bandits import SBPE
from torchbkb import legacy_paths

legacy_paths.install()

__version__ = "0.1.0"

__all__ = [
    "TorchBKBError",
    "InputDataError",
    "NumericsError",
    "NumericsWarning",
    "TheoryWarning",
    "CheckpointError",
    "InfrastructureError",
    "ObjectiveOutputError",
    "GaussianKernel",
    "KernelAdapter",
    "as_kernel",
    "NystromEmbedding",
    "DTCPosterior",
    "ExactPosterior",
    "RLSDictionary",
    "confidence",
    "Bandit",
    "BKB",
    "GPUCB",
    "BBKB",
    "GPBUCB",
    "ThompsonBKB",
    "EpsGreedy",
    "Random",
    "run",
    "History",
    "ArmObjective",
    "ObjectiveError",
    "recursive_rls",
    "RecursiveRLSResult",
    "nystrom_lambda_max",
    "UncertaintyExplorer",
    "uncertainty_design",
    "linf_error",
    "SBPE",
]
