"""Where a step's time goes (``optimus.tools.measure.time_split``, ``optimus bench --time-split``)."""

from __future__ import annotations

import torch

from optimus.tools import measure


def _training_step():
    torch._dynamo.reset()
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model)
    x = torch.randn(8, 16)

    def step():
        opt.zero_grad(set_to_none=True)
        compiled(x).sum().backward()
        opt.step()

    return step


def test_a_compiled_training_step_splits_into_its_parts():
    split = measure.time_split(_training_step(), "cpu", steps=4)
    host = split["host_ms"]
    assert set(host) == set(measure.SPLIT_PARTS)
    assert all(v >= 0 for v in host.values())
    # the compiled forward and backward, their wrappers and the optimizer all ran in the step
    assert host["graphs"] > 0 and host["compiled_wrappers"] > 0 and host["optimizer"] > 0
    assert split["wall_ms"] > 0 and split["device_busy_ms"] == 0.0  # no GPU here
    # medians of per-step parts: each part is at most a step (with rounding)
    assert max(host.values()) <= split["wall_ms"] * 1.01


# The bench's own use (rows of every configuration, the workers, the report): tests/bench/test_bench.py.
