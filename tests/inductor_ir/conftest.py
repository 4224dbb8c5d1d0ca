"""Fixtures of the Inductor-IR tests. (Nothing is imported at module level: pytest loads this
file before the root conftest's ``pytest_configure`` gives the session its own Inductor cache
when tests/inductor_ir is named on the command line, and importing Inductor here would fix
the cache directory to the shared default first.)"""

from __future__ import annotations

import pytest


@pytest.fixture
def fake_gpu():
    """Inductor's Triton backend on the CPU, scheduling as for an H200 (``fake_gpu_on_cpu``)."""
    from inductor_ir_support import FakeGpuUnsupported, fake_gpu_on_cpu

    try:
        with fake_gpu_on_cpu():
            yield
    except FakeGpuUnsupported as e:
        pytest.skip(str(e))
