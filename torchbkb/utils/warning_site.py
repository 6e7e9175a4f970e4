"""Where a library warning points: the first frame outside torchbkb (and ``nn.Module``'s call), the user's line.

A fixed ``stacklevel`` names the user's line from one call path only; the bandits reach the same check from ``tell``,
``ask`` (a deferred update), ``torchbkb.run`` and a checkpoint's resume, at different depths.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warnings.warn("here", stacklevel=outside_stacklevel())
    >>> caught[0].filename.endswith("warning_site.py")
    False
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import torch.nn.modules.module

__all__ = ["LIBRARY_FILES", "PACKAGE_DIR", "outside_stacklevel"]

#: the installed package's folder, with its separator: frames of files under it are the library's.
PACKAGE_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
#: the files whose frames are passed over: torchbkb's (as resolved and as imported), and ``nn.Module.__call__``'s
#: (``post(X)`` runs ``forward``).
LIBRARY_FILES = (PACKAGE_DIR, str(Path(__file__).parents[1]) + os.sep, torch.nn.modules.module.__file__)


def outside_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` in the function that calls this one that names the first frame
    outside :data:`LIBRARY_FILES` (1, that function's own line, when it is outside)."""
    here = inspect.currentframe()
    frame, level = (here.f_back if here is not None else None), 1  # the caller, the one that warns
    while frame is not None and frame.f_code.co_filename.startswith(LIBRARY_FILES):
        frame, level = frame.f_back, level + 1
    return level
