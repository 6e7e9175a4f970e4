"""The built-in entries of the algorithm registry (see :mod:`benchmarks.common`).

Each factory maps ``(arms, settings, seed)`` to a fresh bandit. Names:

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

import torchbkb
from benchmarks.common import BanditSettings, register_algorithm
from benchmarks.peers import BoTorchUCB


def _register_pair(name: str, cls, description: str, theory_description: str, *, capped: bool = False, batched: bool = False, sketched: bool = False) -> None:
    """Register ``name`` (constant width ``settings.beta``) and ``name-theory`` (the theorem's width)."""

    def factory(beta_of):
        def make(arms, s: BanditSettings, seed: int):
            extra = {}
            if sketched:
                extra["q_bar"] = s.q_bar
            if batched:
                extra["batch_bound"] = s.batch_bound
            return cls(arms, s.kernel().to(arms.device), noise=s.lam, beta=beta_of(s), F=s.F, delta=s.delta, noise_std=s.noise_std, seed=seed, **extra)

        return make

    register_algorithm(name, capped=capped, description=description)(factory(lambda s: s.beta))
    register_algorithm(f"{name}-theory", capped=capped, description=theory_description)(factory(lambda s: "theory"))
    register_algorithm(f"{name}-practical", capped=capped, description=f"{description.split(',')[0]}, the authors' code's width")(factory(lambda s: "practical"))


_register_pair("BKB", torchbkb.BKB, "BKB (000 Alg. 1), constant β", "BKB, β̃ₜ of 000 Theorem 2", sketched=True)
_register_pair("GPUCB", torchbkb.GPUCB, "exact GP-UCB, incremental, constant β", "exact GP-UCB, self-normalized β", capped=True)
_register_pair("BBKB", torchbkb.BBKB, "BBKB (001 Alg. 1), constant β", "BBKB, α̃ = C̃·β̃ of 001 Theorem 2", batched=True, sketched=True)
_register_pair("GPBUCB", torchbkb.GPBUCB, "exact GP-BUCB (Desautels et al.), constant β", "exact GP-BUCB, α = C̃·β (exact log-det)", capped=True, batched=True)


@register_algorithm("GPBUCB-desautels", capped=True, description="exact GP-BUCB, Desautels et al.'s in-batch stop rule, constant β")
def _gpbucb_desautels(arms, s: BanditSettings, seed: int):
    return torchbkb.GPBUCB(arms, s.kernel().to(arms.device), noise=s.lam, beta=s.beta, F=s.F, delta=s.delta, noise_std=s.noise_std, seed=seed, batch_bound=s.batch_bound, stop_rule="in_batch")


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
