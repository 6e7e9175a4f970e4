"""Write the API reference (``docs/api/*.md``) from the public names' docstrings.

One page per public package: every name in its ``__all__`` with its signature and docstring, and for a class its
public methods and properties. Run from the repository root after changing a public docstring or signature
(``tests/docs/test_api_reference.py`` fails while a page is out of date)::

    python docs/api_reference.py
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "api"
GENERATED = "Generated from the docstrings by `python docs/api_reference.py`."
VERSIONS = "Rendered with"
PACKAGES = {
    "torchbkb": "The core: kernels, Nyström embedding, DTC and exact posteriors, RLS dictionaries, bandits, runs.",
    "torchbkb.gp": "The GP layer: kernels, the Nyström embedding, the DTC and exact posteriors.",
    "torchbkb.sampling": "Dictionary sampling: RLS resampling, recursive RLS, BKB's sampling replayed on a training "
    "set.",
    "torchbkb.bandits": "Bandit algorithms: BKB, BBKB, GP-UCB, GP-BUCB, S-BPE and the simple baselines.",
    "torchbkb.botorch": "BoTorch: the `BKBModel`, its evidence bound, acquisitions, batches, trust regions.",
    "torchbkb.gpytorch": "GPyTorch: the DTC posterior as an `ApproximateGP` and its variational strategy.",
    "torchbkb.online": "Online kernel regression: PKAWV and its baselines.",
    "torchbkb.datasets": "The bundled arm sets and synthetic problems.",
}


def versions() -> str:
    """The versions the pages depend on (signatures and annotations render differently across them)."""
    import botorch
    import gpytorch
    import torch

    minor = lambda v: ".".join(v.split("+")[0].split(".")[:2])  # noqa: E731
    return ", ".join(f"{m.__name__} {minor(m.__version__)}" for m in (torch, botorch, gpytorch))


def signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return re.sub(r" at 0x[0-9a-f]+", "", sig)  # default values' addresses change from run to run


def doc(obj) -> str:
    """The object's own docstring (never a base class's: BoTorch's and GPyTorch's change with their versions)."""
    own = isinstance(obj, property) or inspect.isroutine(obj) or inspect.isclass(obj) or inspect.ismodule(obj)
    text = obj.__doc__ if own else None
    return inspect.cleandoc(text) if text else "*(no docstring)*"


@functools.cache
def documented() -> tuple:
    """The objects every page lists (a base class among them has its own entry); collected once."""
    return tuple(getattr(m, n) for m in map(importlib.import_module, PACKAGES) for n in m.__all__)


def members(cls) -> list[tuple[str, object]]:
    """The public methods and properties a class (or a mixin of torchbkb it derives from, documented nowhere else)
    defines with a docstring of its own (an override without one, such as ``extra_repr`` or ``forward`` under a
    documented ``__call__``, is PyTorch's protocol, not this API)."""
    out, seen = [], set()
    own, listed = [cls], documented()
    for base in cls.__mro__[1:]:  # up to the first base with an entry of its own, which lists the rest
        if any(base is obj for obj in listed):
            break
        if base.__module__.startswith("torchbkb"):
            own.append(base)
    for name, value in ((n, v) for c in own for n, v in vars(c).items()):
        if (name.startswith("_") and name != "__call__") or name in seen:
            continue
        seen.add(name)
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if (inspect.isfunction(value) or isinstance(value, property)) and value.__doc__:
            out.append((name, value))
    return out


def entry(qualname: str, obj) -> list[str]:
    if inspect.isclass(obj):
        lines = [f"### class `{qualname}{signature(obj)}`", "", doc(obj), ""]
        for name, member in members(obj):
            if isinstance(member, property):
                lines += [f"#### property `{name}`", "", doc(member), ""]
            else:
                lines += [f"#### `{name}{signature(member)}`", "", doc(member), ""]
        return lines
    if callable(obj):
        return [f"### `{qualname}{signature(obj)}`", "", doc(obj), ""]
    if inspect.ismodule(obj):
        return [f"### module `{obj.__name__}`", "", doc(obj).split("\n\n")[0], ""]
    return [f"### `{qualname}`", "", f"A constant: `{obj!r}`."[:300], ""]


def page(package: str) -> str:
    module = importlib.import_module(package)
    lines = [f"# `{package}`", "", PACKAGES[package], "", GENERATED, ""]
    for name in module.__all__:
        lines += entry(f"{package}.{name}", getattr(module, name))
    return "\n".join(lines).rstrip() + "\n"


def pages() -> dict[str, str]:
    """``{file name: markdown}`` of every page, the index included."""
    out = {f"{p}.md": page(p) for p in PACKAGES}
    index = ["# API reference", "", GENERATED, "", f"{VERSIONS} {versions()}.", ""]
    index += [f"- [`{p}`]({p}.md) -- {text}" for p, text in PACKAGES.items()]
    out["README.md"] = "\n".join(index) + "\n"
    return out


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, text in pages().items():
        (OUT / name).write_text(text)
    print(f"wrote {len(PACKAGES) + 1} pages to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
