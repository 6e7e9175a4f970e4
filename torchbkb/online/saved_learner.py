"""``state_dict`` / ``load_state_dict`` for the online learners and their parts, whose state grows with the stream.

A learner's state is buffers that change shape as it learns (``A⁻¹`` of PKAWV with KORS grows with its
dictionary, KORS's points and probabilities with every addition) and values that are not tensors (rounds
counted, the generator's state, the stream's dtype). :class:`SavedState` puts the latter in the module's extra
state and loads the former by replacing the buffers (a plain ``load_state_dict`` copies into buffers of the
current shape, so it refused a grown state, and a buffer still ``None`` before the first input was an
"unexpected key"). A failed load changes nothing.

Example:
    >>> import torch
    >>> from torchbkb.online import KernelAWV
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X, y = torch.rand(30, 2, dtype=torch.float64), torch.rand(30, dtype=torch.float64)
    >>> a = KernelAWV(GaussianKernel(0.5)).update(X, y)
    >>> b = KernelAWV(GaussianKernel(0.5))
    >>> _ = b.load_state_dict(a.state_dict())
    >>> b.num_rounds, bool(torch.equal(a.predict(X), b.predict(X)))
    (30, True)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchbkb.errors import CheckpointError

__all__ = ["SavedState", "check_bound_buffers", "module_device", "saved_counts", "saved_tensor"]


class SavedState(nn.Module):
    """Mixin: buffers named in :attr:`grown_buffers` are loaded by replacement (or set to ``None`` when the saved
    state has none), and :meth:`load_state_dict` restores the module tree when it fails."""

    #: buffers whose shape follows the stream (``None`` before the first input)
    grown_buffers: tuple[str, ...] = ()

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """:meth:`torch.nn.Module.load_state_dict`; on any error every module of the tree is put back as it was."""
        backup = [_backup(m) for m in self.modules()]
        try:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        except Exception:
            for m, saved in zip(self.modules(), backup):
                _restore(m, saved)
            raise

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        device = module_device(self)
        for name in self.grown_buffers:
            key = prefix + name
            if key in state_dict:
                value = state_dict[key]
                if not isinstance(value, torch.Tensor) or (value.is_floating_point()
                                                           and not bool(torch.isfinite(value).all())):
                    got = "NaN/inf entries" if isinstance(value, torch.Tensor) else type(value).__name__
                    raise CheckpointError(f"state: expected a finite tensor for {key!r}, got {got}")
                self._buffers[name] = value.detach().clone().to(device if device is not None else value.device)
            elif strict:
                self._buffers[name] = None
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


def saved_tensor(state: dict[str, Any], key: str, shape: tuple[int | None, ...], *, floating: bool = True,
                 device: torch.device | None = None) -> torch.Tensor:
    """``state[key]``, checked: a tensor of ``shape`` (``None`` matches any size), floating and finite, moved to
    ``device``; else a :class:`~torchbkb.errors.CheckpointError`."""
    t = state.get(key) if isinstance(state, dict) else None
    if (not isinstance(t, torch.Tensor) or t.dim() != len(shape)
            or any(s is not None and s != n for s, n in zip(shape, t.shape))
            or t.is_floating_point() != floating or (floating and not bool(torch.isfinite(t).all()))):
        got = f"shape {tuple(t.shape)}, dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise CheckpointError(f"state: expected {key!r} as a finite {'floating' if floating else 'integer'} tensor "
                              f"of shape {shape}, got {got}")
    return t.detach().clone().to(device if device is not None else t.device)


def saved_counts(state: dict[str, Any], keys: tuple[str, ...]) -> list[int]:
    """``state[k]`` for each of ``keys``, checked as integers ``>= 0``; else a
    :class:`~torchbkb.errors.CheckpointError`."""
    values = [state.get(k) if isinstance(state, dict) else None for k in keys]
    if not all(type(v) is int and v >= 0 for v in values):
        raise CheckpointError(f"state: expected integers >= 0 for {list(keys)}, got {values}")
    return values


def check_bound_buffers(module: nn.Module, shapes: dict[str, tuple[int, ...]]) -> None:
    """After a load: each named buffer present with its shape when the learner is bound (``None`` otherwise)."""
    bound = module.is_bound
    for name, shape in shapes.items():
        t = getattr(module, name)
        if (t is not None) != bound or (t is not None and tuple(t.shape) != shape):
            got = None if t is None else tuple(t.shape)
            raise CheckpointError(f"state: expected {name!r} of shape {shape if bound else None} for a "
                                  f"{'bound' if bound else 'fresh'} {type(module).__name__}, got {got}")


def module_device(module: nn.Module) -> torch.device | None:
    """The device of the module's first parameter or buffer (its submodules' included); ``None`` when it has none."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return None


def _own_tensors(m: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]


def _backup(m: nn.Module) -> tuple:
    tensors = {k: v.detach().clone() for k, v in _own_tensors(m)}
    gen = getattr(m, "generator", None)
    return dict(m.__dict__), dict(m._buffers), tensors, gen.get_state() if isinstance(gen, torch.Generator) else None


def _restore(m: nn.Module, saved: tuple) -> None:
    """Put back the attributes and buffers a load replaced, and the values it copied in place."""
    attrs, buffers, tensors, gen = saved
    m.__dict__.clear()
    m.__dict__.update(attrs)
    m._buffers.clear()
    m._buffers.update(buffers)
    with torch.no_grad():
        for k, t in _own_tensors(m):
            if k in tensors and t.shape == tensors[k].shape:
                t.copy_(tensors[k])
    if gen is not None:
        m.generator.set_state(gen)
