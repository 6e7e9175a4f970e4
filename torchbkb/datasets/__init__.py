"""Arm sets and objectives for benchmarks and examples.

* :func:`load` -- the bundled real tables of the BBKB paper (``"abalone"``, ``"cadata"`` /
  ``"california_housing"``) as ``(arms, rewards)``, features z-scored;
* :func:`gp_sample` -- a GP sample at an arm set (exact Cholesky or random Fourier features);
* :func:`random_arms`, :func:`grid_arms` -- arm sets in the unit cube;
* :func:`botorch_problem` -- BoTorch test functions discretized on random candidates (maximization);
* :func:`anchor_problem` -- the anchor problem (1,000 arms in [0, 1]², GP sample, noise 0.1).

Data provenance and licences: ``torchbkb/datasets/data/README.md``.

Example:
    >>> from torchbkb import datasets
    >>> arms, rewards = datasets.load("cadata")
    >>> tuple(arms.shape)
    (20640, 8)
"""

from torchbkb.datasets.arms import Problem, grid_arms, random_arms
from torchbkb.datasets.gp_sample import KERNELS, gp_sample, kernel_matrix, rff_features
from torchbkb.datasets.problems import ANCHOR_SETTINGS, BOTORCH_PROBLEMS, anchor_problem, botorch_problem
from torchbkb.datasets.tables import DATASETS, load

__all__ = [
    "load",
    "DATASETS",
    "gp_sample",
    "kernel_matrix",
    "rff_features",
    "KERNELS",
    "random_arms",
    "grid_arms",
    "Problem",
    "anchor_problem",
    "ANCHOR_SETTINGS",
    "botorch_problem",
    "BOTORCH_PROBLEMS",
]
