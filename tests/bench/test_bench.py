"""``optimus bench`` on CPU: the JSON it writes, the table, the report, and bad input."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest
import torch

from optimus.tools.bench import accuracy, cli, configs, harness, parallel, report, results

# Bench runs compile every configuration; keep them on the smallest graph and few steps.
MODEL = "dlrm"
FAST = ["--device", "cpu", "--size", "small", "--iters", "3", "--warmup", "1", "--quiet"]

try:
    import optimus

    HAVE_OPTIMUS_COMPILE = callable(getattr(optimus, "compile", None))
except ImportError:  # pragma: no cover
    HAVE_OPTIMUS_COMPILE = False


@pytest.fixture(scope="module")
def optimus_mode_problem() -> str | None:
    """Why optimus.compile cannot take mode="reduce-overhead" here (None: it can)."""
    if not HAVE_OPTIMUS_COMPILE:
        pytest.skip("optimus.compile is not available yet")
    return configs.optimus_mode_unsupported()


@pytest.fixture(scope="module")
def infer_configs(optimus_mode_problem: str | None) -> list[str]:
    return [c for c in configs.CONFIG_NAMES if not (c == "optimus-cudagraphs" and optimus_mode_problem)]


@pytest.fixture(scope="module")
def infer_json(tmp_path_factory: pytest.TempPathFactory, infer_configs: list[str]) -> dict:
    """One bench run over every configuration (inference) through two worker processes,
    shared by the checks below."""
    path = tmp_path_factory.mktemp("bench") / "results.json"
    # --warm-cache: every graph is still compiled with its configuration's passes, but
    # compiled C++ kernels and headers are reused (cold caches cost minutes on CI's CPU).
    rc = cli.main(["--model", MODEL, "--mode", "infer", "--configs", ",".join(infer_configs), "--json", str(path),
                   "--warm-cache", "--workers", "2", "--repeats", "2", "--time-split", *FAST])
    data = json.loads(path.read_text())
    data["_rc"] = rc
    return data


def test_every_configuration_present_and_valid(infer_json: dict, infer_configs: list[str]) -> None:
    assert results.validate(infer_json) == []
    keys = set(infer_json["rows"])
    assert keys == {f"{MODEL}/infer/{c}" for c in infer_configs}
    for row in infer_json["rows"].values():
        assert row["status"] == "ok", row["error"]
        assert isinstance(row["kernels"], int) and row["kernels"] > 0
        assert row["step_ms"] > 0 and row["examples_per_s"] > 0
        assert row["peak_memory_bytes"] > 0
        assert row["batch_size"] == 32
        assert row["env"]["torch"] == torch.__version__ and row["env"]["device"] == "cpu"
        assert row["command"].startswith("optimus bench") and "--warm-cache" in row["command"]
        assert "--workers 2" in row["command"] and "--repeats 2" in row["command"]
        assert row["cold_compile"] is False
    assert infer_json["_rc"] == 0
    assert infer_json["commands"]


def test_workers_shared_one_reference_and_recorded_it(infer_json: dict) -> None:
    rows = list(infer_json["rows"].values())
    assert {r["workers"] for r in rows} == {2}
    assert {r["worker"] for r in rows} == {0, 1}  # both workers ran rows
    assert all(r["compile_threads"] >= 1 for r in rows)
    assert all(r["timed_lock_wait_s"] >= 0 for r in rows)
    # the eager references of dlrm/infer were made once, by one worker, and loaded by the other
    sources = sorted(r["reference"] for r in rows)
    assert sources.count("computed") == 1 and sources.count("loaded") == 1, sources
    # repeats: two medians per row, the row's figure their median, the spread stated
    for r in rows:
        assert len(r["step_ms_repeats"]) == 2 and r["repeats"] == 2
        assert min(r["step_ms_repeats"]) <= r["step_ms"] <= max(r["step_ms_repeats"])
        assert r["step_ms_spread"] >= 0


def test_cudagraph_configurations_on_cpu(infer_json: dict, optimus_mode_problem: str | None) -> None:
    row = infer_json["rows"][f"{MODEL}/infer/inductor-cudagraphs"]
    assert row["status"] == "ok" and row["cudagraphs"] == "n/a on cpu" and row["parity"]["ok"]
    assert "cudagraphs" not in infer_json["rows"][f"{MODEL}/infer/inductor"]
    if optimus_mode_problem:
        pytest.skip(f"optimus-cudagraphs not run: {optimus_mode_problem}")
    row = infer_json["rows"][f"{MODEL}/infer/optimus-cudagraphs"]
    assert row["status"] == "ok" and row["cudagraphs"] == "n/a on cpu" and row["parity"]["ok"]
    assert row["optimus_rules"], "optimus-cudagraphs ran without Optimus's rules"


def test_parity_and_compile_times(infer_json: dict) -> None:
    rows = infer_json["rows"]
    for config, row in ((k.split("/")[-1], v) for k, v in rows.items()):
        assert row["parity"]["ok"], (config, row["parity"])
        assert row["parity"]["rule"] == accuracy.RULE and row["parity"]["tol"] == 1e-4
        if config == "eager":
            assert row["parity"]["passed_allclose"] == row["parity"]["tensors"]
            assert row["parity"]["out_max_abs"] == 0.0
            assert row["compile_s"] == 0.0
        else:
            assert row["compile_s"] > 0.0
    assert isinstance(rows[f"{MODEL}/infer/optimus"].get("optimus_rules"), dict)
    up = rows[f"{MODEL}/infer/upstream"]["upstream_options"]
    assert "batch_linear" in up["pre_grad"] and "split_cat_pass" in up["pre_grad"]
    assert "group_linear" not in up["post_grad"]  # needs fbgemm


def test_report_renders(infer_json: dict, tmp_path) -> None:
    data = {k: v for k, v in infer_json.items() if k != "_rc"}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    text = report.render(results.load(str(path)))
    assert "### Inference" in text and "| dlrm | optimus |" in text
    assert torch.__version__ in text
    assert "| vs inductor-cudagraphs |" in text and "| dlrm | inductor-cudagraphs (n/a on cpu) |" in text
    assert "torch._dynamo.utils.same" in text and "2 concurrent worker processes" in text
    assert "| dlrm | eager |" in text and "ok (allclose) |" in text
    # --time-split reached the workers: every row says where its step time went
    assert all(set(r["time_split"]["host_ms"]) >= {"graphs", "other"} for r in data["rows"].values())
    assert "### Where the step time goes" in text and "| dlrm | infer | optimus |" in text
    table = results.format_table(data)
    assert all(r["config"] in table for r in data["rows"].values())
    assert rows_without_fallbacks(data) and "safety net" not in text
    key = f"{MODEL}/infer/optimus"
    data["rows"][key]["optimus_fallbacks"] = ["aten_ir inference 0: the first call raised; compiled again without any Optimus pass"]
    assert f"**{key}**: the safety net compiled a graph again" in report.render(data)


def rows_without_fallbacks(data: dict) -> bool:
    return all(not r.get("optimus_fallbacks") for r in data["rows"].values())


def test_plot(infer_json: dict, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from optimus.tools.bench import plot

    out = tmp_path / "bench.png"
    plot.plot({k: v for k, v in infer_json.items() if k != "_rc"}, str(out))
    assert out.stat().st_size > 1000


def test_train_rows_merge_into_existing_file(tmp_path) -> None:
    """A second, partial run (training, two configurations) merges into the same JSON."""
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(results.merge(results.empty(), [_fake_row("towers32", "infer", "eager")], "x")))
    cfgs = "eager,optimus" if HAVE_OPTIMUS_COMPILE else "eager,inductor"
    rc = cli.main(["--model", MODEL, "--mode", "train", "--configs", cfgs, "--json", str(path), *FAST])
    data = json.loads(path.read_text())
    assert rc == 0
    assert set(data["rows"]) == {"towers32/infer/eager", f"{MODEL}/train/eager", f"{MODEL}/train/{cfgs.split(',')[1]}"}
    row = data["rows"][f"{MODEL}/train/{cfgs.split(',')[1]}"]
    assert row["cold_compile"] is True  # this run used fresh cache dirs
    assert row["parity"]["ok"] and row["parity"]["grads_ok"] and "grad_max_rel" in row["parity"]
    assert row["parity"]["tensors"] > 1  # the output and every parameter gradient were judged
    assert row["kernels"] > 0
    assert row["workers"] == 1 and row["compile_threads"] is None and "reference" not in row  # serial
    # Resuming a piece: rows already measured are not run again.
    before = path.read_text()
    rc = cli.main(["--model", MODEL, "--mode", "train", "--configs", cfgs, "--json", str(path), "--skip-existing",
                   *FAST])
    assert rc == 0 and json.loads(path.read_text())["rows"] == json.loads(before)["rows"]


def test_failing_configuration_keeps_other_rows(monkeypatch, tmp_path) -> None:
    def broken(model):
        raise RuntimeError("deliberately broken configuration")

    bad = configs.BenchConfig("broken", "raises", True, broken, configs._nothing)
    monkeypatch.setitem(configs.CONFIGS, "broken", bad)
    opts = harness.BenchOptions(device="cpu", size="small", iters=2, warmup=0)
    rows = harness.run(["towers32"], ["infer"], ["broken", "eager"], opts)
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "deliberately broken" in rows[0]["error"]
    data = results.merge(results.empty(), rows)
    assert "error: RuntimeError: deliberately broken" in results.format_table(data)
    assert "error: RuntimeError" in report.render(data)


def test_bad_input(capsys) -> None:
    assert cli.main(["--model", "resnet", *FAST]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'resnet'" in err and "dlrm" in err and "splitcat" in err
    assert cli.main(["--model", MODEL, "--mode", "fly", *FAST]) == 2
    err = capsys.readouterr().err
    assert "unknown mode 'fly'" in err and "train, infer" in err
    assert cli.main(["--model", MODEL, "--configs", "magic", *FAST]) == 2
    assert "optimus-horizontal" in capsys.readouterr().err
    assert cli.main(["--model", MODEL, "--compile-threads", "2", *FAST]) == 2
    assert "add --workers N" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_gpu(capsys) -> None:
    assert cli.main(["--model", MODEL, "--device", "cuda", "--quiet"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_register_adds_bench_subcommand() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.register(sub)
    args = parser.parse_args(["bench", "--model", "dlrm", "--mode", "infer", "--json", "x.json"])
    assert args.func is cli.run_command and args.model == "dlrm" and args.json == "x.json"


def test_validate_catches_malformed_rows() -> None:
    data = results.merge(results.empty(), [_fake_row("dlrm", "train", "eager")])
    assert results.validate(data) == []
    data["rows"]["dlrm/train/eager"]["kernels"] = "many"
    data["rows"]["dlrm/train/eager"].pop("env")
    problems = results.validate(data)
    assert any("kernels" in p for p in problems) and any("env" in p for p in problems)


def test_upstream_options_discovery() -> None:
    opts = configs.upstream_fusion_options()
    assert set(opts) == {"pre_grad", "post_grad"}
    assert opts["pre_grad"] and opts["post_grad"]
    assert "group_linear" not in opts["post_grad"]
    assert all(v == {} for v in opts["pre_grad"].values())


def _fake_row(model: str, mode: str, config: str) -> dict:
    return {
        "model": model, "mode": mode, "config": config, "size": "small", "device": "cpu", "status": "ok",
        "error": None, "batch_size": 4, "kernels": 10, "step_ms": 1.0, "examples_per_s": 4000.0,
        "peak_memory_bytes": 1 << 20, "compile_s": 0.0, "first_step_s": 0.01,
        "parity": {"ok": True, "out_max_abs": 0.0, "out_max_rel": 0.0, "tol": 1e-3},
        "env": {"torch": torch.__version__, "device": "cpu", "device_name": "cpu", "date": "2025-01-01 00:00 UTC"},
    }


def test_budget_and_skip_stop_before_running(tmp_path) -> None:
    import time

    opts = harness.BenchOptions(device="cpu", size="small", iters=1, warmup=0)
    assert harness.run(["dlrm"], ["infer"], ["eager"], opts, deadline=time.perf_counter() - 1) == []
    assert harness.run(["dlrm"], ["infer"], ["eager"], opts, skip={"dlrm/infer/eager"}) == []


# --- workers, scheduling, configuration arguments ---------------------------------------


def test_schedule_longest_compile_first() -> None:
    plan = harness.plan(["towers32", "splitcat"], ["infer", "train"], ["eager", "inductor", "upstream"])
    tasks = parallel.schedule(plan)
    assert tasks[0].key == "splitcat/train/upstream" and tasks[1].key == "splitcat/train/inductor"
    assert [t.config for t in tasks[-4:]] == ["eager"] * 4  # nothing to compile: last
    assert [t.expected_s for t in tasks] == sorted((t.expected_s for t in tasks), reverse=True)
    # a measured figure from an earlier results file overrides the table
    tasks = parallel.schedule(plan, prior={"towers32/infer/inductor": 500.0})
    assert tasks[0].key == "towers32/infer/inductor"
    data = results.merge(results.empty(), [_fake_row("dlrm", "train", "inductor")])
    data["rows"]["dlrm/train/inductor"]["compile_s"] = 42.0
    assert parallel.prior_compile_s(data, "cpu", "small") == {"dlrm/train/inductor": 42.0}
    assert parallel.prior_compile_s(data, "cuda", "small") == {}


def _hold_lock(path: str, log: str) -> None:
    with parallel.FileLock(path):
        start = time.time()
        time.sleep(0.3)
        with open(log, "a") as f:
            f.write(f"{start} {time.time()}\n")


def test_file_lock_is_exclusive_across_processes(tmp_path) -> None:
    lock, log = str(tmp_path / "timed.lock"), str(tmp_path / "log")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hold_lock, args=(lock, log)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
    spans = sorted(tuple(map(float, line.split())) for line in open(log))
    assert len(spans) == 3
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans


def test_cores_and_threads_split() -> None:
    compile_cores, timing = parallel.split_cores(0)
    assert compile_cores == timing == parallel.usable_cores()
    cores = parallel.usable_cores()
    if len(cores) > 2:
        compile_cores, timing = parallel.split_cores(2)
        assert timing == cores[-2:] and compile_cores == cores[:-2]
    assert parallel.default_compile_threads(1, 14) is None
    assert parallel.default_compile_threads(4, 14) == 3 and parallel.default_compile_threads(4, 2) == 1


def test_configurations_pass_mode_and_dynamic(monkeypatch) -> None:
    import optimus

    seen: list[tuple[str, dict]] = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: seen.append(("torch", kw)) or model)
    monkeypatch.setattr(optimus, "compile", lambda model, **kw: seen.append(("optimus", kw)) or model)
    model = torch.nn.Linear(2, 2)
    for name in ("inductor", "inductor-cudagraphs", "optimus", "optimus-cudagraphs"):
        configs.CONFIGS[name].wrap(model, dynamic=True)
    assert configs.CONFIGS["eager"].wrap(model, dynamic=True) is model
    assert seen == [
        ("torch", {"fullgraph": True, "dynamic": True}),
        ("torch", {"fullgraph": True, "dynamic": True, "mode": "reduce-overhead"}),
        ("optimus", {"passes": "all", "fullgraph": True, "tune": False, "dynamic": True}),
        ("optimus", {"passes": "all", "fullgraph": True, "tune": False, "dynamic": True, "mode": "reduce-overhead"}),
    ]
    assert configs.CONFIGS["inductor-cudagraphs"].cudagraphs and not configs.CONFIGS["inductor"].cudagraphs
    assert harness.BenchOptions(dynamic=True).compile_kwargs() == {"dynamic": True}
    assert harness.BenchOptions().compile_kwargs() == {}


def test_recorded_command_names_what_changes_a_row() -> None:
    args = cli.build_parser().parse_args(["--model", "dlrm", "--workers", "4", "--repeats", "3", "--dynamic",
                                          "--tf32", "--compile-threads", "3", "--budget-minutes", "8"])
    argv = cli._argv_for_record(args, "cuda", "realistic")
    line = " ".join(argv)
    assert "--workers 4" in line and "--repeats 3" in line and "--dynamic" in argv
    assert "--precision tf32" in line  # --tf32 is recorded by its name now
    assert "--compile-threads 3" in line and "--budget-minutes" not in argv
    # TF32 is off unless asked for; --no-tf32 (the old flag) still parses
    assert cli.build_parser().parse_args([]).tf32 is False
    assert cli.build_parser().parse_args(["--no-tf32"]).tf32 is False
    assert cli._precisions(cli.build_parser().parse_args([])) == ["fp32"]
    argv = cli._argv_for_record(cli.build_parser().parse_args(["--precision", "fp32,amp-bf16"]), "cpu", "small")
    assert argv[argv.index("--precision") + 1] == "fp32,amp-bf16"


def _worker_that_dies_on_dlrm(setup, opts, tasks, results) -> None:
    """A bench worker that exits abruptly when handed a dlrm row."""
    task = tasks.get()
    if task is not None and task.model == "dlrm":
        os._exit(3)
    tasks.put(task)  # not ours to fail: hand it back to the real worker loop
    parallel.worker_main(setup, opts, tasks, results)


@pytest.mark.slow
def test_a_dying_worker_costs_only_its_row() -> None:
    opts = harness.BenchOptions(device="cpu", size="small", iters=1, warmup=0)
    rows = parallel.run_parallel(["dlrm", "towers32"], ["infer"], ["eager"], opts, workers=1,
                                 worker_target=_worker_that_dies_on_dlrm)
    by_model = {r["model"]: r for r in rows}
    assert by_model["dlrm"]["status"] == "error" and "WorkerDied" in by_model["dlrm"]["error"]
    assert "code 3" in by_model["dlrm"]["error"]
    assert by_model["towers32"]["status"] == "ok"  # a replacement worker ran it
    assert results.validate(results.merge(results.empty(), rows)) == []


class _BackendFailed(RuntimeError):
    """Stands in for Dynamo's BackendCompilerFailed, which carries the backend's error."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__(f"backend raised {inner}")
        self.inner_exception = inner


