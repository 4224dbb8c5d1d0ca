"""One batched matmul against one mm per entry, for the long-reduction shapes that
``unbatch_long_reduction_bmm`` (optimus/rules/horizontal.py) unbatches and the short ones it
keeps batched. CUDA only; fp32 without TF32; CUDA-event timing of the median of 20 runs.

    python docs/results/bmm_long_reduction.py --json OUT.json

Shapes: (batch, p, k, q) for (batch, p, k) @ (batch, k, q), as in the zoo's backward
graphs (interformer's weight gradients, wukong's under passes="auto", towers32/splitcat's).
"""

from __future__ import annotations

import argparse
import json

import torch

from optimus.tools.measure import median_step_ms
from optimus.rules.horizontal import long_reduction

SHAPES = [
    ("interformer dW", 8, 64, 33792, 64),
    ("interformer dW", 8, 192, 33792, 64),
    ("interformer dW", 8, 64, 33792, 128),
    ("wukong dW (auto)", 2, 16, 262144, 32),
    ("towers32 dW", 32, 64, 512, 64),
    ("interformer dW (short)", 32, 64, 1024, 128),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for what, g, p, k, q in SHAPES:
        # the layouts of the backward graph: a = dy.mT (a transposed view), b contiguous
        a = torch.randn(g, k, p, device="cuda").transpose(1, 2)
        b = torch.randn(g, k, q, device="cuda")
        batched = median_step_ms(lambda: torch.bmm(a, b), "cuda", warmup=3, iters=20) * 1e3
        per_entry = median_step_ms(lambda: [torch.mm(a[i], b[i]) for i in range(g)], "cuda", warmup=3, iters=20) * 1e3
        rows.append({"what": what, "batch": g, "p": p, "k": k, "q": q, "bmm_us": batched, "mm_per_entry_us": per_entry,
                     "unbatched_by_rule": long_reduction(g, p, k, q)})
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "tf32": False,
            "timing": "CUDA events, median of 20 after 3 warm-up runs; mm per entry launched from Python"}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"{'shape':44} {'bmm us':>9} {'mm x G us':>10} {'rule':>6}")
    for r in rows:
        shape = f"{r['what']} ({r['batch']},{r['p']},{r['k']})@({r['batch']},{r['k']},{r['q']})"
        print(f"{shape:44} {r['bmm_us']:9.1f} {r['mm_per_entry_us']:10.1f} {'unbatch' if r['unbatched_by_rule'] else 'keep':>6}")


if __name__ == "__main__":
    main()
