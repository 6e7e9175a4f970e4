"""The bundled real arm sets of the BBKB paper (001, Sec. 4): Abalone and California housing ("cadata").

Every row of a table is an arm; its features (z-scored per column) are the arm's coordinates and its
target is the arm's reward. Regret is measured against the best row.

* ``"abalone"`` -- UCI Abalone, 4,177 rows. Features: the categorical ``sex`` and 7 physical
  measurements (length, diameter, height, whole/shucked/viscera/shell weight). Reward: ``rings``
  (age in years is rings + 1.5). The paper reports ``d = 8``, which is what the LIBSVM copy of the data
  (the usual source of the ``abalone``/``cadata`` pair) has: sex as **one numeric column** coded
  ``M = 1, F = 2, I = 3``, then z-scored like the other columns. That is the default
  (``sex="ordinal"``); ``sex="onehot"`` gives three 0/1 columns (``d = 10``, not z-scored, the
  textbook encoding of a nominal variable) and ``sex="drop"`` removes it (``d = 7``).
* ``"cadata"`` (alias ``"california_housing"``) -- StatLib California housing in scikit-learn's form,
  20,640 rows, ``d = 8`` features (MedInc, HouseAge, AveRooms, AveBedrms, Population, AveOccup,
  Latitude, Longitude). Reward: ``MedHouseVal``, the median house value of the block in units of
  $100,000 (capped at 5.00001 in the source data).

Standardization: features are z-scored with the population standard deviation (``ddof = 0``, like
scikit-learn's ``StandardScaler``). Rewards are z-scored too by default (``standardize_rewards=True``)
so that a constant ``β`` and ``λ = 0.2`` mean the same thing on both tables; the normalized regret
``R_T / R_unif`` is invariant to this affine change. Pass ``standardize_rewards=False`` for raw rings
or house values.

Example:
    >>> import torch
    >>> from torchbkb.datasets import load
    >>> arms, rewards = load("abalone")
    >>> tuple(arms.shape), tuple(rewards.shape), arms.dtype
    ((4177, 8), (4177,), torch.float64)
    >>> bool(arms.mean(0).abs().max() < 1e-10), bool((arms.std(0, unbiased=False) - 1).abs().max() < 1e-10)
    (True, True)
    >>> load("california_housing", dtype=torch.float32)[0].shape
    torch.Size([20640, 8])
"""

from __future__ import annotations

import csv
import functools
import gzip
from pathlib import Path

import numpy as np
import torch

from torchbkb.errors import InputDataError

__all__ = ["load", "DATASETS", "ABALONE_SEX_CODES"]

DATA_DIR = Path(__file__).resolve().parent / "data"

#: Canonical names and aliases accepted by :func:`load`.
DATASETS = {"abalone": "abalone", "cadata": "cadata", "california_housing": "cadata"}

#: LIBSVM's coding of Abalone's sex column (what gives the paper's ``d = 8``).
ABALONE_SEX_CODES = {"M": 1.0, "F": 2.0, "I": 3.0}

_SEX_MODES = ("ordinal", "onehot", "drop")


def load(
    name: str,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    standardize_rewards: bool = True,
    sex: str = "ordinal",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load a bundled table as an arm set.

    Args:
        name: ``"abalone"``, ``"cadata"`` or ``"california_housing"`` (case-insensitive).
        dtype: floating dtype of the returned tensors.
        device: device of the returned tensors (default CPU).
        standardize_rewards: z-score the rewards (default) or return the raw targets.
        sex: Abalone only -- ``"ordinal"`` (default, ``d = 8`` as in the paper), ``"onehot"``
            (``d = 10``) or ``"drop"`` (``d = 7``). See the module docstring.

    Returns:
        ``(arms, rewards)`` of shapes `(A, d)` and `(A,)`.

    Raises:
        InputDataError: unknown name, non-floating dtype or unknown ``sex`` mode.
    """
    key = DATASETS.get(str(name).lower()) if isinstance(name, str) else None
    if key is None:
        raise InputDataError(f"name: expected one of {sorted(DATASETS)}, got {name!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputDataError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    if sex not in _SEX_MODES:
        raise InputDataError(f"sex: expected one of {list(_SEX_MODES)}, got {sex!r}")
    if key == "abalone":
        X, y = _abalone(sex)
    else:
        X, y = _cadata()
    X = X.copy()
    if key == "abalone" and sex == "onehot":
        X[:, 3:] = _zscore(X[:, 3:])  # (A, 3 + 7): the one-hot block stays 0/1
    else:
        X = _zscore(X)  # (A, d)
    y = _zscore(y[:, None])[:, 0] if standardize_rewards else y.copy()
    return torch.as_tensor(X, dtype=dtype, device=device), torch.as_tensor(y, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------------- helpers
def _zscore(a: np.ndarray) -> np.ndarray:
    """Column-wise ``(a - mean) / std`` with ``ddof = 0``; `(n, k)` -> `(n, k)`."""
    std = a.std(axis=0)
    return (a - a.mean(axis=0)) / np.where(std > 0, std, 1.0)


@functools.cache
def _abalone(sex: str) -> tuple[np.ndarray, np.ndarray]:
    with open(DATA_DIR / "abalone.csv", newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1:]
    if header[0] != "sex" or header[-1] != "rings" or len(header) != 9:
        raise InputDataError(f"abalone.csv: expected columns sex, 7 measurements, rings, got {header}")
    codes = [r[0] for r in rows]
    meas = np.array([[float(v) for v in r[1:8]] for r in rows])  # (A, 7)
    rings = np.array([float(r[8]) for r in rows])  # (A,)
    if sex == "ordinal":
        X = np.column_stack([[ABALONE_SEX_CODES[c] for c in codes], meas])  # (A, 8)
    elif sex == "onehot":
        onehot = np.array([[c == k for k in ("M", "F", "I")] for c in codes], dtype=float)  # (A, 3)
        X = np.column_stack([onehot, meas])  # (A, 10)
    else:
        X = meas  # (A, 7)
    return X, rings


@functools.cache
def _cadata() -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(DATA_DIR / "california_housing.csv.gz", "rt", newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1:]
    if header[-1] != "MedHouseVal" or len(header) != 9:
        raise InputDataError(f"california_housing.csv.gz: expected 8 features then MedHouseVal, got {header}")
    data = np.array(rows, dtype=float)  # (A, 9)
    return data[:, :8], data[:, 8]
