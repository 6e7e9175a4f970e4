"""The one small error hierarchy of torchbkb.

Every error raised on purpose by torchbkb is a :class:`TorchBKBError`; bad user input is an
:class:`InputDataError` (also a ``ValueError``, so generic handlers keep working); a factorization
that fails even after jitter escalation is a :class:`NumericsError`. Recoverable numerical trouble
(jitter had to be added, eigenvalues were dropped) is reported with a :class:`NumericsWarning`.

Messages follow one pattern: what was expected, and what came.

Example:
    >>> import torch
    >>> from torchbkb.errors import InputDataError, check_finite
    >>> try:
    ...     check_finite(torch.tensor([1.0, float("nan")]), "y")
    ... except InputDataError as e:
    ...     print(e)
    y: expected finite values, got 1 NaN/inf entries out of 2
"""

from __future__ import annotations

import torch

__all__ = [
    "TorchBKBError",
    "InputDataError",
    "NumericsError",
    "NumericsWarning",
    "TheoryWarning",
    "CheckpointError",
    "ObjectiveError",
    "ObjectiveOutputError",
    "InfrastructureError",
    "check_finite",
    "check_matrix",
    "check_same_device_dtype",
    "check_positive",
    "nonfinite_rows_error",
    "nonfinite_values_error",
]


class TorchBKBError(Exception):
    """Base class of every error torchbkb raises on purpose."""


class InputDataError(TorchBKBError, ValueError):
    """The input has the wrong shape, dtype, device or values (NaN/inf, negative noise...)."""


class NumericsError(TorchBKBError, RuntimeError):
    """A factorization failed even after escalating the jitter, or a kernel returned NaN/inf; ``nonfinite`` is true
    when the matrix itself held NaN/inf entries (e.g. a hyperparameter an optimizer pushed out of range), ``arms``
    names the arms whose kernel rows ``k(a, ·)`` held them, when known; ``rows``, from an online learner, names the row
    of the call's inputs at which learning stopped, and ``result``, from its ``fit_stream``, is the ``StreamResult`` of
    the rounds learned before it."""

    nonfinite: bool = False
    arms: tuple[int, ...] = ()
    rows: tuple[int, ...] = ()
    result: object = None


def nonfinite_rows_error(arms: list[int]) -> NumericsError:
    """The :class:`NumericsError` of kernel rows ``k(a, ·)`` holding NaN/inf, naming ``arms`` (its ``arms``)."""
    err = NumericsError(f"kernel: expected finite values k(a, ·), got NaN/inf in the rows of arms {list(arms)}")
    err.nonfinite, err.arms = True, tuple(arms)
    return err


def nonfinite_values_error(name: str, values: str) -> NumericsError:
    """The :class:`NumericsError` of computed ``values`` (kernel values, features) of ``name`` holding NaN/inf."""
    err = NumericsError(f"{name}: expected finite {values}, got NaN/inf")
    err.nonfinite = True
    return err


class NumericsWarning(UserWarning):
    """Numerical trouble that torchbkb recovered from (jitter added, directions dropped), or results whose
    accuracy it cannot vouch for (an ill-conditioned dictionary next to a tiny noise)."""


class TheoryWarning(UserWarning):
    """A theorem's width is used with settings outside the theorem's preconditions
    (:mod:`torchbkb.bandits.theorems`)."""


class CheckpointError(InputDataError):
    """A checkpoint cannot be used: empty, truncated, not a torchbkb checkpoint, an unknown format version,
    or written for other arms, another kernel, noise or algorithm settings. Nothing was changed."""


class ObjectiveError(TorchBKBError):
    """The objective failed (after its retries) for some arms; the message names them."""


class ObjectiveOutputError(ObjectiveError, InputDataError):
    """The objective returned something that is not one real reward per asked arm (wrong shape, complex,
    not a number); the message names the arms. It is a defect of the objective and is never retried."""


class InfrastructureError(TorchBKBError):
    """Evaluations could not be run (executor shut down or broken, workers lost, cancelled futures, timeouts,
    connection errors) for longer than the run's deadline. No arm is blamed: the run was checkpointed (when
    it has a checkpoint) and calling :func:`torchbkb.run` again with the same path resumes it.

    Attributes:
        arms: the arm indices whose evaluation was still outstanding.
    """

    def __init__(self, message: str, arms: list[int] | None = None):
        super().__init__(message)
        self.arms = list(arms or [])


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise :class:`InputDataError` if ``t`` holds NaN or inf."""
    if not bool(torch.isfinite(t).all()):
        bad = ~torch.isfinite(t)
        raise InputDataError(
            f"{name}: expected finite values, got {int(bad.sum())} NaN/inf entries out of {t.numel()}"
        )


def check_matrix(t: object, name: str, *, d: int | None = None, min_rows: int = 0,
                 finite: bool = True) -> torch.Tensor:
    """Check that ``t`` is a floating tensor of shape ``(*batch, n, d)`` with finite values.

    Args:
        t: the candidate tensor.
        name: its name in error messages.
        d: the expected trailing dimension, if known.
        min_rows: the least number of rows ``n``.
        finite: check the values too (``False``: the caller checks them, with others in one host read).

    Returns:
        ``t`` itself.
    """
    if not isinstance(t, torch.Tensor):
        raise InputDataError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() < 2:
        raise InputDataError(f"{name}: expected shape (*batch, n, d), got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        raise InputDataError(f"{name}: expected a floating dtype, got {t.dtype}")
    if d is not None and t.shape[-1] != d:
        raise InputDataError(f"{name}: expected trailing dimension d={d}, got shape {tuple(t.shape)}")
    if t.shape[-2] < min_rows:
        raise InputDataError(f"{name}: expected at least {min_rows} rows, got shape {tuple(t.shape)}")
    if finite:
        check_finite(t, name)
    return t


def check_same_device_dtype(ref: torch.Tensor, t: torch.Tensor, name: str, ref_name: str) -> None:
    """Raise :class:`InputDataError` if ``t`` and ``ref`` differ in dtype or device."""
    if t.dtype != ref.dtype or t.device != ref.device:
        raise InputDataError(
            f"{name}: expected dtype {ref.dtype} on {ref.device} (like {ref_name}), "
            f"got dtype {t.dtype} on {t.device}"
        )


def check_positive(value: float, name: str) -> float:
    """Return ``float(value)`` if it is a finite number > 0, else raise :class:`InputDataError`."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputDataError(f"{name}: expected a positive number, got {value!r}") from None
    if not (v > 0.0) or v == float("inf"):
        raise InputDataError(f"{name}: expected a finite number > 0, got {value!r}")
    return v


def check_nonnegative(value: float, name: str) -> float:
    """Return ``float(value)`` if it is a finite number >= 0, else raise :class:`InputDataError`."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputDataError(f"{name}: expected a number >= 0, got {value!r}") from None
    if not 0.0 <= v < float("inf"):
        raise InputDataError(f"{name}: expected a finite number >= 0, got {value!r}")
    return v


def check_int(value: object, name: str, minimum: int = 1) -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) ``>= minimum``, else raise :class:`InputDataError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputDataError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


def check_generator(generator: object, seed: int | None = None) -> torch.Generator:
    """``generator`` if given (it must be a ``torch.Generator``), else a new CPU generator seeded with ``seed``
    (from fresh entropy when ``seed`` is ``None``)."""
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise InputDataError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
        return generator
    generator = torch.Generator()
    if seed is not None:
        generator.manual_seed(int(seed))
    else:
        generator.seed()
    return generator
