"""The ask/tell protocol over a finite arm set, shared by every bandit in torchbkb.

A :class:`Bandit` owns the arms `(A, d)`, the pull counts and reward sums per arm, the record of what
was asked and told, and the pending set (asked, not yet told). Subclasses implement two hooks:

* ``_select() -> LongTensor`` -- the next arm(s) to ask (one for sequential algorithms, a batch for
  batched ones); called only when nothing is pending, so ``ask()`` is idempotent;
* ``_update()`` -- called once the pending set is resolved (every asked arm told or discarded), with
  :attr:`Bandit.last_told` holding the indices and rewards told since the previous ``_update``.

Every ``tell`` is validated completely before anything changes: an unknown or out-of-range index,
an index that was not asked, a reward count that does not match, NaN/inf rewards raise
:class:`~torchbkb.errors.InputDataError` and leave the bandit exactly as it was.

Ties in argmax selections are broken by the lowest arm index (``torch.argmax`` returns the first).

Example:
    >>> import torch
    >>> from torchbkb.bandits.baselines import Random
    >>> bandit = Random(torch.rand(10, 2), seed=0)
    >>> idx = bandit.ask()
    >>> bool((bandit.ask() == idx).all())     # asking again before telling gives the same answer
    True
    >>> bandit.tell(idx, torch.tensor([0.5]))
    >>> int(bandit.counts.sum()), bandit.t
    (1, 1)
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any
from collections.abc import Callable

import torch
from torch import nn

from torchbkb.bandits.bandit_checkpoint import BanditCheckpoint
from torchbkb.bandits.excluded_arms import ExcludedArms
from torchbkb.errors import InputDataError, check_finite, check_generator, check_matrix, check_positive
from torchbkb.bandits.confidence import check_beta
from torchbkb.gp.kernels import KernelAdapter, as_kernel
from torchbkb.gp.linalg import check_units
from torchbkb.utils.host_copy import to_device, to_dtype

__all__ = ["Bandit", "KernelBandit", "check_beta"]


class Bandit(ExcludedArms, BanditCheckpoint):
    """Base class of the finite-arm bandits (ask/tell, counts, history; excluded arms from
    :class:`~torchbkb.bandits.excluded_arms.ExcludedArms`, checkpoints from
    :class:`~torchbkb.bandits.bandit_checkpoint.BanditCheckpoint`).

    Args:
        arms: `(A, d)` floating tensor of arms (finite). Its dtype and device are those of the run.
        seed: seed of the bandit's own ``torch.Generator`` (random first arm, dictionary draws...).

    Attributes:
        arms: `(A, d)`.
        counts: `(A,)` long, pulls per arm.
        reward_sums: `(A,)` float64, sum of the rewards told per arm.
        t: number of rewards told so far.
        history: dict of lists ``index``, ``reward``, ``batch`` (one entry per told reward).
        excluded: `(A,)` bool, arms never selected again (see :meth:`exclude`, :meth:`discard`). Written directly, it
            holds from the next ``ask`` on, and :attr:`exclusions` follows it (reason ``"excluded"`` for the arms it
            adds).
        exclusions: ``{arm: reason}`` for every excluded arm (the error that made it fail).
        batch_id: number of batches asked so far (the current batch's id is ``batch_id - 1``).
    """

    def __init__(self, arms: torch.Tensor, *, seed: int | None = None):
        check_matrix(arms, "arms", min_rows=1)
        if arms.dim() != 2 or arms.shape[1] < 1:
            raise InputDataError(f"arms: expected shape (A, d) with d >= 1, got {tuple(arms.shape)}")
        self.arms = arms.detach()
        self.seed = seed
        self.generator = check_generator(None, seed)
        A = arms.shape[0]
        self.counts = torch.zeros(A, dtype=torch.long, device=arms.device)
        self.reward_sums = torch.zeros(A, dtype=torch.float64, device=arms.device)
        self.t = 0
        self.batch_id = 0
        self.history: dict[str, list] = {"index": [], "reward": [], "batch": []}
        self._pending: list[int] = []
        self._selected_ids: list[int] | None = None  # set by a _select that read its picks already
        self._asked: tuple | None = None  # (tensor, its version, ids) of the last ask: told back unread
        self.last_told: tuple[torch.Tensor, torch.Tensor] = (self._long([]),
                                                             torch.zeros(0, dtype=torch.float64, device=arms.device))
        self._told_idx: list[int] = []
        self.last_told_ids: list[int] = []  # last_told's indices on the host
        self._told_y: list[float] = []
        self.excluded = torch.zeros(A, dtype=torch.bool, device=arms.device)
        self.exclusions: dict[int, str] = {}
        self._excluded_seen = (self.excluded, self.excluded._version)  # what exclusions was last synced with
        self._fingerprint: dict[str, Any] | None = None

    @property
    def num_arms(self) -> int:
        """``A``."""
        return int(self.arms.shape[0])

    @property
    def told_since_update(self) -> int:
        """How many rewards were told since the last update (a batch told in parts): the posterior holds none yet."""
        return len(self._told_idx)

    @property
    def pending(self) -> torch.Tensor:
        """`(k,)` long, the arms asked and not yet told or discarded (in ask order)."""
        return self._long(self._pending)

    @property
    def pending_ids(self) -> list[int]:
        """:attr:`pending` as Python ints, from the host: what a loop on a GPU passes to its objective without
        reading the tensor ``ask`` returned (a host synchronization)."""
        return list(self._pending)

    def ask(self) -> torch.Tensor:
        """The arm(s) to evaluate next.

        Returns:
            `(k,)` LongTensor of arm indices (``k = 1`` for sequential algorithms, a whole batch for
            batched ones). While some asked arms are not told yet, the same pending arms are returned.
        """
        if not self._pending:
            self._sync_exclusions()
            self._selected_ids = None  # only this _select may hand its picks over
            idx = self._select().reshape(-1)
            ids, self._selected_ids = self._selected_ids, None
            self._pending = idx.tolist() if ids is None else list(ids)  # the step's one read of the device
            self.batch_id += 1
            out = to_device(to_dtype(idx, torch.long), self.arms.device)
            out = out.clone() if out is idx else out  # the caller's own tensor, as `pending` gives
            self._asked = (out, out._version, list(self._pending))
            return out
        return self.pending

    def tell(self, indices: torch.Tensor, y: torch.Tensor) -> None:
        """Report rewards for asked arms.

        Args:
            indices: `(k,)` integer tensor (or list; a column `(k, 1)` reads as `(k,)`), each an arm that was asked
                and is still pending (an arm asked twice in a batch may be told twice).
            y: `(k,)` finite rewards (or a column `(k, 1)`, as BoTorch's ``Y``), in the same order.
        """
        idx, ids, y, ys, remaining = self._check_tell(indices, y)
        self._pending = remaining
        self._record(idx, ids, y, ys)
        if not self._pending:
            self._finish_batch()

    def discard(self, indices: torch.Tensor, exclude: bool = False, reason: str | None = None) -> None:
        """Drop pending arms that will never be told (e.g. evaluations that kept failing).

        Args:
            indices: `(k,)` pending arm indices.
            exclude: also exclude these arms from every later selection (:attr:`excluded`). A
                discarded arm teaches the bandit nothing, so a deterministic algorithm would ask for a
                permanently failing arm again and again; :func:`torchbkb.run` excludes the points whose
                objective failed all their retries (never for infrastructure failures).
            reason: why they are excluded (kept in :attr:`exclusions` and in checkpoints).
        """
        idx, ids = self._check_indices(indices, "indices")
        remaining = self._check_pending(ids)
        if exclude:  # the batch's update, when these were its last pending arms, reads the mask as written
            self._write_exclusions(idx, ids, reason)
        self._pending = remaining
        if not self._pending:
            self._finish_batch()

    # ------------------------------------------------------------------ hooks
    def _select(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _update(self) -> None:
        """Incorporate :attr:`last_told` (default: nothing beyond counts and history)."""

    # ------------------------------------------------------------------ diagnostics
    @property
    def dictionary_size(self) -> int | None:
        """Size of the sparse dictionary, for the algorithms that have one."""
        return None

    # ------------------------------------------------------------------ internals
    def _record(self, idx: torch.Tensor, ids: list[int], y: torch.Tensor, ys: list[float]) -> None:
        """Add the checked rewards ``y`` `(k,)` float64 (``ys`` on the host) of the arms ``idx`` (``ids``)."""
        self.counts.index_add_(0, idx, torch.ones_like(idx))
        if y.device.type == "cuda":  # index_add_ adds a repeated arm's rewards with atomics, in no fixed order;
            self.reward_sums.index_put_((idx,), y, accumulate=True)  # this sorts them: the same sums at every run
        else:
            self.reward_sums.index_add_(0, idx, y)
        self.t += len(ids)
        self.history["index"].extend(ids)
        self.history["reward"].extend(ys)
        self.history["batch"].extend([self.batch_id - 1] * len(ids))
        self._told_idx.extend(ids)
        self._told_y.extend(ys)

    def _finish_batch(self) -> None:
        self.last_told = (self._long(self._told_idx),
                          to_device(torch.tensor(self._told_y, dtype=torch.float64), self.arms.device))
        self.last_told_ids = self._told_idx
        self._told_idx, self._told_y = [], []
        self._update()

    def _long(self, values) -> torch.Tensor:
        return to_device(torch.as_tensor(values, dtype=torch.long).reshape(-1), self.arms.device)

    def _check_indices(self, indices, name: str) -> tuple[torch.Tensor, list[int]]:
        """``(idx, ids)``: the indices as a `(k,)` long tensor on the arms' device and as Python ints, in range."""
        if isinstance(indices, (list, tuple, int)):
            indices = torch.as_tensor(indices)
        if not isinstance(indices, torch.Tensor):
            raise InputDataError(f"{name}: expected a LongTensor of arm indices, got {type(indices).__name__}")
        if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
            raise InputDataError(f"{name}: expected an integer tensor of arm indices, got dtype {indices.dtype}")
        if indices.dim() > 2 or (indices.dim() == 2 and indices.shape[-1] != 1):  # a column (k, 1) reads as (k,)
            raise InputDataError(f"{name}: expected shape (k,) or (k, 1), got {tuple(indices.shape)}")
        idx = indices.reshape(-1)
        asked = self._asked
        if asked is not None and indices is asked[0] and indices._version == asked[1]:
            ids = list(asked[2])  # the tensor ask returned, unmodified: its arms are known without a read
        else:
            ids = idx.tolist()  # the one read of the indices: range, pending and history all use the host copy
        if ids and (min(ids) < 0 or max(ids) >= self.num_arms):
            raise InputDataError(f"{name}: expected arm indices in [0, {self.num_arms}), got {ids}")
        idx = idx if idx.dtype == torch.long else idx.to(dtype=torch.long)
        return to_device(idx, self.arms.device), ids  # host indices: queued, no wait

    def _check_pending(self, ids: list[int]) -> list[int]:
        """The pending arms left once the arms ``ids`` are taken out -- each index takes out one pending
        occurrence, the earliest -- in ``O(k + pending)`` (a batch can hold thousands of arms, told in any
        order); an error naming the first index that is not pending. Changes no state."""
        if ids == self._pending:  # the whole batch told in ask order (what torchbkb.run does)
            return []
        available = Counter(self._pending)
        for i in ids:
            if available[i] == 0:
                raise InputDataError(
                    f"indices: expected arms that were asked and not yet told (pending {self._pending}), got arm {i}"
                )
            available[i] -= 1
        take = Counter(ids)
        remaining = []
        for a in self._pending:
            if take[a]:
                take[a] -= 1
            else:
                remaining.append(a)
        return remaining

    def _check_tell(self, indices, y) -> tuple[torch.Tensor, list[int], torch.Tensor, list[float], list[int]]:
        idx, ids = self._check_indices(indices, "indices")
        if isinstance(y, (list, tuple, float, int)):
            y = torch.as_tensor(y, dtype=torch.float64)
        if not isinstance(y, torch.Tensor) or not (y.is_floating_point() or y.dtype in (torch.int32, torch.int64)):
            raise InputDataError(f"y: expected a floating tensor of rewards, got "
                                 f"{type(y).__name__ if not isinstance(y, torch.Tensor) else y.dtype}")
        y = y.reshape(-1) if y.dim() <= 1 or (y.dim() == 2 and y.shape[-1] == 1) else y
        if y.dim() != 1 or y.shape[0] != idx.shape[0]:
            raise InputDataError(f"y: expected {idx.shape[0]} rewards (one per index), got shape {tuple(y.shape)}")
        y = y if y.dtype == torch.float64 else y.to(dtype=torch.float64)
        ys = y.tolist()  # the one read of the rewards: finiteness and history use the host copy
        bad = sum(1 for v in ys if not math.isfinite(v))
        if bad:
            raise InputDataError(f"y: expected finite values, got {bad} NaN/inf entries out of {len(ys)}")
        if not ids:
            raise InputDataError("indices: expected at least one arm index, got none")
        remaining = self._check_pending(ids)
        return idx, ids, to_device(y, self.arms.device), ys, remaining  # host rewards: queued, no wait


class KernelBandit(Bandit):
    """A :class:`Bandit` with a kernel, a regularization ``λ`` and a confidence width ``β``.

    Args:
        arms: `(A, d)`.
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor``, fixed for the bandit's life (the
            papers' known kernel): its values are cached, so hyperparameters written in place later are not seen
            consistently: another kernel is another bandit (a checkpoint refuses a kernel of other values).
        noise: ``λ > 0`` (the GP noise variance).
        beta: a float ``>= 0`` (a constant width, RLS scale) or a name in :attr:`beta_modes` (``"theory"``, ...).
        seed: see :class:`Bandit`.
        noise_std: ``ξ`` of the theory's β (default ``√λ``, the GP reading).
        F: bound on ``‖f‖_H`` for the theory's β.
        delta: failure probability of the theory's β.
    """

    beta_modes: tuple[str, ...] = ("theory",)  #: the named widths the class accepts beside a float

    def __init__(
        self,
        arms: torch.Tensor,
        kernel: Callable,
        *,
        noise: float,
        beta: float | str = "theory",
        seed: int | None = None,
        noise_std: float | None = None,
        F: float = 1.0,
        delta: float = 0.01,
    ):
        super().__init__(arms, seed=seed)
        self.kernel: KernelAdapter = as_kernel(kernel)
        if isinstance(self.kernel, nn.Module):
            self.kernel.to(arms.device)
        self.lam = check_positive(noise, "noise")
        self.beta_mode = check_beta(beta, self.beta_modes)
        self.noise_std = (self.lam**0.5) if noise_std is None else float(noise_std)
        if not self.noise_std >= 0:
            raise InputDataError(f"noise_std: expected noise_std >= 0, got {noise_std!r}")
        self.F = float(F)
        if not self.F >= 0:
            raise InputDataError(f"F: expected F >= 0, got {F!r}")
        self.delta = float(delta)
        if not 0.0 < self.delta < 1.0:
            raise InputDataError(f"delta: expected 0 < delta < 1, got {delta!r}")
        with torch.no_grad():
            self.kdiag = self.kernel.diag(self.arms)  # (A,) prior variances k(a, a)
        check_finite(self.kdiag, "kernel: prior variances k(a, a)")
        if bool((self.kdiag < 0).any()):
            raise InputDataError(f"kernel: expected prior variances k(a, a) >= 0 at every arm, got min "
                                 f"{float(self.kdiag.min()):.3g}")
        self.kappa2 = float(self.kdiag.max())
        check_units(self.kappa2, self.lam, self.arms.dtype, type(self).__name__)

    def _random_arm(self) -> torch.Tensor:
        """One uniform arm among those not :attr:`excluded`, `(1,)` long."""
        if not bool(self.excluded.any()):
            return torch.randint(0, self.num_arms, (1,), generator=self.generator).to(self.arms.device)
        allowed = self._allowed()
        j = torch.randint(0, int(allowed.numel()), (1,), generator=self.generator)
        return allowed[j.to(allowed.device)]