def test_optimus_mode_detection_reads_the_error(monkeypatch) -> None:
    import optimus

    def rejects_at_call(model, **kw):
        raise TypeError("compile() got an unexpected keyword argument 'mode'")

    def rejects_in_backend(model, **kw):
        def run(*args):
            raise _BackendFailed(TypeError("optimus_backend() got an unexpected keyword argument 'mode'"))

        return run

    def other_failure(model, **kw):
        raise RuntimeError("something else entirely")

    monkeypatch.setattr(optimus, "compile", rejects_at_call)
    assert "optimus.compile rejects mode=" in configs.optimus_mode_unsupported()
    monkeypatch.setattr(optimus, "compile", rejects_in_backend)
    assert "optimus_backend() got an unexpected keyword argument 'mode'" in configs.optimus_mode_unsupported()
    monkeypatch.setattr(optimus, "compile", other_failure)
    with pytest.raises(RuntimeError, match="something else"):  # not guessed to be the mode problem
        configs.optimus_mode_unsupported()
    monkeypatch.setattr(optimus, "compile", lambda model, **kw: model)
    assert configs.optimus_mode_unsupported() is None


def test_cpu_peak_tensor_memory_counts_what_a_step_holds_at_once():
    from optimus.tools import measure

    before = torch.zeros(1 << 20)  # live before the step: not counted

    def two_at_once():
        a = torch.ones(1 << 18)  # 1 MiB
        b = torch.ones(1 << 18)  # 1 MiB, both live
        return float((a + b).sum())  # + 1 MiB for the sum (a 4-byte result after)

    def one_at_a_time():
        for _ in range(3):
            float(torch.ones(1 << 18).sum())  # 1 MiB, freed each time

    peak2, peak1 = measure.peak_tensor_memory(two_at_once), measure.peak_tensor_memory(one_at_a_time)
    assert peak2 is not None and peak1 is not None
    assert 3 * 2**20 <= peak2 < 3 * 2**20 + 4096, peak2
    assert 2**20 <= peak1 < 2**20 + 4096, peak1
    del before


