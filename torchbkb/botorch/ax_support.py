"""Ax support: ``ModelConfig(botorch_model_class=BKBModel)`` with nothing else.

Ax fits every surrogate through its ``fit_botorch_model`` dispatcher. A :class:`~torchbkb.botorch.BKBModel`
is training-free (its hyperparameters are fixed when it is built), so its fit is a no-op; registering it is
all Ax needs. Nothing happens when Ax is not installed.

Example:
    >>> from torchbkb.botorch.ax_support import AX_AVAILABLE
    >>> isinstance(AX_AVAILABLE, bool)
    True
"""

from __future__ import annotations

from typing import Any

from torchbkb.botorch.model import BKBModel

__all__ = ["AX_AVAILABLE", "fit_bkb_model"]


def fit_bkb_model(model: BKBModel, mll_class: Any = None, mll_options: dict | None = None) -> None:
    """Ax's fit of a :class:`~torchbkb.botorch.BKBModel`: nothing to fit (fixed hyperparameters)."""


try:
    from ax.generators.torch.botorch_modular.utils import fit_botorch_model
except ImportError:  # Ax is optional
    AX_AVAILABLE = False
else:
    AX_AVAILABLE = True
    fit_botorch_model.register(BKBModel)(fit_bkb_model)
