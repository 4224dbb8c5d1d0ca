"""Kernels per step and step time of a static and a ``--dynamic`` bench run, side by side.

    python docs/results/compare_dynamic.py STATIC.json DYNAMIC.json OUT.json

Prints one row per model/mode/config and writes the rows to OUT.json (used by
dynamic-shapes.sh).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def rows(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)["rows"]
    except Exception as e:  # a piece that did not run leaves no file
        print("cannot read", path, e)
        return {}


def fmt(v: Any, places: int = 1) -> str:
    return "-" if v is None else (f"{v:.{places}f}" if isinstance(v, float) else str(v))


def main(static_path: str, dynamic_path: str, out_path: str) -> None:
    s, d = rows(static_path), rows(dynamic_path)
    out = []
    print(f"{'dynamic row':34} {'kern st':>8} {'kern dyn':>8} {'ratio':>6} {'ms st':>8} {'ms dyn':>8} {'ratio':>6}  parity")
    for k in sorted(set(s) | set(d)):
        a, b = s.get(k, {}), d.get(k, {})
        ka, kb, ta, tb = a.get("kernels"), b.get("kernels"), a.get("step_ms"), b.get("step_ms")
        kr = kb / ka if ka and kb else None
        tr = tb / ta if ta and tb else None
        out.append({"row": k, "kernels_static": ka, "kernels_dynamic": kb, "step_ms_static": ta, "step_ms_dynamic": tb,
                    "kernel_ratio": kr, "time_ratio": tr, "parity_dynamic": b.get("parity"), "error_dynamic": b.get("error")})
        print(f"{k:34} {fmt(ka):>8} {fmt(kb):>8} {fmt(kr, 2):>6} {fmt(ta, 3):>8} {fmt(tb, 3):>8} {fmt(tr, 2):>6}  "
              f"{(b.get('parity') or {}).get('ok')} {b.get('error') or ''}")
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
