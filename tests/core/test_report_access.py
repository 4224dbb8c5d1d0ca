"""The report is reachable from every entry point, and never a stale one."""

import torch

import optimus


def _model():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())


def test_compile_does_not_leave_its_report_on_the_users_module():
    model, x = _model(), torch.randn(2, 8)
    first = optimus.compile(model)
    first(x)
    assert first.optimus_report is optimus.last_report() and first.optimus_report.graphs
    assert "optimus_report" not in vars(model) and not hasattr(model, "optimus_report")
    # torch.compile's wrapper forwards attribute reads to the model: a report left there
    # would read back as the report of the next compile of the same model
    torch._dynamo.reset()
    second = torch.compile(model, backend="optimus")
    second(torch.randn(3, 8))
    assert not hasattr(second, "optimus_report")
    fresh = optimus.last_report()
    assert fresh is not first.optimus_report and fresh.graphs
    # each optimus.compile has its own report on its own compiled object
    torch._dynamo.reset()
    third = optimus.compile(model, passes="vertical")
    third(x)
    assert third.optimus_report is not first.optimus_report and third.optimus_report.passes == "vertical"
    assert first.optimus_report.passes == "auto"


def test_a_backend_of_ones_own_carries_its_report():
    model = _model()
    backend = optimus.make_backend("all")
    compiled = torch.compile(model, backend=backend)
    compiled(torch.randn(2, 8))
    assert backend.report is backend.session.report and backend.report.graphs
    assert optimus.last_report() is backend.report
