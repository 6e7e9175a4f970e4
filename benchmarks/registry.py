"""The algorithm registry: a benchmark asks for bandits by name, ``make_bandit("BKB", arms, settings, seed)``.

A new algorithm joins every suite by registering a factory ``(arms, settings, seed) -> Bandit``::

    @register_algorithm("BBKB", description="batched BKB, 001 Algorithm 1")
    def _bbkb(arms, settings, seed):
        return torchbkb.BBKB(arms, settings.kernel(), noise=settings.lam, ...)

The built-in entries (at the end of this module):


* ``BKB`` -- constant β (``settings.beta``, RLS scale); ``BKB-theory`` -- β̃ₜ of 000 Theorem 2;
* ``GPUCB`` / ``GPUCB-theory`` -- exact GP-UCB with incremental updates (capped by time);
* ``BoTorch-UCB`` -- SingleTaskGP + UpperConfidenceBound + optimize_acqf_discrete with the same fixed
  hyperparameters and the same UCB (``beta = β̃²/λ``), rebuilt each step (capped by time);
  ``BoTorch-UCB-cond`` -- the same, extended with ``condition_on_observations``;
* ``EpsGreedy`` (``settings.epsilon``), ``Random``.

* ``BBKB`` / ``BBKB-theory`` -- batched BKB (001 Alg. 1), constant in-batch width ``settings.beta`` or
  ``α̃ = C̃·β̃`` (001 Thm 2); ``GPBUCB`` / ``GPBUCB-theory`` -- exact GP-BUCB with the same batch rule;
* ``<name>-practical`` for each of the four -- the width of the authors' code (``beta="practical"``);
* ``GPBUCB-desautels`` -- exact GP-BUCB with Desautels et al.'s in-batch stop rule, constant width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

import torchbkb
from benchmarks.kernels import make_kernel
from benchmarks.peers import BoTorchUCB
from torchbkb.gp.kernels import GaussianKernel


@dataclass
class BanditSettings:
    """Hyperparameters shared by all algorithms of a run (the papers' settings by default).

    Attributes:
        lengthscale: Gaussian kernel lengthscale ``ℓ`` (the papers' width ``σ² = ℓ²``).
        lam: regularization / GP noise variance ``λ``.
        q_bar: BKB/BBKB oversampling ``q̄``.
        F: RKHS-norm bound of the theory β.
        delta: failure probability of the theory β.
        beta: the constant width (RLS scale) used by the constant-β variants.
        noise_std: ``ξ`` of the theory β (``None``: ``√λ``).
        epsilon: exploration rate of ε-greedy.
        batch_bound: BBKB/GP-BUCB batch-termination bound ``C̃`` (001 Alg. 1; the paper does not state it).
        kernel_name: ``"gaussian"`` (``"rbf"``) or ``"matern52"``.
        width: the Gaussian kernel's width ``σ²`` instead of ``lengthscale`` (``GaussianKernel.from_width``).
        budget: S-BPE's evaluation budget ``N``.
    """

    lengthscale: float = math.sqrt(5.0)
    lam: float = 0.2
    q_bar: float = 2.0
    F: float = 20.0
    delta: float = 1e-4
    beta: float = 1.0
    noise_std: float | None = None
    epsilon: float = 0.1
    batch_bound: float = 2.0
    kernel_name: str = "gaussian"
    width: float | None = None
    budget: int | None = None

    def kernel(self):
        """The kernel: Gaussian with ``lengthscale`` (or given by its ``width`` σ², as the papers do), or
        ``"matern52"``."""
        if self.width is not None:
            return GaussianKernel.from_width(self.width)
        return make_kernel(self.kernel_name, self.lengthscale)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AlgorithmSpec:
    """A registered algorithm: ``factory(arms, settings, seed) -> Bandit``.

    Attributes:
        capped: an exact (slow) peer -- informational; every suite applies its wall-time cap to all runs.
    """

    name: str
    factory: Callable[..., Any]
    capped: bool = False
    description: str = ""


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register_algorithm(name: str, *, capped: bool = False, description: str = ""):
    """Decorator registering ``factory(arms, settings, seed) -> Bandit`` under ``name``."""

    def deco(factory):
        ALGORITHMS[name] = AlgorithmSpec(name, factory, capped, description)
        return factory

    return deco


def make_bandit(name: str, arms: torch.Tensor, settings: BanditSettings, seed: int):
    """Build the registered algorithm ``name``."""
    if name not in ALGORITHMS:
        raise KeyError(f"algorithm: expected one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name].factory(arms, settings, seed)


def _register_pair(name: str, cls, description: str, theory_description: str, *, capped: bool = False,
                   batched: bool = False, sketched: bool = False, **fixed) -> None:
    """Register ``name`` (constant width ``settings.beta``) and ``name-theory`` (the theorem's width)."""

    def factory(beta_of):
        def make(arms, s: BanditSettings, seed: int):
            extra = dict(fixed)
            if sketched:
                extra["q_bar"] = s.q_bar
            if batched:
                extra["batch_bound"] = s.batch_bound
            return cls(arms, s.kernel().to(arms.device), noise=s.lam, beta=beta_of(s), F=s.F, delta=s.delta,
                       noise_std=s.noise_std, seed=seed, **extra)

        return make

    register_algorithm(name, capped=capped, description=description)(factory(lambda s: s.beta))
    register_algorithm(f"{name}-theory", capped=capped, description=theory_description)(factory(lambda s: "theory"))
    register_algorithm(f"{name}-practical", capped=capped,
            description=f"{description.split(',')[0]}, the authors' code's width")(factory(lambda s: "practical"))


_register_pair("BKB", torchbkb.BKB, "BKB (000 Alg. 1), constant β", "BKB, β̃ₜ of 000 Theorem 2", sketched=True)
_register_pair("GPUCB", torchbkb.GPUCB, "exact GP-UCB, incremental, constant β", "exact GP-UCB, self-normalized β",
               capped=True)
_register_pair("BBKB", torchbkb.BBKB, "BBKB (001 Alg. 1), constant β", "BBKB, α̃ = C̃·β̃ of 001 Theorem 2",
               batched=True, sketched=True)
_register_pair("BBKB-all-arms", torchbkb.BBKB, "BBKB scoring every arm (prune=False), constant β",
               "BBKB scoring every arm, theory width", batched=True, sketched=True, prune=False)
_register_pair("GPBUCB", torchbkb.GPBUCB, "exact GP-BUCB (Desautels et al.), constant β",
               "exact GP-BUCB, α = C̃·β (exact log-det)", capped=True, batched=True)


@register_algorithm("GPBUCB-desautels", capped=True,
                    description="exact GP-BUCB, Desautels et al.'s in-batch stop rule, constant β")
def _gpbucb_desautels(arms, s: BanditSettings, seed: int):
    return torchbkb.GPBUCB(arms, s.kernel().to(arms.device), noise=s.lam, beta=s.beta, F=s.F, delta=s.delta,
                           noise_std=s.noise_std, seed=seed, batch_bound=s.batch_bound, stop_rule="in_batch")


@register_algorithm("BoTorch-UCB", capped=True, description="SingleTaskGP+UCB+optimize_acqf_discrete, rebuilt per step")
def _botorch(arms, s, seed):
    return BoTorchUCB(arms, lengthscale=s.lengthscale, noise=s.lam, beta=s.beta, seed=seed, mode="rebuild")


@register_algorithm("BoTorch-UCB-cond", capped=True, description="as BoTorch-UCB, condition_on_observations")
def _botorch_cond(arms, s, seed):
    return BoTorchUCB(arms, lengthscale=s.lengthscale, noise=s.lam, beta=s.beta, seed=seed, mode="condition")


@register_algorithm("EpsGreedy", description="ε-greedy on empirical means")
def _eps(arms, s, seed):
    return torchbkb.EpsGreedy(arms, epsilon=s.epsilon, seed=seed)


@register_algorithm("Random", description="uniform arm")
def _random(arms, s, seed):
    return torchbkb.Random(arms, seed=seed)


@register_algorithm("SBPE", description="S-BPE (003 Alg. 1), constant width (GP scale), budget settings.budget")
def _sbpe(arms, s: BanditSettings, seed: int):
    return torchbkb.SBPE(arms, s.kernel(), noise=s.lam, budget=s.budget, rkhs_norm=s.F, subgaussian=s.noise_std,
                         delta=s.delta, beta=s.beta, seed=seed)


@register_algorithm("SBPE-theory", description="S-BPE with the widths of 003 Theorem 3.5")
def _sbpe_theory(arms, s: BanditSettings, seed: int):
    return torchbkb.SBPE(arms, s.kernel(), noise=s.lam, budget=s.budget, rkhs_norm=s.F, subgaussian=s.noise_std,
                         delta=s.delta, beta="theory", seed=seed)
