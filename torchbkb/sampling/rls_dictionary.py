"""Ridge-leverage-score (posterior-variance) dictionary resampling -- BKB's Algorithm 1, lines 8-12.

Every candidate (a pulled arm) enters the new dictionary independently with probability
``p = min(1, q̄ · σ̃²(x))`` where ``σ̃²`` is the RLS-scale variance of the *previous* posterior. For an arm
pulled ``n`` times there are two readings (``inclusion=``):

* ``"count_scaled"`` (the default, :data:`DEFAULT_INCLUSION`): the authors' code (batch-bkb's ``_resample_dict``)
  -- ``min(1, q̄ · n · σ̃²(x))``, the leverage score of an arm that is ``n`` rows of the pulls;
* ``"per_pull"``: one Bernoulli per pull, Algorithm 1 of 000 read literally -- ``1 - (1 - p)^n``.

They agree for ``n <= 1`` and when ``p`` is 0 or 1; otherwise ``count_scaled`` keeps an arm at least as often.
The default is ``count_scaled``, the authors' code: with repeated pulls it kept BKB's regret at exact GP-UCB's
in a study over seeds, where ``per_pull``, which keeps repeated arms less often, did not.

Example:
    >>> import torch
    >>> from torchbkb import RLSDictionary
    >>> dic = RLSDictionary(q_bar=2.0, generator=torch.Generator().manual_seed(0), inclusion="per_pull")
    >>> keep = dic.resample(torch.tensor([1.0, 0.0, 0.3]), counts=torch.tensor([1, 5, 2]))
    >>> keep.tolist()[:2]           # p = 1 is always kept, p = 0 never
    [True, False]
    >>> dic.inclusion_probability(torch.tensor([0.1]), counts=torch.tensor([3]))   # 1 - 0.8³
    tensor([0.4880])
    >>> scaled = RLSDictionary(2.0, inclusion="count_scaled")
    >>> scaled.inclusion_probability(torch.tensor([0.1]), counts=torch.tensor([3]))
    tensor([0.6000])
"""

from __future__ import annotations

import torch
from torch import nn

from torchbkb.errors import InputDataError, check_finite, check_generator, check_positive
from torchbkb.utils.host_copy import to_device, to_dtype

__all__ = ["RLSDictionary", "INCLUSION_RULES", "DEFAULT_INCLUSION", "check_inclusion", "inclusion_probability"]

#: the readings of the inclusion probability of an arm pulled ``n`` times (see the module docstring).
INCLUSION_RULES = ("per_pull", "count_scaled")
#: the rule every dictionary sampler uses unless told otherwise
DEFAULT_INCLUSION = "count_scaled"


def check_inclusion(inclusion: object) -> str:
    """``inclusion`` if it is one of :data:`INCLUSION_RULES`, else an :class:`~torchbkb.errors.InputDataError`."""
    if not isinstance(inclusion, str) or inclusion not in INCLUSION_RULES:
        raise InputDataError(f"inclusion: expected one of {list(INCLUSION_RULES)}, got {inclusion!r}")
    return inclusion


def inclusion_probability(rls: torch.Tensor, counts: torch.Tensor | None, q_bar: torch.Tensor,
                          inclusion: str) -> torch.Tensor:
    """The probability that a candidate with RLS variance ``rls`` `(n,)` pulled ``counts`` `(n,)` times enters the
    dictionary: ``min(1, q̄·n·σ̃²)`` (``"count_scaled"``) or ``1 - (1 - min(1, q̄·σ̃²))^n``
    (``"per_pull"``); with ``counts=None``, ``min(1, q̄·σ̃²)``. ``q_bar`` is a 0-d tensor; no checks, no host
    read."""
    if counts is not None and inclusion == "count_scaled":
        return (to_dtype(q_bar, rls.dtype) * to_dtype(counts, rls.dtype) * rls).clamp(0.0, 1.0)
    p = (to_dtype(q_bar, rls.dtype) * rls).clamp(0.0, 1.0)
    if counts is None:
        return p
    return 1.0 - torch.pow(1.0 - p, to_dtype(counts, rls.dtype))


