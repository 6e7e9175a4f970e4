"""What a benchmark writes: JSON with the machine and the command line, tables, PNG figures, summary statistics."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]


def machine_info(device: torch.device | str | None = None) -> dict[str, Any]:
    """CPU model, cores, threads, load, library versions, device and git commit."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "device": str(device) if device is not None else "cpu",
    }
    for mod in ("gpytorch", "botorch", "numpy"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - informational only
            info[mod] = None
    if device is not None and torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    info["git_commit"] = git_commit()
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str | None:
    """The checkout's short commit, with ``-dirty`` when tracked files outside ``results/`` changed;
    ``None`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=5)
        # "-dirty": tracked files changed outside results/ (a benchmark rewrites its own outputs as it goes)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
                               cwd=REPO, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if out.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def bootstrap_ratio(a, b, stat, n: int = 10_000, seed: int = 0) -> list[float]:
    """90 % paired-bootstrap interval of ``stat(a) / stat(b)`` over matched seeds.

    Args:
        a, b: `(k,)` values of two methods on the same ``k`` seeds (array-likes).
        stat: a NumPy reduction taking ``axis`` (``numpy.median``, ``numpy.mean``).
        n: bootstrap resamples (seeds drawn with replacement, the same draw for both methods).
        seed: generator seed.

    Returns:
        ``[5 % quantile, 95 % quantile]`` of the resampled ratio.

    Example:
        >>> import numpy as np
        >>> lo, hi = bootstrap_ratio([2.0, 2.2, 1.8], [1.0, 1.1, 0.9], np.median)
        >>> round(lo, 6), round(hi, 6)
        (2.0, 2.0)
    """
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    k = np.random.default_rng(seed).integers(0, len(a), size=(n, len(a)))
    r = stat(a[k], axis=1) / stat(b[k], axis=1)
    return [float(np.quantile(r, 0.05)), float(np.quantile(r, 0.95))]


def fit_loglog_slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (the empirical complexity exponent)."""
    pts = [(math.log(a), math.log(b)) for a, b in zip(x, y) if a > 0 and b > 0]
    if len(pts) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx > 0 else float("nan")




def write_json(out_dir: str | Path, name: str, payload: dict[str, Any], device=None) -> Path:
    """Write ``<out_dir>/<name>.json`` with the payload, the machine info and the command line."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "command": _command_line(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine_info(device),
        **payload,
    }
    path = out / f"{name}.json"
    with open(path, "w") as f:
        json.dump(_jsonable(doc), f, indent=1)
    return path


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith("__main__.py"):  # python -m benchmarks ...
        argv[0] = "-m benchmarks"
    elif argv and "benchmarks" in Path(argv[0]).parts:  # python -m benchmarks.<name> or a script path
        argv[0] = "-m benchmarks." + Path(argv[0]).stem
    return " ".join(["python", *argv])


def _jsonable(x):
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return _jsonable(x.tolist())
    if isinstance(x, (torch.dtype, torch.device, Path)):
        return str(x)
    return x


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.6):
    """A matplotlib figure on the Agg backend (headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, axes


def strip_plot(ax, labels: list[str], values: list[list[float]], *, mean: bool = False, rotation: float = 0,
               fontsize: float | None = None) -> None:
    """Per-seed values of several methods: one column of points per method (one point per seed, in
    ``C0, C1, ...``), a solid bar at each column's median and, with ``mean=True``, a dashed one at its
    mean; log y-axis.

    Args:
        ax: a matplotlib axis.
        labels: `(k,)` method names (x tick labels).
        values: `k` lists of per-seed values.
        mean: also draw the means.
        rotation, fontsize: of the tick labels.
    """
    import numpy as np

    for k, ys in enumerate(values):
        ax.scatter(k + np.linspace(-0.25, 0.25, len(ys)), ys, s=12, color=f"C{k}")
        ax.plot([k - 0.3, k + 0.3], [float(np.median(ys))] * 2, "k-", lw=2)
        if mean:
            ax.plot([k - 0.3, k + 0.3], [float(np.mean(ys))] * 2, "k--", lw=1)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=rotation, ha="right" if rotation else "center", fontsize=fontsize)
    ax.set_yscale("log")
    ax.grid(alpha=0.3, axis="y")


def save_figure(fig, out_dir: str | Path, name: str) -> Path:
    """Save ``<out_dir>/<name>.png`` and close the figure."""
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_band(ax, x: list[float], runs: list[list[float]], label: str, **kw) -> None:
    """Mean ± std over repetitions of curves sampled at ``x`` (shorter runs end earlier)."""
    import numpy as np

    n = min(len(x), max((len(r) for r in runs), default=0))
    if n == 0:
        return
    M = np.full((len(runs), n), np.nan)
    for i, r in enumerate(runs):
        M[i, : min(n, len(r))] = r[:n]
    with np.errstate(all="ignore"):
        mean = np.nanmean(M, axis=0)
        std = np.nanstd(M, axis=0)
    xs = np.asarray(x[:n])
    (line,) = ax.plot(xs, mean, label=label, **kw)
    if len(runs) > 1:
        ax.fill_between(xs, mean - std, mean + std, color=line.get_color(), alpha=0.2, lw=0)


def format_table(rows: list[dict[str, Any]], columns: list[str], title: str | None = None) -> str:
    """A plain-text (Markdown-compatible) table."""

    def fmt(v):
        if isinstance(v, float):
            if math.isnan(v):
                return "-"
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"
        return "-" if v is None else str(v)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = []
    if title:
        lines.append(f"\n{title}")
    lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        lines.append("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |")
    return "\n".join(lines)


def print_table(rows: list[dict[str, Any]], columns: list[str], title: str | None = None) -> None:
    print(format_table(rows, columns, title), flush=True)


def subsample_indices(n: int, k: int = 400) -> list[int]:
    """At most ``k`` increasing indices in ``[0, n)`` (always the last), for compact JSON curves."""
    if n <= k:
        return list(range(n))
    idx = sorted({int(round(i * (n - 1) / (k - 1))) for i in range(k)})
    return idx


def bandit_table_rows(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the standard results table (one per algorithm)."""
    rows = []
    for s in summaries:
        note = f"capped by time at t≈{int(s['T'])}" if s["capped"] else ""
        rows.append(
            {
                "algorithm": s["algorithm"],
                "T": int(round(s["T"])),
                "time [s] (median)": s["time_median"],
                "ms/step": s["ms_per_step"],
                "R_T/R_unif": s["normalized_regret"],
                "± std": s["normalized_regret_std"],
                "batches": s["batches"],
                "dict. size": s["dictionary_size"] if s["dictionary_size"] >= 0 else None,
                "note": note,
            }
        )
    return rows


BANDIT_COLUMNS = ["algorithm", "T", "time [s] (median)", "ms/step", "R_T/R_unif", "± std", "batches", "dict. size",
                  "note"]


def plot_bandit_runs(results: dict[str, list[dict[str, Any]]], out_dir, name: str, title: str) -> Path:
    """Four panels: regret, time, batch size and dictionary size against t (mean ± std over runs)."""
    fig, axes = new_figure(ncols=4, width=4.3)
    panels = [
        ("cumulative_regret", "cumulative regret $R_t$", False),
        ("time", "wall time [s]", True),
        ("batch_size", "batch size", False),
        ("dictionary_size", "dictionary size $m_t$", False),
    ]
    for ax, (key, ylabel, logy) in zip(axes[0], panels):
        for alg, runs in results.items():
            if key == "dictionary_size" and all(v < 0 for r in runs for v in r["curves"][key]):
                continue
            longest = max(runs, key=lambda r: len(r["curves"]["t"]))
            plot_band(ax, longest["curves"]["t"], [r["curves"][key] for r in runs], alg)
        ax.set_xlabel("t")
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, out_dir, name)
