import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


def pytest_configure(config):
    # An Inductor cache of this session's own: results never depend on what earlier runs
    # left in ~/.cache (or /tmp), and CI starts cold like a fresh machine.
    import tempfile

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="optimus-tests-inductor-"))
    # Likewise the planner's decision and profile cache: a plan tuned by one test run (or by
    # the user) must not answer for the next ("auto", the default, tunes under max-autotune).
    os.environ.setdefault("OPTIMUS_CACHE_DIR", tempfile.mkdtemp(prefix="optimus-tests-cache-"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# passes="auto" plans from the device profile; a probe on a shared CI machine is noisy, so
# tests plan from the documented defaults (tests/planner probe explicitly).
os.environ.setdefault("OPTIMUS_DEVICE_PROFILE", "defaults")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()

# The rules that emit our custom ops decline on CPU tensors by default (their CPU path is a
# slow plain-torch reference: optimus/rules/_facts.py); the tests check those rewrites on the
# CPU, so they run them (tests/rules/test_grouped_kernels.py checks the default decline).
os.environ.setdefault("OPTIMUS_KERNEL_RULES_ON_CPU", "1")
