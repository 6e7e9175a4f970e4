"""What a checkpoint must match to be resumed by a bandit: its arms, its kernel, its noise and its settings.

A checkpoint written by one bandit and loaded into another with the same number of arms would otherwise
resume silently on other data. :func:`bandit_fingerprint` summarizes a bandit as

* ``arms``: a SHA-256 of the arms' bytes (with their dtype and shape) -- exact;
* ``kernel``: the kernel's class name and its values on up to :data:`KERNEL_PROBES` arms spread over the
  set -- compared with a relative tolerance, so a checkpoint moves between devices;
* ``settings``: the algorithm's hyperparameters (``λ``, the width, ``q̄``, ``C̃``, ...) -- exact.

:func:`check_fingerprint` names the first difference in a :class:`~torchbkb.errors.CheckpointError`.

Example:
    >>> import torch
    >>> from torchbkb.bandits import BKB
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> arms = torch.rand(50, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> a = bandit_fingerprint(BKB(arms, GaussianKernel(0.3), noise=0.1, beta=0.5))
    >>> b = bandit_fingerprint(BKB(arms, GaussianKernel(0.3), noise=0.2, beta=0.5))
    >>> try:
    ...     check_fingerprint(a, b)
    ... except Exception as e:
    ...     print(type(e).__name__, str(e)[:60])
    CheckpointError checkpoint: expected a checkpoint of a bandit with lam=0.2, 
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from torchbkb.errors import CheckpointError

__all__ = ["KERNEL_PROBES", "SETTINGS", "bandit_fingerprint", "check_fingerprint"]

#: arms at which the kernel is evaluated for the fingerprint (a `(p, p)` block).
KERNEL_PROBES = 8
#: the bandit attributes that define an algorithm's behaviour (those a bandit has are compared).
SETTINGS = (
    "lam", "beta_mode", "noise_std", "F", "delta", "q_bar", "inclusion", "epsilon", "batch_bound", "max_batch_size",
    "lazy",
    "budget", "interval", "lambda_max_mode", "discretization_c", "num_batches", "oversample", "refresh",
    "schedule", "base_size", "stop_rule", "sample_scale",
)  # fmt: skip
#: the value a setting had before it existed (checkpoints written then lack it)
SETTING_DEFAULTS = {"inclusion": "per_pull", "stop_rule": "batch_start"}


def bandit_fingerprint(bandit: Any) -> dict[str, Any]:
    """The fingerprint of ``bandit`` (plain Python values and one small tensor; see the module docstring)."""
    arms = bandit.arms.detach()
    digest = hashlib.sha256(f"{arms.dtype}{tuple(arms.shape)}".encode())
    digest.update(arms.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    fp: dict[str, Any] = {"class": type(bandit).__name__, "arms": digest.hexdigest(), "settings": {}}
    for name in SETTINGS:
        if hasattr(bandit, name):
            value = getattr(bandit, name)
            fp["settings"][name] = value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
    kernel = getattr(bandit, "kernel", None)
    if kernel is not None:
        A = arms.shape[0]
        probes = torch.linspace(0, A - 1, min(A, KERNEL_PROBES)).round().long().to(arms.device)
        with torch.no_grad():
            block = kernel(arms[probes], arms[probes])  # (p, p)
        inner = getattr(kernel, "kernel", kernel)
        fp["kernel"] = {"class": type(inner).__name__, "values": block.detach().to("cpu", torch.float64).clone()}
    return fp


def check_fingerprint(saved: Any, current: dict[str, Any]) -> None:
    """Raise :class:`~torchbkb.errors.CheckpointError` naming the first way ``saved`` differs from ``current``."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint: expected a fingerprint dict, got {type(saved).__name__}")
    if saved.get("class") != current["class"]:
        raise CheckpointError(f"checkpoint: expected a checkpoint of a {current['class']}, got one of a "
                              f"{saved.get('class')}")
    if saved.get("arms") != current["arms"]:
        raise CheckpointError("checkpoint: expected a checkpoint over these arms, got one written over other arms "
                              "(their digests differ)")
    got = saved.get("settings")
    if not isinstance(got, dict):
        raise CheckpointError(f"checkpoint: expected the algorithm's settings, got {type(got).__name__}")
    for name, value in current["settings"].items():
        if name not in got and SETTING_DEFAULTS.get(name) == value:
            continue
        if name not in got or got[name] != value:
            shown = "missing" if name not in got else f"{name}={got[name]!r}"
            raise CheckpointError(f"checkpoint: expected a checkpoint of a bandit with {name}={value!r}, got {shown}")
    if "kernel" in current:
        k_saved, k_now = saved.get("kernel"), current["kernel"]
        if not isinstance(k_saved, dict) or k_saved.get("class") != k_now["class"]:
            got_cls = k_saved.get("class") if isinstance(k_saved, dict) else None
            raise CheckpointError(f"checkpoint: expected a checkpoint with a {k_now['class']} kernel, got {got_cls}")
        vals = k_saved.get("values")
        if not isinstance(vals, torch.Tensor) or vals.shape != k_now["values"].shape:
            raise CheckpointError("checkpoint: expected the kernel's values at the probe arms, got none or another "
                                  "shape")
        old, new = vals.to(torch.float64), k_now["values"]
        finite = torch.isfinite(new)  # a kernel NaN/inf at some probes must be so at the same ones
        same = (torch.equal(torch.isfinite(old), finite)
                and torch.equal(old[~finite].nan_to_num(), new[~finite].nan_to_num()))
        diff = float((old - new)[finite].abs().max()) if same and bool(finite.any()) else 0.0 if same else float("nan")
        scale = float(new[finite].abs().max()) if bool(finite.any()) else 0.0
        if not diff <= 1e-5 * scale:
            raise CheckpointError(
                f"checkpoint: expected a checkpoint with this kernel, got one whose kernel values differ by {diff:.3g} "
                f"(relative {diff / scale if scale > 0 else float('inf'):.3g}) at the same arms"
            )
