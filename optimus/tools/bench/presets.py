"""Where a step's device time goes, preset by preset.

    python -m optimus.tools.bench.presets --model towers32 --size small --mode infer [--cudagraphs]
           [--presets inductor,vertical,horizontal,fx,all] [--json] [--json-out FILE]

For one zoo model, compiles the step with plain Inductor and with Optimus under each
preset (``fx`` = Torch-IR + Aten-IR rules, no Inductor-IR passes), optionally under CUDA
graphs (``mode="reduce-overhead"`` on both sides), and prints per preset: kernels per
step, summed kernel device time, median step time and the longest kernels. The bench
(``optimus bench``) measures the configurations; this says why one is slower.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import torch

from .. import measure
from ..cli_json import add_json_arguments, emit
from ...core.table import format_table
from .external import get_bench_model as get_model

PRESETS: dict[str, Any] = {
    "inductor": None,
    "vertical": "vertical",
    "horizontal": "horizontal",
    "fx": {"torch_ir": "all", "aten_ir": "all", "inductor_ir": "none"},
    "all": "all",
}


def run_preset(model_name: str, size: str, mode: str, preset: str, cudagraphs: bool, device: str) -> dict[str, Any]:
    import optimus

    torch._dynamo.reset()
    zoo = get_model(model_name, size, device=device)
    kwargs: dict[str, Any] = {"fullgraph": True}
    if cudagraphs:
        kwargs["mode"] = "reduce-overhead"
    passes = PRESETS[preset]
    fn = torch.compile(zoo.model, **kwargs) if passes is None else optimus.compile(zoo.model, passes=passes, **kwargs)

    def step() -> None:
        if cudagraphs and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
            torch.compiler.cudagraph_mark_step_begin()
        if mode == "train":
            zoo.loss(fn(*zoo.inputs)).backward()
        else:
            with torch.no_grad():
                fn(*zoo.inputs)

    for _ in range(4):
        step()
    row: dict[str, Any] = {"model": model_name, "size": size, "mode": mode, "preset": preset, "cudagraphs": cudagraphs}
    row["step_ms"] = statistics.median(measure.step_ms_medians(step, device, warmup=3, iters=20, repeats=1))
    if torch.device(device).type == "cuda":
        row.update(measure.kernel_profile(step, device, top=6))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m optimus.tools.bench.presets", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="towers32")
    p.add_argument("--size", default="small")
    p.add_argument("--mode", default="infer", choices=("infer", "train"))
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--cudagraphs", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_json_arguments(p, "the rows", file_form=True)
    args = p.parse_args(argv)
    rows = []
    for preset in args.presets.split(","):
        try:
            rows.append(run_preset(args.model, args.size, args.mode, preset, args.cudagraphs, args.device))
        except Exception as e:  # one preset failing must not hide the others
            rows.append({"preset": preset, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    if emit(rows, args):
        return 0
    cells: list[Any] = []
    for r in rows:
        if "error" in r:
            cells.append([r["preset"], f"error: {r['error']}"])
            continue
        cells.append([r["preset"], f"{r['step_ms']:.3f}", r.get("count", "-"), r.get("device_us", "-")])
        cells += [f"    {us:.1f} us  x{calls}  {name}" for name, calls, us in r.get("top", [])]
    print(f"{args.model} {args.size} {args.mode}{' cudagraphs' if args.cudagraphs else ''}")
    print(format_table(["preset", "step ms", "kernels", "device us"], cells, [False, True, True, True]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
