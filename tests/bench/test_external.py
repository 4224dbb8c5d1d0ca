"""External models (TorchRec, Hugging Face) through the bench: parity, rewrites, bad input.

Each model's small config is compiled once, for a training step under ``optimus`` (the
forward and the backward graph), and judged against eager fp32/fp64 by the zoo's rule.
A model whose library is not installed is skipped with the reason and the extra to
install (``optimus.tools.bench.external.unavailable``).
"""

from __future__ import annotations

import json

import pytest
import torch

from optimus.tools.bench import accuracy, cli, external, harness, results

FAST = ["--device", "cpu", "--size", "small", "--iters", "2", "--warmup", "0", "--warm-cache"]
# Rules that only tidy a graph; a rewrite that changes the computation is something else.
HOUSEKEEPING = {"dead_code_elimination"}
# One Hugging Face and one TorchRec model by default (each compile takes 15-20 s on 2 cores);
# the others run with -m slow.
DEFAULT_COMPILED = {"hf_bert", "torchrec_dlrm"}
COMPILED = [pytest.param(n, marks=() if n in DEFAULT_COMPILED else pytest.mark.slow) for n in external.EXTERNAL]


def needs(name: str) -> None:
    problem = external.unavailable(name)
    if problem:
        pytest.skip(f"{name}: {problem}")


@pytest.fixture(scope="module")
def optimus_train_rows() -> dict[str, dict]:
    """Rows filled in lazily: one optimus training row per model, compiled at most once."""
    return {}


def optimus_train_row(name: str, cache: dict[str, dict]) -> dict:
    if name not in cache:
        opts = harness.BenchOptions(device="cpu", size="small", iters=2, warmup=0, cold=False)
        ref = harness.eager_reference(name, "train", opts)
        cache[name] = harness.run_config(name, "train", "optimus", opts, ref)
    return cache[name]


