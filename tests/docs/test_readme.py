"""The README's examples run as written (each Python block, in a fresh namespace, in a scratch directory)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_four_examples():
    assert len(BLOCKS) == 4  # the core, BoTorch, high-throughput BO, a bandit loop


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the bandit loop writes its checkpoint here
    exec(compile(BLOCKS[i], f"README.md block {i}", "exec"), {"__name__": "readme"})
