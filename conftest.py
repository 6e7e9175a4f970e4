"""Test-session settings for the whole repository (tests/, the doctests under torchbkb/, notebooks/).

The suite multiplies tiny matrices (m of a few tens); torch's intra-op thread pool only adds
synchronization overhead there, and on a busy 2-core machine oversubscription slows such calls by
10-100x. The session therefore runs single-threaded. This is a property of the test harness, not of
the library: torchbkb itself never changes global torch settings.

The notebooks (``--nbmake`` in ``pyproject.toml``) execute in Jupyter kernels, separate processes whose
working directory is ``notebooks/``. They inherit the environment, but a relative ``PYTHONPATH`` such as
``PYTHONPATH=. python -m pytest`` (a checkout without ``pip install -e .``) would be resolved from
``notebooks/`` there. :func:`pytest_configure` makes the entries absolute and puts first the directory
this session imports ``torchbkb`` from, so the kernels import the same ``torchbkb`` as the tests; with an
installed package (CI) that is the installed one. (The kernels' thread count is not changed.)
"""

import importlib.util
import os
from pathlib import Path

import pytest
import torch


def pytest_configure(config):
    spec = importlib.util.find_spec("torchbkb")  # locates the package without importing it
    entries = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if spec is not None and spec.origin is not None:
        entries.insert(0, str(Path(spec.origin).resolve().parents[1]))  # the directory containing the package
    if entries:
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entries))  # de-duplicated, order kept


@pytest.fixture(scope="session", autouse=True)
def _single_threaded_session():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
