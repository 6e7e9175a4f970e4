"""The saved state of a :class:`~torchbkb.botorch.TrustRegionBKB` loop: its layout and its check.

A state holds tensors, numbers, strings and lists only, so ``torch.load(weights_only=True)`` reads it back and a
checkpoint cannot run code. :func:`check_loop_state` refuses, with a :class:`~torchbkb.errors.CheckpointError`
that says what it expected, any state the loop could not resume from exactly: another loop's settings, points
that are not finite or not in the box's dimension, a region's indices outside the told points, wrong counters.

Example:
    >>> import torch
    >>> from torchbkb.botorch import TrustRegionBKB
    >>> loop = TrustRegionBKB(torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64), batch_size=4, seed=0)
    >>> state = loop.state_dict()
    >>> sorted(state) == sorted(LOOP_FIELDS) and sorted(state["regions"][0]) == sorted(REGION_FIELDS)
    True
    >>> check_loop_state(state, loop.state_dict()["settings"])["X"].shape
    torch.Size([0, 2])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchbkb.botorch.trust_region import TrustRegion
from torchbkb.errors import CheckpointError, InputDataError

__all__ = ["LOOP_FIELDS", "REGION_FIELDS", "check_loop_state", "loop_settings"]

#: the fields of a loop's state.
LOOP_FIELDS = ("settings", "X", "Y", "draws", "pending", "regions", "asked", "X_failed")
#: the fields of one region's state: its TuRBO state, its points since its restart (indices into ``X``), its last
#: hyperparameters, its fit counters, and the rows and seed of its last model (``None`` before its first fit).
REGION_FIELDS = ("trust_region", "owned", "hyper", "cold_at", "fits", "cold_cost", "fit_rows", "fit_seed")


def loop_settings(loop) -> dict:
    """The settings a state must share with the loop that loads it: the box (on the CPU), the batch size, the
    regions' number and every choice of the proposals."""
    return {"bounds": loop.bounds.detach().cpu().clone(), "batch_size": loop.batch_size,
            "num_regions": len(loop.regions), "acquisition": loop.acquisition, "beta": loop.beta,
            "n_init": loop.n_init, "n_candidates": loop.n_candidates, "local_points": loop.local_points,
            "warm_start": loop.warm_start, "sampler": loop.sampler, "seed": loop.seed}


def check_loop_state(state: Any, settings: dict) -> dict:
    """``state`` checked against the ``settings`` of the loop that loads it (``state_dict()["settings"]``);
    returns ``state``, unchanged.

    Raises:
        CheckpointError: a missing or extra field, other settings, or a value the loop could not resume from.
    """
    _fields(state, LOOP_FIELDS, "state")
    _same_settings(state["settings"], settings)
    d, m = settings["bounds"].shape[1], settings["num_regions"]
    X, Y, failed, asked, pending = (state[k] for k in ("X", "Y", "X_failed", "asked", "pending"))
    _points(X, "X", d)
    n = X.shape[0]
    if not isinstance(Y, Tensor) or not Y.is_floating_point() or Y.shape != (n,):
        raise CheckpointError(f"state: expected Y as a floating tensor of shape ({n},), got {_describe(Y)}")
    _points(failed, "X_failed", d)
    if pending is not None and not _indices(pending, -1, m):
        raise CheckpointError(f"state: expected pending as None or a list of region indices in [-1, {m}), got "
                              f"{_describe(pending)}")
    if (asked is None) != (pending is None):
        raise CheckpointError(f"state: expected asked and pending both given or both None, got {_describe(asked)} "
                              f"and {_describe(pending)}")
    if asked is not None:
        _points(asked, "asked", d, len(pending))
    if not all(bool(torch.isfinite(t).all()) for t in (X, Y, failed) + (() if asked is None else (asked,))):
        raise CheckpointError("state: expected finite X, Y, X_failed and asked, got NaN or inf")
    _integer(state["draws"], "draws")
    regions = state["regions"]
    if not isinstance(regions, list) or len(regions) != m:
        raise CheckpointError(f"state: expected regions as a list of {m}, got {_describe(regions)}")
    for r, region in enumerate(regions):
        _region(region, f"regions[{r}]", n, settings)
    return state


def _points(value: Any, name: str, d: int, rows: int | None = None) -> None:
    if not (isinstance(value, Tensor) and value.is_floating_point() and value.dim() == 2 and value.shape[1] == d
            and (rows is None or value.shape[0] == rows)):
        shape = f"({'n' if rows is None else rows}, {d})"
        raise CheckpointError(f"state: expected {name} as a floating tensor of shape {shape}, got {_describe(value)}")


def _region(region: Any, name: str, n: int, settings: dict) -> None:
    _fields(region, REGION_FIELDS, name)
    _trust_region(region["trust_region"], f"{name}.trust_region")
    if not _indices(region["owned"], 0, n):
        raise CheckpointError(f"{name}: expected owned as a list of indices in [0, {n}), got "
                              f"{_describe(region['owned'])}")
    hyper = region["hyper"]
    if hyper is not None and not (isinstance(hyper, dict) and all(
            isinstance(k, str) and isinstance(v, Tensor) and not bool(v.isnan().any()) for k, v in hyper.items())):
        raise CheckpointError(f"{name}: expected hyper as None or a dict of tensors without NaN (a constraint's bound "
                              f"may be infinite), got {_describe(hyper)}")
    for field in ("cold_at", "fits", "cold_cost"):
        _integer(region[field], f"{name}.{field}")
    rows, seed = region["fit_rows"], region["fit_seed"]
    if (rows is None) != (seed is None) or (rows is not None and (not _indices(rows, 0, n) or not rows)):
        raise CheckpointError(f"{name}: expected fit_rows (a non-empty list of indices in [0, {n})) and fit_seed "
                              f"both given or both None, got {_describe(rows)} and {seed!r}")
    if seed is not None:
        _integer(seed, f"{name}.fit_seed")
    if rows is not None and hyper is None:
        raise CheckpointError(f"{name}: expected the hyperparameters of its last model, got None")


def _trust_region(state: Any, name: str) -> None:
    try:
        TrustRegion(1, 1).load_state_dict(state)  # its own check, on a throwaway region
    except InputDataError as e:
        raise CheckpointError(f"{name}: {e}") from e


def _same_settings(got: Any, expected: dict) -> None:
    if not isinstance(got, dict) or set(got) != set(expected):
        raise CheckpointError(f"state: expected settings with the keys {sorted(expected)}, got {_describe(got)}")
    bounds = got["bounds"]
    same = isinstance(bounds, Tensor) and bounds.shape == expected["bounds"].shape
    same = same and torch.equal(bounds.cpu().double(), expected["bounds"].cpu().double())
    differ = [k for k in expected if k != "bounds" and got[k] != expected[k]] + ([] if same else ["bounds"])
    if differ:
        shown = ", ".join(f"{k}={expected[k]!r} (got {got[k]!r})" for k in differ if k != "bounds")
        shown = shown + (", the loop's bounds" if "bounds" in differ else "")
        raise CheckpointError(f"state: expected the settings of this loop, got another loop's: {shown}")


def _fields(value: Any, fields: tuple[str, ...], name: str) -> None:
    if not isinstance(value, dict) or set(value) != set(fields):
        got = sorted(map(str, value)) if isinstance(value, dict) else _describe(value)
        raise CheckpointError(f"{name}: expected the fields {sorted(fields)}, got {got}")


def _integer(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"state: expected {name} as an integer >= 0, got {value!r}")


def _indices(values: Any, low: int, high: int) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and low <= v < high for v in values)


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {str(x)[:80]}"
