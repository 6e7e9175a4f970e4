"""Every module path from before the package was grouped by layer still imports, as the very module at its new
path: names import from it, pickles that name it load, and a patch through it reaches the code that runs."""

import importlib
import pickle
import subprocess
import sys

import pytest
import torch

import torchbkb
from torchbkb.legacy_paths import MOVED, install


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_new_module(old):
    module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__name__ == MOVED[old]
    assert module.__spec__.name == MOVED[old]  # the alias leaves the module's own spec
    public = getattr(module, "__all__", [])
    assert public, f"{MOVED[old]}: expected an __all__ to check, got none"
    exec(f"from {old} import {', '.join(public)}", {})


def test_old_paths_in_a_fresh_interpreter():
    # the import style matters where the parent is a package: `import a.b.c as m` reads the attribute of a.b
    lines = [f"import {old} as m\nassert m is sys.modules[{new!r}] and m.__spec__.name == {new!r}" for old,
             new in MOVED.items()]
    code = "import sys\n" + "\n".join(lines) + "\nprint('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.strip() == "ok"


def test_pickle_under_an_old_path_loads():
    kernel = torchbkb.GaussianKernel(0.5)
    data = pickle.dumps(kernel, protocol=0).replace(b"torchbkb.gp.kernels", b"torchbkb.kernels")
    assert b"torchbkb.kernels\n" in data
    loaded = pickle.loads(data)
    X = torch.rand(5, 2, dtype=torch.float64)
    assert type(loaded) is torchbkb.GaussianKernel
    torch.testing.assert_close(loaded(X, X), kernel(X, X), rtol=0, atol=0)


def test_patch_through_an_old_path_reaches_the_code(monkeypatch):
    import torchbkb.confidence as old

    monkeypatch.setattr(old, "bkb_beta", lambda *a, **k: 123.0)
    from torchbkb.bandits import confidence

    assert confidence.bkb_beta() == 123.0


def test_install_is_idempotent():
    before = list(sys.meta_path)
    install()
    install()
    assert sys.meta_path == before


def test_unknown_old_path_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("torchbkb.no_such_module")
