"""The device probe on a CUDA GPU.  Marked ``gpu``."""

import pytest
import torch

from optimus.planner import costmodel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_probe_leaves_little_allocated():
    """What the probe leaves allocated is at most one side stream's cuBLAS workspaces (H200,
    torch 2.11: 64 MiB; a fresh stream per probe matmul would leave 128 MiB)."""
    dev = torch.device("cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(dev)
    p = costmodel.probe(dev, repeats=3)
    torch.cuda.synchronize()
    left = torch.cuda.memory_allocated(dev) - before
    assert p.launch_us > 0 and p.bandwidth_gbps > 0
    assert left <= 72 * 2**20, f"{left / 2**20:.1f} MiB left allocated"
    # a second probe reuses the stream: nothing more is left
    costmodel.probe(dev, repeats=3)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(dev) - before <= left + 2**20
