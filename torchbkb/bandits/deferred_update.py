"""A BBKB batch end's update deferred to the next ``ask``, whose batch reads the update's flags with its picks.

On a GPU a host read drains the queue. The fixed-capacity update (:mod:`torchbkb.bandits.fixed_capacity`) reads its
flags once -- the dictionary's size and order, its factorizations' checks -- and BBKB's device loop reads its
picks once per batch (:mod:`torchbkb.bandits.device_batch`): two reads per batch. Here the update a ``tell`` ends a
batch with is only owed; the next ``ask`` queues it, selects the next batch on its outputs before they are read
(:func:`~torchbkb.bandits.fixed_capacity.padded_features`: every slot, zero past the dictionary), and reads the
flags, the new arms' rows' finiteness and the picks together: one read per batch. In the rare update that outgrew
its slots or needs the eager update, the batch is dropped and selected again on the settled posterior.

Whatever reads the posterior before that ``ask`` -- its read-outs, the attributes below, a checkpoint -- runs the
owed update first (:meth:`~DeferredBatchUpdate._settle`), reading its flags on their own: the same state, one more
read. ``tests/bandits/test_deferred_update.py`` holds the choices to the eager ones.
"""

from __future__ import annotations

import time

import torch

from torchbkb.bandits import device_batch
from torchbkb.bandits.batch_selection import BatchSelection
from torchbkb.bandits.fixed_capacity import padded_features
from torchbkb.bandits.update_rollback import rolled_back

__all__ = ["SettledAttribute", "SettlingReadouts", "DeferredBatchUpdate"]


class SettledAttribute:
    """A bandit attribute that runs an owed update before it is read (stored as ``_<name>``; set as usual)."""

    def __init__(self, doc: str):
        self.__doc__ = doc

    def __set_name__(self, owner, name: str) -> None:
        self.private = "_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        if obj._owed_update:
            obj._settle()
        return getattr(obj, self.private)

    def __set__(self, obj, value) -> None:
        setattr(obj, self.private, value)


class SettlingReadouts:
    """The sketched bandits' state attributes, read after any owed update has run (mixed into
    :class:`~torchbkb.bandits.sketched.SketchedKernelBandit`)."""

    #: an update deferred to the next ``ask`` (BBKB on a GPU: its flags are read with the next batch's picks);
    #: every read-out of the posterior runs it first (``_settle``)
    _owed_update = False

    @property
    def update_deferred(self) -> bool:
        """Whether the last batch end's update waits for the next ``ask`` (which reads it with its picks; any
        read-out of the posterior runs it first)."""
        return self._owed_update

    dictionary = SettledAttribute("`(m,)` long, arm indices of the current dictionary (ascending)")
    embeddings_computed = SettledAttribute("how many times the dictionary changed (rows updated, ``K_S`` refactored)")
    arms_scored_total = SettledAttribute("the arm variances computed, summed over all updates")
    row_posterior = SettledAttribute("the DTC state both updates write (a "
                                     ":class:`~torchbkb.gp.kernel_row_posterior.KernelRowPosterior`)")


class DeferredBatchUpdate:
    """BBKB's deferral (mixed into :class:`~torchbkb.BBKB`; the module docstring says when and how)."""

    def _settle(self) -> None:
        """Run an owed update now, reading its flags on their own."""
        if self._owed_update:
            self._owed_update = False
            self._run_update()

    def _defers_update(self) -> bool:
        """Whether this batch end's update can wait for the next ``ask``, which then reads the update's flags with
        its batch's picks: the GPU's defaults (fixed-capacity update, device loop, replayed picks) with a
        constant width, no cap, no exclusions, every arm a candidate, after the first update."""
        graphs, last = self.pick_graphs, self.batch_sizes[-1] if self.batch_sizes else 0
        return (self.device_loop and self.lazy and self.batch_size is None and self.max_batch_size is None
                and self.beta_mode not in ("theory", "practical") and not self.exclusions and graphs is not None
                and self.arms.device.type in graphs.devices and self._dictionary.numel() > 0
                and last <= device_batch.DEVICE_PICKS_MAX and self._fixed_applies())

    def _update_and_select(self) -> BatchSelection | None:
        """The deferred update and the next batch on its outputs (before they are read), its flags read with the
        batch's picks; ``None`` when the update was not adopted as launched (it outgrew its slots or went to the
        eager update: settled now) or the batch passed the device loop's length: select on the settled
        posterior then."""
        self._owed_update = False
        return self._run_deferred_update()

    @rolled_back  # a NumericsError leaves the state as before it (read after the update stopped being owed)
    def _run_deferred_update(self) -> BatchSelection | None:
        t0 = time.perf_counter()
        self._add_told_to_sums()
        told = self.last_told_ids
        added = self._add_pulled(told)
        pulled = self._pulled_arms(told)
        launched = self._launch_fixed(pulled, self.counts[pulled].to(torch.float64), None)
        out = launched.out
        Z, V_inv = padded_features(out, self.arms.dtype)
        flags = out.flags if added is None else torch.cat([out.flags, torch.as_tensor(
            added[1], dtype=torch.float64, device=out.flags.device).reshape(1)])
        host: list[float] = []
        cap, last = device_batch.DEVICE_PICKS_MAX, self.batch_sizes[-1] if self.batch_sizes else 0
        t1 = time.perf_counter()
        ran = device_batch.run_batch_on_device(Z, self._mask_excluded(out.mean), out.rls, V_inv, self.beta,
                                               self.batch_bound, pick_limit=cap, graphs=self.pick_graphs,
                                               first_check=min(int(1.25 * last) + 2, cap) if last else None,
                                               extra=(flags, host))
        t2 = time.perf_counter()
        if added is not None and not host[-1]:
            self._reject_rows(added[0])  # raises, the rows and their arms dropped
        adopted = self._complete_fixed(launched, host[: out.flags.numel()])
        self.num_resparsifications += 1
        update_s = (t1 - t0) + (time.perf_counter() - t2)  # the host's share; the device's overlaps the batch
        self.time_resparsify += update_s
        self.time_in_batch -= update_s  # the caller times the whole selection: the update is not the batch's
        if not adopted or ran is None:
            return None
        sel, ids = ran
        m = self.dictionary_size
        self._selected_ids = ids
        return sel._replace(V_inv=sel.V_inv[:m, :m])

