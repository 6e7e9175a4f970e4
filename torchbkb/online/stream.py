"""The online-regression protocol shared by every learner of :mod:`torchbkb.online`.

At round ``t`` the environment reveals ``x_t``, the learner forecasts ``ŷ_t``, then ``y_t`` is revealed
(004, Sec. 1). :class:`OnlineLearner` offers three entry points on top of two small hooks:

* ``predict(X)`` -- *pure*: the forecast each row of `(n, d)` ``X`` would get if it were the next input;
* ``update(X, y)`` -- reveal `(n, d)` inputs and `(n,)` outputs, in order;
* ``fit_stream(X, y)`` -- play the whole protocol over a stream and return a :class:`StreamResult`
  (forecasts, cumulative square loss or classification error of the sign, wall time per round).

Every public call validates *all* its inputs before touching the state, so a bad call raises
:class:`~torchbkb.errors.InputDataError` and leaves the learner exactly as it was. The first input that
reaches ``update``/``fit_stream`` fixes the stream's ``d``, dtype and device; later inputs must match.

A round is learned whole or not at all. Kernel values or features that are NaN/inf (a user's kernel or
embedding) raise :class:`~torchbkb.errors.NumericsError` before that round writes anything: the rows before
it were learned and counted, as separate ``step`` calls would have, and the error's ``rows`` names the row
of the call's inputs at which learning stopped (that row and the later ones were not learned).

Example:
    >>> import torch
    >>> from torchbkb.online import PKAWV, TaylorEmbedding
    >>> X = torch.rand(500, 2, dtype=torch.float64) * 2 - 1
    >>> y = torch.sin(3 * X[:, 0]) * X[:, 1]
    >>> res = PKAWV(embedding=TaylorEmbedding(2, degree=4), lam=1.0).fit_stream(X, y)
    >>> res.n_rounds, res.cumulative_loss.shape, res.time_per_round.shape
    (500, torch.Size([500]), torch.Size([500]))
    >>> bool(res.average_loss < (y ** 2).mean())      # beats forecasting 0
    True
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from torchbkb.errors import (
    CheckpointError,
    InputDataError,
    NumericsError,
    check_finite,
    check_int,
    check_matrix,
    check_same_device_dtype,
)
from torchbkb.online.saved_learner import SavedState, module_device

__all__ = ["StreamResult", "OnlineLearner"]

TASKS = ("regression", "classification")


@dataclass
class StreamResult:
    """What :meth:`OnlineLearner.fit_stream` returns.

    Attributes:
        predictions: `(r,)` forecasts ``ŷ_t`` (dtype and device of the stream), ``r`` rounds played.
        losses: `(r,)` float64 per-round loss: ``(y_t - ŷ_t)²`` for regression, ``1[sign(ŷ_t) != y_t]``
            for classification (``sign(0) = +1``).
        cumulative_loss: `(r,)` float64 running sum of ``losses``.
        time_per_round: `(r,)` float64 CPU tensor of seconds per round (averaged inside each chunk of
            rounds that was timed as a whole; CUDA is synchronized before the clock stops).
        task: ``"regression"`` or ``"classification"``.
        n_total: length of the stream that was offered.
        stopped_early: ``True`` if ``max_time`` ran out before the end of the stream.
    """

    predictions: torch.Tensor
    losses: torch.Tensor
    cumulative_loss: torch.Tensor
    time_per_round: torch.Tensor
    task: str
    n_total: int
    stopped_early: bool

    @property
    def n_rounds(self) -> int:
        """Rounds actually played."""
        return int(self.predictions.shape[0])

    @property
    def average_loss(self) -> float:
        """Cumulative loss divided by the rounds played (``nan`` if none)."""
        return float(self.cumulative_loss[-1]) / self.n_rounds if self.n_rounds else math.nan

    @property
    def total_time(self) -> float:
        """Seconds spent inside the learner."""
        return float(self.time_per_round.sum())

    def summary(self) -> dict:
        """A JSON-ready dict of the scalar results."""
        return {
            "task": self.task,
            "n_rounds": self.n_rounds,
            "n_total": self.n_total,
            "stopped_early": self.stopped_early,
            "cumulative_loss": float(self.cumulative_loss[-1]) if self.n_rounds else 0.0,
            "average_loss": self.average_loss,
            "total_time_s": self.total_time,
        }


def _stream_result(preds: torch.Tensor, y: torch.Tensor, times: torch.Tensor, task: str, n: int) -> StreamResult:
    """The :class:`StreamResult` of the `(r,)` forecasts ``preds`` of the targets ``y`` of a stream of ``n`` rounds."""
    if task == "regression":
        losses = (y.to(torch.float64) - preds.to(torch.float64)) ** 2
    else:
        signs = torch.where(preds >= 0, 1.0, -1.0).to(torch.float64)
        losses = (signs != y.to(torch.float64)).to(torch.float64)
    return StreamResult(predictions=preds, losses=losses, cumulative_loss=losses.cumsum(0), time_per_round=times,
                        task=task, n_total=n, stopped_early=preds.shape[0] < n)


class OnlineLearner(SavedState):
    """Base class of the online forecasters: validation, the protocol loop and the stream driver.

    Subclasses implement three hooks, all called on validated inputs under ``torch.no_grad()``:

    * ``_init_state(X)`` -- allocate the state once the stream's ``d``/dtype/device are known;
    * ``_predict(X)`` -- pure forecasts `(n,)` for `(n, d)` ``X`` on a bound learner;
    * ``_round(x, y)`` -- one protocol round on `(1, d)` ``x`` and `(1,)` ``y``: forecast, then learn;
      returns the `(1,)` forecast. A round that raises :class:`~torchbkb.errors.NumericsError` has written
      nothing (check kernel values and features before any write).

    and may override ``_stream_block(X, y, deadline)`` with an exact blocked version of consecutive rounds;
    a block that raises ``NumericsError`` sets its ``rows`` to ``(i,)``, ``i`` its first round not learned
    (without ``rows`` it learned none), and its ``forecasts`` to the `(i,)` forecasts of the rounds it learned.

    Example:
        >>> import torch
        >>> from torchbkb.online import OnlineKRR
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> krr = OnlineKRR(GaussianKernel(1.0), lam=1.0)
        >>> x, y = torch.zeros(1, 3), torch.ones(1)
        >>> krr.predict(x)                      # nothing learned yet
        tensor([0.])
        >>> krr.step(x, y), krr.num_rounds       # KRR forecasts before learning y
        (tensor([0.]), 1)
        >>> krr.predict(x)                      # k(x,x) / (k(x,x) + λ) · y = 1/2
        tensor([0.5000])
    """

    def __init__(self) -> None:
        super().__init__()
        # (0, d) tensor carrying the bound stream's d, dtype and device (moved by .to() like the state)
        self.register_buffer("_ref", None, persistent=False)
        self._num_rounds = 0

    # ------------------------------------------------------------------ public protocol
    @property
    def num_rounds(self) -> int:
        """Rounds learned so far (``update`` rows + ``step`` calls + ``fit_stream`` rounds)."""
        return self._num_rounds

    @property
    def is_bound(self) -> bool:
        """Whether a first input fixed the stream's ``d``, dtype and device."""
        return self._ref is not None

    def predict(self, X: torch.Tensor) -> torch.Tensor:
        """Forecast each row as if it were the next input. Pure: the state does not change.

        Args:
            X: `(n, d)` inputs.

        Returns:
            `(n,)` forecasts in ``X``'s dtype (zeros before anything was learned).
        """
        X = self._check_inputs(X)
        if self._ref is None:
            return X.new_zeros(X.shape[0])
        with torch.no_grad():
            return self._predict(X).to(X.dtype)

    def update(self, X: torch.Tensor, y: torch.Tensor) -> OnlineLearner:
        """Reveal inputs and outputs, in order (the forecasts are not needed, so none are returned).

        Args:
            X: `(n, d)` inputs.
            y: `(n,)` outputs.

        Returns:
            ``self``.
        """
        X = self._check_inputs(X)
        y = self._check_targets(y, X)
        with torch.no_grad():
            self._bind(X)
            try:
                self._stream_block(X, y, None)
            except NumericsError as err:
                raise self._stopped(err, 0, X.shape[0], "X") from err
        self._num_rounds += X.shape[0]
        return self

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One protocol round: receive ``x``, forecast, then learn ``y``.

        Args:
            x: `(1, d)` input.
            y: `(1,)` output, revealed after the forecast.

        Returns:
            `(1,)` forecast ``ŷ_t`` in ``x``'s dtype.
        """
        x = self._check_inputs(x)
        if x.shape[0] != 1:
            raise InputDataError(f"x: expected shape (1, d) for one round, got {tuple(x.shape)}")
        y = self._check_targets(y, x)
        with torch.no_grad():
            self._bind(x)
            try:
                out = self._round(x, y)
            except NumericsError as err:
                raise self._stopped(err, 0, 1, "x") from err
        self._num_rounds += 1
        return out.to(x.dtype)

    def fit_stream(
        self,
        X: torch.Tensor,
        y: torch.Tensor,
        *,
        task: str = "regression",
        progress: bool = False,
        max_time: float | None = None,
        chunk_size: int = 256,
    ) -> StreamResult:
        """Play the protocol over a whole stream and record losses and wall time.

        Memory stays bounded by the learner's own state plus the `(n,)` result tensors: rounds are
        processed in chunks of ``chunk_size`` (learners with an exact blocked update use one chunk as
        one block).

        Args:
            X: `(n, d)` inputs in stream order.
            y: `(n,)` outputs; for ``task="classification"`` values in ``{-1, +1}``.
            task: ``"regression"`` (square loss) or ``"classification"`` (error of ``sign(ŷ)``).
            progress: show a tqdm progress bar.
            max_time: stop after this many seconds (checked between rounds, or between blocks for
                blocked learners); the result then has ``stopped_early=True`` and fewer rounds.
            chunk_size: rounds per timed chunk / block.

        Returns:
            A :class:`StreamResult`.

        Raises:
            NumericsError: a round's kernel values or features are NaN/inf; the rounds before it were learned, its
                ``rows`` names its row of ``X`` and its ``result`` is their :class:`StreamResult`.
        """
        X = self._check_inputs(X)
        y = self._check_targets(y, X)
        if task not in TASKS:
            raise InputDataError(f"task: expected one of {TASKS}, got {task!r}")
        if task == "classification" and not bool(((y == 1) | (y == -1)).all()):
            raise InputDataError("y: expected labels in {-1, +1} for task='classification', got other values")
        check_int(chunk_size, "chunk_size")
        if max_time is not None and not (float(max_time) > 0):
            raise InputDataError(f"max_time: expected a number of seconds > 0 or None, got {max_time!r}")
        n = X.shape[0]
        preds = X.new_empty(n)
        times = torch.zeros(n, dtype=torch.float64)
        deadline = None if max_time is None else time.perf_counter() + float(max_time)
        bar = _progress(n, type(self).__name__) if progress else None
        done = 0
        with torch.no_grad():
            self._bind(X)
            while done < n:
                B = min(chunk_size, n - done)
                t0 = time.perf_counter()
                try:
                    out = self._stream_block(X[done : done + B], y[done : done + B], deadline)
                except NumericsError as err:
                    part = getattr(err, "forecasts", preds[:0]).to(X.dtype)  # the block's rounds learned before it
                    r = done + part.shape[0]
                    preds[done:r], times[done:r] = part, (time.perf_counter() - t0) / max(r - done, 1)
                    new = self._stopped(err, done, n, "X")
                    new.result = _stream_result(preds[:r], y[:r], times[:r], task, n)
                    raise new from err
                if X.is_cuda:
                    torch.cuda.synchronize(X.device)
                dt = time.perf_counter() - t0
                r = int(out.shape[0])
                preds[done : done + r] = out.to(X.dtype)
                times[done : done + r] = dt / max(r, 1)
                done += r
                self._num_rounds += r
                if bar is not None:
                    bar.update(r)
                if r < B or (deadline is not None and time.perf_counter() >= deadline):
                    break
        if bar is not None:
            bar.close()
        return _stream_result(preds[:done], y[:done], times[:done], task, n)

    # ------------------------------------------------------------------ saving (state_dict's extra state)
    def get_extra_state(self) -> dict:
        """What the buffers do not hold: rounds learned, the stream's ``d`` and dtype, the learner's own values."""
        stream = None if self._ref is None else [int(self._ref.shape[-1]), str(self._ref.dtype).split(".")[-1]]
        return {"num_rounds": self._num_rounds, "stream": stream, "own": self._own_state()}

    def set_extra_state(self, state: dict) -> None:
        """Inverse of :meth:`get_extra_state` (checked; :meth:`load_state_dict` restores the learner on error)."""
        ok = isinstance(state, dict) and type(state.get("num_rounds")) is int and state["num_rounds"] >= 0
        stream = state.get("stream") if ok else None
        dtype = getattr(torch, stream[1], None) if isinstance(stream, list) and len(stream) == 2 else None
        if not ok or not (stream is None or (type(stream[0]) is int and isinstance(dtype, torch.dtype))):
            raise CheckpointError(f"state: expected a {type(self).__name__} extra state (num_rounds, stream, own), got "
                                  f"{state!r:.200}")
        self._num_rounds = state["num_rounds"]
        device = module_device(self) or torch.device("cpu")
        self._ref = None if stream is None else torch.empty((0, stream[0]), dtype=dtype, device=device)
        self._load_own(state.get("own"), device)

    def _own_state(self) -> dict:
        """The learner's values outside its buffers and submodules (plain Python and tensors)."""
        return {}

    def _load_own(self, own: dict, device: torch.device) -> None:
        """Inverse of :meth:`_own_state`, after the buffers and ``_ref`` are loaded."""

    # ------------------------------------------------------------------ hooks
    def _init_state(self, X: torch.Tensor) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict(self, X: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _round(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _stream_block(self, X: torch.Tensor, y: torch.Tensor, deadline: float | None) -> torch.Tensor:
        """Consecutive protocol rounds; returns the `(r,)` forecasts, ``r < n`` only past ``deadline``."""
        out = X.new_empty(X.shape[0], dtype=torch.float64)
        for i in range(X.shape[0]):
            try:
                out[i] = self._round(X[i : i + 1], y[i : i + 1])[0]
            except NumericsError as err:
                err.rows, err.forecasts = (i,), out[:i]
                raise
            if deadline is not None and time.perf_counter() >= deadline:
                return out[: i + 1]
        return out

    def _stopped(self, err: NumericsError, offset: int, n: int, name: str) -> NumericsError:
        """Count the rounds a failed block learned; the error naming the row of the call's `(n, d)` inputs
        where learning stopped (``offset`` is the block's first row)."""
        learned = err.rows[0] if err.rows else 0
        self._num_rounds += learned
        row = offset + learned
        where = (f"this round (the learner's round {self._num_rounds + 1}) was not learned" if n == 1 else
                 f"at row {row} of {name} (the learner's round {self._num_rounds + 1}): the {row} rows before it "
                 f"were learned, it and the {n - row - 1} after it were not")
        new = NumericsError(f"{err}; {where}")
        new.nonfinite, new.arms, new.rows = err.nonfinite, err.arms, (row,)
        return new

    # ------------------------------------------------------------------ validation
    def _expected_dim(self) -> int | None:
        """``d`` known from the construction (e.g. a Taylor embedding), if any."""
        return None

    def _check_inputs(self, X: object, name: str = "X") -> torch.Tensor:
        d = self._ref.shape[-1] if self._ref is not None else self._expected_dim()
        check_matrix(X, name, d=d)
        if X.dim() != 2:
            raise InputDataError(f"{name}: expected shape (n, d), got shape {tuple(X.shape)}")
        if X.shape[0] < 1:
            raise InputDataError(f"{name}: expected at least one row, got shape {tuple(X.shape)}")
        if self._ref is not None:
            check_same_device_dtype(self._ref, X, name, "the inputs this learner has already seen")
        return X

    @staticmethod
    def _check_targets(y: object, X: torch.Tensor, name: str = "y") -> torch.Tensor:
        if not isinstance(y, torch.Tensor):
            raise InputDataError(f"{name}: expected a torch.Tensor, got {type(y).__name__}")
        if tuple(y.shape) != (X.shape[0],):
            raise InputDataError(f"{name}: expected shape ({X.shape[0]},) to match X, got shape {tuple(y.shape)}")
        if not y.is_floating_point():
            raise InputDataError(f"{name}: expected a floating dtype, got {y.dtype}")
        check_same_device_dtype(X, y, name, "X")
        check_finite(y, name)
        return y

    def _bind(self, X: torch.Tensor) -> None:
        if self._ref is None:
            self._init_state(X)
            self._ref = X.new_empty((0, X.shape[-1]))


def _progress(n: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=n, desc=desc, unit="round", mininterval=0.5)
