"""``optimus.tools.measure.peak_step_memory_cuda`` on a CUDA GPU.  Marked ``gpu``."""

import pytest
import torch

from optimus.tools import measure

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_step_memory_excludes_what_was_live_before():
    dev = torch.device("cuda")
    held = torch.empty(64 << 20, dtype=torch.uint8, device=dev)  # 64 MiB live before the step
    x = torch.ones(1 << 20, device=dev)

    def step():
        y = x * 2  # 4 MiB temporary
        z = y + 1  # 4 MiB more, while y lives
        return float(z.sum())

    own, total = measure.peak_step_memory_cuda(step, dev)
    mib = 1 << 20
    assert 8 * mib <= own < 10 * mib  # the two temporaries (+ the 1-element sum, rounded up)
    assert total >= own + held.numel()  # the total also counts the 64 MiB buffer and x