@pytest.mark.slow
def test_deadline_drops_only_the_rows_that_would_end_past_it() -> None:
    """A row expected to outlast the budget is not started; shorter rows still run (the
    longest expected row comes first, and must not stop the whole plan)."""
    opts = harness.BenchOptions(device="cpu", size="small", iters=1, warmup=0)
    rows = parallel.run_parallel(["dlrm", "towers32"], ["infer"], ["eager"], opts, workers=1,
                                 deadline=time.perf_counter() + 120, prior={"dlrm/infer/eager": 1e6})
    assert [r["model"] for r in rows] == ["towers32"] and rows[0]["status"] == "ok"


def _busy_for(run_dir: str, seconds: float, marks) -> None:
    with parallel.Quiet(run_dir).busy():
        marks.put(("busy-start", time.monotonic()))
        time.sleep(seconds)
        marks.put(("busy-end", time.monotonic()))


def test_isolate_times_no_row_while_another_compiles(tmp_path) -> None:
    """--isolate: a timed section waits for the busy section in flight (build, compile,
    first step of another row), and a busy section asked for meanwhile waits for it."""
    ctx = multiprocessing.get_context("fork")
    marks = ctx.Queue()
    quiet = parallel.Quiet(str(tmp_path))
    first = ctx.Process(target=_busy_for, args=(str(tmp_path), 1.0, marks))
    first.start()
    assert marks.get(timeout=20)[0] == "busy-start"
    second = None
    with quiet.timed():
        timed_start = time.monotonic()
        second = ctx.Process(target=_busy_for, args=(str(tmp_path), 0.0, marks))
        second.start()
        time.sleep(0.5)  # the second busy section must not start while this is timed
        timed_end = time.monotonic()
    first.join(20)
    second.join(20)
    got = sorted((marks.get(timeout=5) for _ in range(3)), key=lambda m: m[1])  # two processes' marks, in time order
    first_end = got[0][1]
    assert got[0][0] == "busy-end" and timed_start >= first_end  # waited for the compile in flight
    assert got[1][0] == "busy-start" and got[1][1] >= timed_end  # no compile started while timed
    assert first.exitcode == 0 and second.exitcode == 0


@pytest.mark.slow
def test_isolated_workers_run_their_rows() -> None:
    opts = harness.BenchOptions(device="cpu", size="small", iters=1, warmup=0, isolate=True)
    rows = parallel.run_parallel(["dlrm", "towers32"], ["infer"], ["eager"], opts, workers=2)
    assert sorted(r["model"] for r in rows) == ["dlrm", "towers32"]
    assert all(r["status"] == "ok" and r["isolated"] is True for r in rows)
