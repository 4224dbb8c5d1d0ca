"""Speedup and kernel-count bar charts of bench results (matplotlib, imported lazily)."""

from __future__ import annotations

from typing import Any

from .configs import CONFIG_NAMES
from .results import rows_by, speedup


def require_matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("--plot needs matplotlib: pip install matplotlib (or pip install 'optimus[plot]')") from e
    return plt


def plot(data: dict[str, Any], path: str) -> None:
    """One row of panels per mode: speedup over eager, and kernels per step (log scale);
    one bar per configuration and precision (``config precision`` where several ran)."""
    plt = require_matplotlib()
    grouped = rows_by(data)
    modes = [m for m in ("train", "infer") if any(mode == m for _, mode, _ in grouped)]
    precisions = list(dict.fromkeys(p for _, _, p in grouped))
    series = [(c, p) for p in precisions for c in CONFIG_NAMES
              if any(c in cfgs for (_, _, q), cfgs in grouped.items() if q == p)]
    fig, axes = plt.subplots(len(modes), 2, figsize=(14, 4.2 * len(modes)), squeeze=False)
    width = 0.8 / max(len(series), 1)
    for r, mode in enumerate(modes):
        models = list(dict.fromkeys(m for (m, md, _) in grouped if md == mode))
        ax_speed, ax_kern = axes[r]
        for i, (config, precision) in enumerate(series):
            xs, speeds, kernels = [], [], []
            for j, model in enumerate(models):
                cfgs = grouped.get((model, mode, precision), {})
                row = cfgs.get(config)
                if not row or row["status"] != "ok":
                    continue
                xs.append(j + (i - (len(series) - 1) / 2) * width)
                speeds.append(speedup(row, cfgs.get("eager")) or 0.0)
                kernels.append(row.get("kernels") or 0)
            label = config if len(precisions) == 1 else f"{config} {precision}"
            ax_speed.bar(xs, speeds, width, label=label)
            ax_kern.bar(xs, kernels, width, label=label)
        for ax, title in ((ax_speed, "speedup over eager (higher is better)"),
                          (ax_kern, "kernels per step (lower is better)")):
            ax.set_xticks(range(len(models)))
            ax.set_xticklabels(models, rotation=20)
            ax.set_title(f"{mode}: {title}")
        ax_speed.axhline(1.0, color="grey", linewidth=0.8)
        ax_kern.set_yscale("log")
        ax_kern.set_ylim(bottom=1)
    axes[0][1].legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
