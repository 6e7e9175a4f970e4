"""Every Sphinx-style cross-reference in torchbkb's docstrings (``:class:`~torchbkb.gp.kernels.GaussianKernel```,
``:func:``, ``:mod:``, ...) names an object that exists at that path -- the path where it lives, not one of the
old module paths kept for compatibility (:mod:`torchbkb.legacy_paths`)."""

import importlib
import re
from pathlib import Path

from torchbkb.legacy_paths import MOVED

PKG = Path(__file__).resolve().parents[2] / "torchbkb"
REFERENCE = re.compile(r":(?:class|func|meth|mod|data|attr|exc):`~?(torchbkb(?:\.\w+)+)`")


def _resolves(path: str) -> bool:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_cross_reference_names_an_object_where_it_lives():
    refs = {(f.relative_to(PKG.parent), m.group(1))
            for f in PKG.rglob("*.py") for m in REFERENCE.finditer(f.read_text())}
    assert len(refs) > 100  # the pattern finds the references
    old = [f"{f}: {r}" for f, r in sorted(refs) if any(r == o or r.startswith(o + ".") for o in MOVED)]
    assert not old, "references through an old module path:\n" + "\n".join(old)
    missing = [f"{f}: {r}" for f, r in sorted(refs) if not _resolves(r)]
    assert not missing, "references to nothing:\n" + "\n".join(missing)
