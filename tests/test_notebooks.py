"""The notebooks under ``notebooks/`` are committed without outputs (they are executed by nbmake, see
CONTRIBUTING.md) and are device-agnostic."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_notebooks_found():
    assert len(NOTEBOOKS) >= 3, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{path.name}: expected code cells, got none"
    with_outputs = [i for i, c in enumerate(code) if c.get("outputs") or c.get("execution_count") is not None]
    assert not with_outputs, (f"{path.name}: expected no outputs, got outputs in code cells {with_outputs} (clear them "
                              "before committing)")
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", f"{path.name}: expected the python3 kernel"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_picks_cuda_when_available(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert 'torch.device("cuda" if torch.cuda.is_available() else "cpu")' in "".join(first_code["source"]), path.name
