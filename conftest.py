"""Test-session settings for the whole repository (tests/ and the doctests under torchbkb/).

The suite multiplies tiny matrices (m of a few tens); torch's intra-op thread pool only adds
synchronization overhead there, and on a busy 2-core machine oversubscription slows such calls by
10-100x. The session therefore runs single-threaded. This is a property of the test harness, not of
the library: torchbkb itself never changes global torch settings.
"""

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _single_threaded_session():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
