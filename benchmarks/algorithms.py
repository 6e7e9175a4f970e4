"""The built-in entries of the algorithm registry (see :mod:`benchmarks.common`).

Each factory maps ``(arms, settings, seed)`` to a fresh bandit. Names:

* ``BKB`` -- constant β (``settings.beta``, RLS scale); ``BKB-theory`` -- β̃ₜ of 000 Theorem 2;
* ``GPUCB`` / ``GPUCB-theory`` -- exact GP-UCB with incremental updates (capped by time);
* ``BoTorch-UCB`` -- SingleTaskGP + UpperConfidenceBound + optimize_acqf_discrete with the same fixed
  hyperparameters and the same UCB (``beta = β̃²/λ``), rebuilt each step (capped by time);
  ``BoTorch-UCB-cond`` -- the same, extended with ``condition_on_observations``;
* ``EpsGreedy`` (``settings.epsilon``), ``Random``.

* ``BBKB`` / ``BBKB-theory`` -- batched BKB (001 Alg. 1), constant in-batch width ``settings.beta`` or
  ``α̃ = C̃·β̃`` (001 Thm 2); ``GPBUCB`` / ``GPBUCB-theory`` -- exact GP-BUCB with the same batch rule.
"""

from __future__ import annotations

import torchbkb
from benchmarks.common import BanditSettings, register_algorithm
from benchmarks.peers import BoTorchUCB


def _bkb(arms, s: BanditSettings, seed: int, beta):
    return torchbkb.BKB(arms, s.kernel().to(arms.device), noise=s.lam, q_bar=s.q_bar, beta=beta, F=s.F, delta=s.delta, noise_std=s.noise_std, seed=seed)


@register_algorithm("BKB", description="BKB (000 Alg. 1), constant β")
def _bkb_const(arms, s, seed):
    return _bkb(arms, s, seed, s.beta)


@register_algorithm("BKB-theory", description="BKB, β̃ₜ of 000 Theorem 2")
def _bkb_theory(arms, s, seed):
    return _bkb(arms, s, seed, "theory")


def _gpucb(arms, s: BanditSettings, seed: int, beta):
    return torchbkb.GPUCB(arms, s.kernel().to(arms.device), noise=s.lam, beta=beta, F=s.F, delta=s.delta, noise_std=s.noise_std, seed=seed)


@register_algorithm("GPUCB", capped=True, description="exact GP-UCB, incremental, constant β")
def _gpucb_const(arms, s, seed):
    return _gpucb(arms, s, seed, s.beta)


@register_algorithm("GPUCB-theory", capped=True, description="exact GP-UCB, self-normalized β")
def _gpucb_theory(arms, s, seed):
    return _gpucb(arms, s, seed, "theory")


def _bbkb(arms, s: BanditSettings, seed: int, beta):
    return torchbkb.BBKB(
        arms, s.kernel().to(arms.device), noise=s.lam, q_bar=s.q_bar, beta=beta, batch_bound=s.batch_bound, F=s.F, delta=s.delta, noise_std=s.noise_std, seed=seed
    )


@register_algorithm("BBKB", description="BBKB (001 Alg. 1), constant β")
def _bbkb_const(arms, s, seed):
    return _bbkb(arms, s, seed, s.beta)


@register_algorithm("BBKB-theory", description="BBKB, α̃ = C̃·β̃ of 001 Theorem 2")
def _bbkb_theory(arms, s, seed):
    return _bbkb(arms, s, seed, "theory")


def _gpbucb(arms, s: BanditSettings, seed: int, beta):
    return torchbkb.GPBUCB(arms, s.kernel().to(arms.device), noise=s.lam, beta=beta, batch_bound=s.batch_bound, F=s.F, delta=s.delta, noise_std=s.noise_std, seed=seed)


@register_algorithm("GPBUCB", capped=True, description="exact GP-BUCB (Desautels et al.), constant β")
def _gpbucb_const(arms, s, seed):
    return _gpbucb(arms, s, seed, s.beta)


@register_algorithm("GPBUCB-theory", capped=True, description="exact GP-BUCB, α = C̃·β (exact log-det)")
def _gpbucb_theory(arms, s, seed):
    return _gpbucb(arms, s, seed, "theory")


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