@pytest.mark.parametrize("name", list(external.EXTERNAL))
def test_builds_deterministically_and_trains_in_eager(name: str) -> None:
    needs(name)
    a, b = (external.get_bench_model(name, "small", seed=3) for _ in range(2))
    for (na, pa), (nb, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert na == nb and torch.equal(pa, pb), na
    out = a.model(*a.inputs)
    assert out.shape[0] == a.batch_size and torch.isfinite(out).all()
    loss = a.loss(out)
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert all(p.grad is not None for p in a.model.parameters() if p.requires_grad)
    # the fp64 reference runs the same function in fp64 (KeyedJaggedTensor inputs pass through)
    model64, inputs64 = accuracy.fp64_copy(b.model, b.inputs)
    out64 = model64(*inputs64)
    assert out64.dtype == torch.float64
    assert torch.allclose(out64.float(), out.detach(), atol=1e-4, rtol=1e-4)
    assert torch.allclose(b.exact_loss(out64).float(), loss.detach(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", COMPILED)
def test_optimus_training_step_matches_eager(name: str, optimus_train_rows: dict[str, dict]) -> None:
    needs(name)
    row = optimus_train_row(name, optimus_train_rows)
    assert row["status"] == "ok", row["error"]
    parity = row["parity"]
    assert parity["ok"], parity["failed"]
    assert parity["tensors"] > 1 and parity["grads_missing"] == 0  # output and every parameter gradient judged
    assert row["optimus_errors"] == []
    assert row["kernels"] > 0 and row["step_ms"] > 0


@pytest.mark.parametrize("name", COMPILED)
def test_optimus_rewrites_them(name: str, optimus_train_rows: dict[str, dict]) -> None:
    needs(name)
    row = optimus_train_row(name, optimus_train_rows)
    assert row["status"] == "ok", row["error"]
    rewrites = {rule: n for rule, n in row["optimus_rules"].items() if rule not in HOUSEKEEPING}
    assert sum(rewrites.values()) > 0, row["optimus_rules"]


def test_suites_and_names() -> None:
    assert external.suite_models("external") == list(external.EXTERNAL)
    assert set(external.suite_models("all")) == set(external.suite_models("zoo")) | set(external.EXTERNAL)
    assert not set(external.suite_models("zoo")) & set(external.EXTERNAL)
    with pytest.raises(ValueError, match="suite"):
        external.suite_models("torchbench")
    available = [name for name in external.EXTERNAL if not external.unavailable(name)]
    if available:  # without either extra installed there is no external model to ask
        with pytest.raises(ValueError, match="unknown size"):
            external.get_bench_model(available[0], "huge")


def _pretend_missing(monkeypatch: pytest.MonkeyPatch, *packages: str) -> None:
    real = external.unavailable

    def fake(name: str, device: str = "cpu") -> str | None:
        spec = external.EXTERNAL.get(name)
        if spec is not None and spec.package in packages:
            return f"{spec.package} is not installed; install it with {external.install_hint(spec.extra)}"
        return real(name, device)

    monkeypatch.setattr(external, "unavailable", fake)


def test_external_suite_without_the_extras_is_a_clear_error(monkeypatch, capsys) -> None:
    _pretend_missing(monkeypatch, "torchrec", "transformers")
    assert cli.main(["--suite", "external", "--mode", "infer", *FAST]) == 2
    err = capsys.readouterr().err
    assert "none of the models asked for can run here" in err
    assert "torchrec_dlrm: torchrec is not installed; install it with pip install --no-deps torchrec==1.8.0" in err
    assert 'then pip install -e ".[torchrec]"' in err
    assert 'hf_gpt2: transformers is not installed; install it with pip install -e ".[hf]"' in err
    with pytest.raises(ModuleNotFoundError, match=r"\.\[hf\]"):
        external.get_bench_model("hf_gpt2")


def test_missing_library_gives_a_skipped_line_and_the_rest_runs(monkeypatch, tmp_path, capsys) -> None:
    _pretend_missing(monkeypatch, "transformers")
    path = tmp_path / "r.json"
    rc = cli.main(["--model", "dlrm,hf_bert", "--mode", "infer", "--configs", "eager", "--json", str(path),
                   "--quiet", *FAST])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "hf_bert  infer  eager" in out
    assert 'skipped: transformers is not installed; install it with pip install -e ".[hf]"' in out
    assert "skipped (not available here): hf_bert" in err
    data = results.load(str(path))
    assert results.validate(data) == []
    assert data["rows"]["dlrm/infer/eager"]["status"] == "ok"
    assert data["rows"]["hf_bert/infer/eager"]["status"] == "skipped"
    # a skipped line never replaces a measured row of the same key
    measured = dict(data["rows"]["hf_bert/infer/eager"], status="ok", error=None, step_ms=1.0)
    data["rows"]["hf_bert/infer/eager"] = measured
    results.save(str(path), data)
    assert cli.main(["--model", "dlrm,hf_bert", "--mode", "infer", "--configs", "eager", "--json", str(path),
                     "--quiet", *FAST]) == 0
    assert results.load(str(path))["rows"]["hf_bert/infer/eager"]["status"] == "ok"


def test_json_file_and_stdout_carry_no_progress_output(tmp_path, capsys) -> None:
    """Progress (tqdm or the plain lines) and notes go to stderr; stdout is the table alone
    and the --json file is plain JSON, with an external model's rows in it."""
    name = next((n for n in external.EXTERNAL if not external.unavailable(n)), None)
    if name is None:
        pytest.skip("no external library installed")
    path = tmp_path / "r.json"
    assert cli.main(["--model", f"dlrm,{name}", "--mode", "infer", "--configs", "eager", "--json", str(path),
                     *FAST]) == 0
    out, err = capsys.readouterr()
    text = path.read_text()
    data = json.loads(text)
    assert set(data["rows"]) == {"dlrm/infer/eager", f"{name}/infer/eager"}
    assert all(r["status"] == "ok" for r in data["rows"].values())
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["model", "mode", "config"] and set(lines[1]) <= {"-", " "}
    assert [ln.split()[0] for ln in lines[2:]] == ["dlrm", name]  # nothing but the table
    assert "results merged into" in err and "results merged into" not in out
    assert "results merged into" not in text and "it/s" not in text and "[1/" not in text


def test_list_names_external_models(capsys) -> None:
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in external.EXTERNAL:
        assert name in out


def test_import_problems_are_described_not_raised(tmp_path, monkeypatch) -> None:
    assert external._import_problem(("optimus_no_such_package.models",)) == "optimus_no_such_package is not installed"
    broken = tmp_path / "optimus_broken_package"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise OSError('undefined symbol: _ZN3c10')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    problem = external._import_problem(("optimus_broken_package",))
    assert problem == "optimus_broken_package failed to import: OSError: undefined symbol: _ZN3c10"
    assert external._fbgemm_device_problem("cpu") is None
