"""Shared test configuration.

Tests use one torch thread: the models under test are tiny, and on a 2-core machine a second thread
only adds synchronisation (measured ~100x slower for tiny forwards under load). Tests that need a
specific thread count set it themselves.
"""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