class RLSDictionary(nn.Module):
    """Bernoulli resampling of a dictionary with probabilities ``min(1, q̄·σ̃²)``.

    Args:
        q_bar: oversampling ``q̄ > 0`` (Theorem 1 of 000 asks ``q̄ >= 6α log(4T/δ)/ε²``).
        inclusion: ``"per_pull"`` or ``"count_scaled"``, how pull counts enter (module docstring).
        generator: a seeded ``torch.Generator`` for reproducibility (its state is part of
            ``state_dict()``, so a checkpointed run resumes with the same draws).
        seed: convenience alternative to ``generator``.

    Example:
        >>> import torch
        >>> a = RLSDictionary(2.0, seed=1).resample(torch.full((8,), 0.2))
        >>> b = RLSDictionary(2.0, seed=1).resample(torch.full((8,), 0.2))
        >>> bool((a == b).all())
        True
    """

    def __init__(self, q_bar: float = 2.0, generator: torch.Generator | None = None, *, seed: int | None = None,
                 inclusion: str = DEFAULT_INCLUSION):
        super().__init__()
        self.register_buffer("q_bar", torch.tensor(check_positive(q_bar, "q_bar"), dtype=torch.float64))
        self.inclusion = check_inclusion(inclusion)
        generator = check_generator(generator, seed)
        self.generator = generator

    def inclusion_probability(self, rls: torch.Tensor, counts: torch.Tensor | None = None, *,
                              validate: bool = True) -> torch.Tensor:
        """``1 - (1 - min(1, q̄·σ̃²))^n`` (``"per_pull"``) or ``min(1, q̄·n·σ̃²)`` (``"count_scaled"``).

        Args:
            rls: `(n,)` RLS-scale variances ``σ̃² >= 0``.
            counts: `(n,)` non-negative pull counts; default ones.
            validate: check the inputs (a typed error for a bad shape, NaN or a negative value).

        Returns:
            `(n,)` probabilities in ``rls``'s dtype.
        """
        if validate:  # (callers that produced the inputs, like the bandits, skip the checks and their host reads)
            rls, counts = self._check(rls, counts)
        return self._probability(rls, counts)

    def _probability(self, rls: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor:
        """The rule, unchecked: the one method a study replaces to try another rule on the eager path (the peers
        harness's diagnostic does, under this name)."""
        return inclusion_probability(rls, counts, self.q_bar, self.inclusion)

    def resample(self, rls: torch.Tensor, counts: torch.Tensor | None = None, *, validate: bool = True) -> torch.Tensor:
        """Draw the new dictionary.

        Args:
            rls: `(n,)` RLS-scale variances of the candidates under the previous posterior.
            counts: `(n,)` pull counts (an arm with count 0 never enters).
            validate: check the inputs (callers that produced them, like the bandits, skip it).

        Returns:
            `(n,)` bool mask of the candidates kept.
        """
        p = self.inclusion_probability(rls, counts, validate=validate)
        return to_device(self.draw(p.numel()), p.device) < to_dtype(p, torch.float64)  # queued: no host wait on a GPU

    def draw(self, n: int) -> torch.Tensor:
        """`(n,)` float64 uniforms on the generator's device: the draws :meth:`resample` compares with the
        probabilities, candidate ``i`` kept when ``u_i < p_i``."""
        return torch.rand(n, generator=self.generator, dtype=torch.float64, device=self.generator.device)

    def extra_repr(self) -> str:
        return f"q_bar={float(self.q_bar):g}, inclusion={self.inclusion!r}"

    def get_extra_state(self) -> dict:
        return {"generator_state": self.generator.get_state(), "inclusion": self.inclusion}

    def set_extra_state(self, state: dict) -> None:
        inclusion = check_inclusion(state.get("inclusion", "per_pull"))
        self.generator.set_state(state["generator_state"])
        self.inclusion = inclusion

    def _check(self, rls, counts):
        if not isinstance(rls, torch.Tensor) or rls.dim() != 1 or not rls.is_floating_point():
            got = f"{rls.dtype} {tuple(rls.shape)}" if isinstance(rls, torch.Tensor) else type(rls).__name__
            raise InputDataError(f"rls: expected a floating tensor of shape (n,), got {got}")
        check_finite(rls, "rls")
        if bool((rls < 0).any()):
            raise InputDataError(f"rls: expected non-negative variances, got min {float(rls.min()):.3e}")
        if counts is not None:
            if not isinstance(counts, torch.Tensor) or counts.shape != rls.shape:
                got = tuple(counts.shape) if isinstance(counts, torch.Tensor) else type(counts).__name__
                raise InputDataError(f"counts: expected shape {tuple(rls.shape)}, got {got}")
            if counts.device != rls.device:
                raise InputDataError(f"counts: expected device {rls.device}, got {counts.device}")
            check_finite(counts.to(torch.float64), "counts")
            if bool((counts < 0).any()):
                raise InputDataError(f"counts: expected non-negative counts, got min {float(counts.min())}")
        return rls, counts
