"""Ax support: ``ModelConfig(botorch_model_class=BKBModel)`` with nothing else.

Ax fits every surrogate through its ``fit_botorch_model`` dispatcher with an MLL class (by default GPyTorch's
``ExactMarginalLogLikelihood``). A :class:`~torchbkb.botorch.BKBModel` is fitted with its own evidence bound,
:class:`~torchbkb.botorch.DTCMarginalLogLikelihood`, in place of the exact one. Both classes are registered with
Ax's storage registries, so ``client.save_to_json_file()`` and ``Client.load_from_json_file()`` work. Nothing
happens when Ax is not installed.

Example:
    >>> from torchbkb.botorch.ax_support import AX_AVAILABLE
    >>> isinstance(AX_AVAILABLE, bool)
    True
"""

from __future__ import annotations

from typing import Any

from botorch.fit import fit_gpytorch_mll
from gpytorch.mlls import ExactMarginalLogLikelihood

from torchbkb.botorch.marginal_likelihood import DTCMarginalLogLikelihood
from torchbkb.botorch.model import BKBModel
from torchbkb.errors import InputDataError

__all__ = ["AX_AVAILABLE", "fit_bkb_model"]


def fit_bkb_model(model: BKBModel, mll_class: Any = None, mll_options: dict | None = None) -> None:
    """Ax's fit of a :class:`~torchbkb.botorch.BKBModel`: ``fit_gpytorch_mll`` with its
    :class:`~torchbkb.botorch.DTCMarginalLogLikelihood` (Ax's default ``ExactMarginalLogLikelihood`` names the
    exact GP's evidence, which the bound replaces; any other MLL class is refused)."""
    if mll_class not in (None, ExactMarginalLogLikelihood, DTCMarginalLogLikelihood):
        raise InputDataError(
            f"mll_class: expected ExactMarginalLogLikelihood or DTCMarginalLogLikelihood for a BKBModel, got "
            f"{getattr(mll_class, '__name__', mll_class)}"
        )
    if mll_options:
        raise InputDataError(f"mll_options: expected none (DTCMarginalLogLikelihood takes no options), got "
                             f"{mll_options!r}")
    fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))


try:
    from ax.generators.torch.botorch_modular.utils import fit_botorch_model
    from ax.storage.botorch_modular_registry import register_mll, register_model
except ImportError:  # Ax is optional
    AX_AVAILABLE = False
else:
    AX_AVAILABLE = True
    fit_botorch_model.register(BKBModel)(fit_bkb_model)
    register_model(BKBModel)  # Ax's JSON and SQL storage: a saved Client restores with no user code
    register_mll(DTCMarginalLogLikelihood)
