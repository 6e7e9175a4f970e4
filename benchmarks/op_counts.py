"""What a step dispatches: its top-level tensor operators, its kernels (:class:`KernelCount`) and the host reads it
makes or would make on a GPU (:data:`SYNC_OPS`, ``Tensor.tolist`` calls, CUDA's synchronization warnings).

Used by :mod:`benchmarks.launches` and :mod:`benchmarks.botorch_peer` (both import these names from
``benchmarks.launches`` too).
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter

import torch

__all__ = ["SYNC_OPS", "KernelCount", "counted_tolist", "sync_sites", "top_level_ops"]


#: operators that read a device value on the host (a synchronization on a GPU): the CPU's forecast of them.
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2",
            "aten::is_nonzero", "aten::item", "aten::equal")


@contextlib.contextmanager
def counted_tolist():
    """Count ``Tensor.tolist`` calls (a host read that records no ``aten::`` operator) in ``[n]``."""
    calls, original = [0], torch.Tensor.tolist

    def tolist(self):
        calls[0] += 1
        return original(self)

    torch.Tensor.tolist = tolist
    try:
        yield calls
    finally:
        torch.Tensor.tolist = original


@contextlib.contextmanager
def sync_sites(sites: Counter):
    """Record in ``sites`` the library lines (``file:line`` of the innermost ``torchbkb`` frames) where a CUDA
    synchronization warning is raised; their number under ``"_n"``."""
    import traceback

    show = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message).lower():
            return show(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-1] if "torchbkb" in f.filename or "benchmarks" in f.filename]
        sites["_n"] += 1
        sites[" < ".join(f"{f.filename.split('/')[-1]}:{f.lineno}" for f in frames[::-1][:3])] += 1

    warnings.showwarning = record
    try:
        yield sites
    finally:
        warnings.showwarning = show


class KernelCount:
    """Count, at the dispatcher, the operators that do work -- a GPU's kernel launches, roughly: views, no-op casts
    (``.to`` of a tensor that needs none never reaches the dispatcher) and empty allocations are left out, and an
    operator built from others counts as those others. ``work`` is their number, ``names`` a ``Counter``.

    Example::

        with KernelCount() as k:
            model.posterior(X)
        print(k.work)
    """

    FREE = ("detach", "alias", "lift_fresh", "empty", "empty_strided", "empty_like")

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        names = self.names = Counter()
        free = self.FREE

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not func.is_view and func.overloadpacket.__name__ not in free:
                    names[func.overloadpacket.__name__] += 1
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)

    @property
    def work(self) -> int:
        return sum(self.names.values())


def top_level_ops(prof) -> list[str]:
    """The names of the operators called from Python (not from inside another operator)."""
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    inside = set()
    for e in events:
        for child in e.cpu_children:
            inside.add(id(child))
    return [e.name for e in events if id(e) not in inside]
