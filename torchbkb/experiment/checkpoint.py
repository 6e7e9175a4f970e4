"""Checkpoint files of :func:`torchbkb.run`: written atomically, read with validation, versioned.

Writing: the state goes to a temporary file of a unique name beside the target (two writers never share
one), is flushed and ``fsync``-ed, then renamed over the target (``os.replace``, atomic on POSIX and
Windows) and the directory is ``fsync``-ed: a reader sees the previous checkpoint or the new one, whole,
even if the writer is killed or the machine loses power.

Reading: :func:`read_checkpoint` turns every way a file can be unusable into a
:class:`~torchbkb.errors.CheckpointError` (empty, truncated, not a torch file, not a torchbkb checkpoint,
an unknown format version) and loads tensors only (``weights_only=True``: a checkpoint cannot run code).
Whether it belongs to the bandit at hand (arms, kernel, noise, settings) is checked by the bandit's
``load_state_dict`` before anything is applied.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "run.ckpt")
    >>> save_checkpoint(path, {"bandit": {}, "history": {}, "objective": None, "batches": 0})
    >>> read_checkpoint(path)["version"] == FORMAT_VERSION
    True
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from torchbkb.errors import CheckpointError

__all__ = ["FORMAT", "FORMAT_VERSION", "check_checkpoint_path", "read_checkpoint", "save_checkpoint"]

#: the ``format`` field of every checkpoint torchbkb writes.
FORMAT = "torchbkb.run"
#: the current layout (1: before versions were recorded -- no format field, no fingerprint).
FORMAT_VERSION = 2


def check_checkpoint_path(path: str | os.PathLike) -> Path:
    """Fail before any evaluation if ``path`` cannot be written: its directory must exist and take a new
    file (probed with a temporary file), and ``path`` must not be a directory."""
    p = Path(os.fspath(path))
    if p.is_dir():
        raise CheckpointError(f"checkpoint: expected a file path, got the directory {str(p)!r}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise CheckpointError(f"checkpoint: expected a path in an existing directory, got {str(p)!r} (no directory "
                              f"{str(parent)!r})")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CheckpointError(f"checkpoint: expected a writable directory, got {str(parent)!r} ({e})") from e
    return p


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write ``payload`` (plus ``format`` and ``version``) to ``path`` atomically and durably."""
    p = Path(os.fspath(path))
    parent = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)  # unique per writer
    except OSError as e:  # the directory went away or became read-only during the run
        raise CheckpointError(f"checkpoint: expected a writable directory, got {str(parent)!r} ({e}); the previous "
                              f"checkpoint, if any, is intact") from e
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, "version": FORMAT_VERSION, **payload}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(parent)


def read_checkpoint(path: str | os.PathLike, fields: tuple[str, ...] = ("bandit", "history")) -> dict[str, Any]:
    """The checkpoint at ``path``, checked for its format and version (a version-1 file is accepted as it is) and
    for the dict ``fields`` its writer keeps (a run's bandit and history; a trust-region loop's state).

    Raises:
        CheckpointError: empty, truncated or foreign file, or an unknown version.
    """
    p = Path(os.fspath(path))
    try:
        size = p.stat().st_size
    except OSError as e:
        raise CheckpointError(f"checkpoint: expected a readable file, got {str(p)!r} ({e})") from e
    if size == 0:
        raise CheckpointError(f"checkpoint: expected a torchbkb checkpoint, got an empty file {str(p)!r}")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError, zipfile.BadZipFile, pickle.UnpicklingError, OSError, ValueError, TypeError,
            AttributeError) as e:
        raise CheckpointError(f"checkpoint: expected a torchbkb checkpoint, got a file that cannot be read "
                              f"({type(e).__name__}: {str(e)[:200]})") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint: expected a torchbkb checkpoint (a dict), got {type(state).__name__}")
    if "format" not in state and {"bandit", "history"} <= state.keys():
        state = {**state, "format": FORMAT, "version": 1}
    if state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint: expected format {FORMAT!r}, got {state.get('format')!r}")
    if state.get("version") not in (1, FORMAT_VERSION):
        raise CheckpointError(f"checkpoint: expected format version <= {FORMAT_VERSION}, got {state.get('version')!r} "
                              f"(written by a newer torchbkb?)")
    for key in fields:
        if not isinstance(state.get(key), dict):
            raise CheckpointError(f"checkpoint: expected a field {key!r} (a dict), got {type(state.get(key)).__name__}")
    batches = state.get("batches", 0)
    if not isinstance(batches, int) or isinstance(batches, bool) or batches < 0:
        raise CheckpointError(f"checkpoint: expected batches as an integer >= 0, got {batches!r}")
    return state


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened; the rename is durable enough there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
