"""One optimizer run of a :class:`~torchbkb.botorch.BKBModel`'s fit under ``fit_gpytorch_mll``'s retry policy.

BoTorch fits a ``SingleTaskGP`` in attempts: an attempt that ends with an optimization warning (an "ABNORMAL" line
search, a failed run) or raises ``NotPSDError`` is rolled back and retried from a draw of the hyperparameters'
priors, up to ``max_attempts`` times; then ``ModelFittingError``. Each fitting round of a BKBModel runs the same
policy, so its fit is as robust as the exact one's (a non-finite bound inside an attempt is a NaN loss, from
which L-BFGS's line search backs off: :class:`~torchbkb.botorch.marginal_likelihood.BoundNanError`).

Example:
    >>> import torch
    >>> from botorch.optim.fit import fit_gpytorch_mll_scipy
    >>> from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood
    >>> X = torch.rand(30, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> mll = DTCMarginalLogLikelihood((m := BKBModel(X, torch.sin(6 * X), seed=0)).likelihood, m)
    >>> result = optimize_with_retries(mll, fit_gpytorch_mll_scipy)
    >>> result.status.name
    'SUCCESS'
"""

from __future__ import annotations

from itertools import filterfalse
from warnings import catch_warnings, simplefilter, warn_explicit

import torch
from botorch.exceptions.errors import ModelFittingError
from botorch.exceptions.warnings import OptimizationWarning
from botorch.fit import DEFAULT_WARNING_HANDLER
from botorch.optim.utils import get_parameters, sample_all_priors
from botorch.utils.context_managers import module_rollback_ctx, parameter_rollback_ctx
from linear_operator.utils.errors import NotPSDError

__all__ = ["optimize_with_retries", "MAX_ATTEMPTS"]

#: ``fit_gpytorch_mll``'s default number of attempts.
MAX_ATTEMPTS = 5


def optimize_with_retries(mll, optimizer, *, closure=None, closure_kwargs=None, optimizer_kwargs=None,
                          max_attempts: int = MAX_ATTEMPTS, warning_handler=DEFAULT_WARNING_HANDLER,
                          caught_exception_types: tuple = (NotPSDError,)):
    """Run ``optimizer(mll, closure=..., closure_kwargs=..., **optimizer_kwargs)`` until an attempt succeeds.

    Args:
        mll: the model's :class:`~torchbkb.botorch.DTCMarginalLogLikelihood` (put in training mode).
        optimizer: a BoTorch fit routine (``fit_gpytorch_mll_scipy``, ``fit_gpytorch_mll_torch``...).
        closure, closure_kwargs, optimizer_kwargs: passed on.
        max_attempts, warning_handler, caught_exception_types: ``fit_gpytorch_mll``'s policy and defaults.

    Returns:
        The successful attempt's ``OptimizationResult``; the hyperparameters are that attempt's.

    Raises:
        ModelFittingError: every attempt failed (the hyperparameters are those the fit started from).
    """
    if int(max_attempts) < 1:
        raise ValueError(f"max_attempts: expected an integer >= 1, got {max_attempts!r}")
    frozen = None
    for attempt in range(1, int(max_attempts) + 1):
        with module_rollback_ctx(mll, device=torch.device("cpu")) as ckpt:
            if attempt > 1:  # a fresh start: the trainable hyperparameters drawn from their priors
                frozen = get_parameters(mll, requires_grad=False) if frozen is None else frozen
                with parameter_rollback_ctx(frozen, checkpoint={name: ckpt[name] for name in frozen}):
                    sample_all_priors(mll)
            mll.train()
            try:
                with catch_warnings(record=True) as caught:
                    simplefilter("always", category=OptimizationWarning)
                    result = optimizer(mll, closure=closure, closure_kwargs=closure_kwargs, **(optimizer_kwargs or {}))
            except caught_exception_types:
                continue
            success = True
            for w in filterfalse(warning_handler, caught):
                warn_explicit(str(w.message), w.category, w.filename, w.lineno)
                success = False
            if success:
                ckpt.clear()  # keep this attempt's hyperparameters
                return result
    raise ModelFittingError("All attempts to fit the model have failed.")
