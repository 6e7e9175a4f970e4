"""Shared benchmark plumbing: CLI, timing, machine info, JSON/PNG output, tables, the algorithm registry.

Conventions (DESIGN.md §5.8): every benchmark synchronizes CUDA around timed regions, reports min and
median over repeats, writes ``results/<name>.json`` (with :func:`machine_info`) and PNG plots, and
compares against a baseline measured in the same process.

Algorithm registry: a benchmark asks for bandits by name (``make_bandit("BKB", arms, settings, seed)``);
new algorithms join every suite by registering a factory::

    @register_algorithm("BBKB", description="batched BKB, 001 Algorithm 1")
    def _bbkb(arms, settings, seed):
        return torchbkb.BBKB(arms, settings.kernel(), noise=settings.lam, ...)

The built-in registrations live in :mod:`benchmarks.algorithms`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

SIZES = ("quick", "default", "full")
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------- CLI
def base_parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark understands."""
    p = argparse.ArgumentParser(description=description)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smoke-test size (seconds)")
    size.add_argument("--full", action="store_true", help="the papers' sizes (hours)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"], help="arm/feature dtype")
    p.add_argument("--out", default="results", help="output directory for JSON and PNG")
    p.add_argument("--seed", type=int, default=0, help="base seed")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    return p


def setup(args: argparse.Namespace, *, default_threads: int | None = None) -> tuple[torch.device, torch.dtype]:
    """Apply the common options (threads) and return ``(device, dtype)``.

    ``default_threads`` applies when ``--threads`` is not given: the bandit loops pass 1, since their
    per-step matrices are small and a second OpenMP thread only adds synchronization (on a shared 2-core
    VM it made them several times slower). The thread count is recorded in the JSON (:func:`machine_info`).
    """
    threads = args.threads if args.threads is not None else default_threads
    if threads is not None:
        torch.set_num_threads(int(threads))
    return resolve_device(args.device), resolve_dtype(args.dtype)


def size_of(args: argparse.Namespace) -> str:
    """``"quick"``, ``"default"`` or ``"full"``."""
    return "quick" if getattr(args, "quick", False) else "full" if getattr(args, "full", False) else "default"


def resolve_device(name: str) -> torch.device:
    """A ``torch.device``; ``cuda`` without a GPU is an error, not a silent fallback."""
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: CUDA is not available on this machine")
    return dev


def resolve_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


# ---------------------------------------------------------------------------------------- timing
def sync(device: torch.device | str | None) -> None:
    """Wait for queued CUDA work (a no-op on CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    """Seconds over repeats: ``min`` (the least disturbed), ``median`` (typical), all values."""

    min: float
    median: float
    values: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_call(fn: Callable[[], Any], *, device=None, repeats: int = 3, warmup: int = 1) -> Timing:
    """Time ``fn()`` with CUDA synchronization before and after each call.

    Args:
        fn: the callable (its return value is dropped after synchronization).
        device: device to synchronize.
        repeats: timed calls.
        warmup: untimed calls first (allocator, kernels, caches).

    Returns:
        :class:`Timing`.
    """
    for _ in range(warmup):
        fn()
        sync(device)
    values = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        values.append(time.perf_counter() - t0)
    return Timing(min(values), statistics.median(values), values)


def time_interleaved(fns: dict[str, Callable[[], Any]], *, device=None, repeats: int = 3, warmup: int = 1) -> dict[str, Timing]:
    """Time several callables round-robin (a, b, c, a, b, c, ...), synchronizing CUDA around each.

    On a shared or throttling machine, interleaving exposes every candidate to the same conditions, so
    ratios between them (e.g. an operation against its GEMM baseline) stay meaningful.

    Returns:
        ``{name: Timing}``.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
            sync(device)
    values: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            values[name].append(time.perf_counter() - t0)
    return {k: Timing(min(v), statistics.median(v), v) for k, v in values.items()}


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


# ------------------------------------------------------------------------------------ machine info
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
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5)
        # "-dirty": tracked files changed outside results/ (a benchmark rewrites its own outputs as it goes)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"], cwd=REPO, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if out.returncode == 0 else None
    except Exception:  # noqa: BLE001
        return None


def status_kb(key: str) -> float:
    """A field of ``/proc/self/status`` in kB (``VmRSS``, ``VmHWM``, ...); NaN where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def reset_hwm() -> bool:
    """Reset the process's resident-set high-water mark (``VmHWM``) to its current RSS; whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return not math.isnan(status_kb("VmHWM"))
    except OSError:
        return False


class PeakMemory:
    """Extra peak memory [bytes] of a block beyond what was resident when it started.

    CUDA: ``max_memory_allocated`` after a reset. CPU (Linux): ``VmHWM`` after :func:`reset_hwm`, minus ``VmRSS``
    at the start. ``None`` when unavailable.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.extra: int | None = None

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.ok = reset_hwm()
            self.base = int(status_kb("VmRSS")) * 1024 if self.ok else 0
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            sync(self.device)
            self.extra = torch.cuda.max_memory_allocated(self.device) - self.base
        elif self.ok:
            self.extra = int(status_kb("VmHWM")) * 1024 - self.base
        return False


# ------------------------------------------------------------------------------------------ output
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


def strip_plot(ax, labels: list[str], values: list[list[float]], *, mean: bool = False, rotation: float = 0, fontsize: float | None = None) -> None:
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


# -------------------------------------------------------------------------------- algorithm registry
@dataclass
class BanditSettings:
    """Hyperparameters shared by all algorithms of a run (the papers' settings by default).

    Attributes:
        lengthscale: Gaussian kernel lengthscale ``ℓ`` (the papers' width ``σ² = ℓ²``).
        lam: regularization / GP noise variance ``λ``.
        q_bar: BKB/BBKB oversampling ``q̄``.
        F: RKHS-norm bound of the theory β.
        delta: failure probability of the theory β.
        beta: the constant width (RLS scale) used by the constant-β variants.
        noise_std: ``ξ`` of the theory β (``None``: ``√λ``).
        epsilon: exploration rate of ε-greedy.
        batch_bound: BBKB/GP-BUCB batch-termination bound ``C̃`` (001 Alg. 1; the paper does not state it).
    """

    lengthscale: float = math.sqrt(5.0)
    lam: float = 0.2
    q_bar: float = 2.0
    F: float = 20.0
    delta: float = 1e-4
    beta: float = 1.0
    noise_std: float | None = None
    epsilon: float = 0.1
    batch_bound: float = 2.0

    def kernel(self):
        from torchbkb.kernels import GaussianKernel

        return GaussianKernel(lengthscale=self.lengthscale)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AlgorithmSpec:
    """A registered algorithm: ``factory(arms, settings, seed) -> Bandit``.

    Attributes:
        capped: an exact (slow) peer -- informational; every suite applies its wall-time cap to all runs.
    """

    name: str
    factory: Callable[..., Any]
    capped: bool = False
    description: str = ""


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register_algorithm(name: str, *, capped: bool = False, description: str = ""):
    """Decorator registering ``factory(arms, settings, seed) -> Bandit`` under ``name``."""

    def deco(factory):
        ALGORITHMS[name] = AlgorithmSpec(name, factory, capped, description)
        return factory

    return deco


def make_bandit(name: str, arms: torch.Tensor, settings: BanditSettings, seed: int):
    """Build a registered algorithm (importing the built-in registrations on first use)."""
    import benchmarks.algorithms  # noqa: F401 - registers the built-ins

    if name not in ALGORITHMS:
        raise KeyError(f"algorithm: expected one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name].factory(arms, settings, seed)


def run_bandit(
    name: str,
    arms: torch.Tensor,
    objective,
    values: torch.Tensor,
    settings: BanditSettings,
    T: int,
    seed: int,
    *,
    time_limit: float | None = None,
    progress: bool = True,
    curve_points: int = 400,
) -> dict[str, Any]:
    """Run one registered algorithm once; return its summary and subsampled curves.

    The returned curves are sampled at ``t = steps[i]`` (1-based): cumulative regret, normalized regret,
    wall time, algorithm time, batch size of the batch containing ``t``, dictionary size.
    """
    import torchbkb

    device = arms.device
    sync(device)
    t0 = time.perf_counter()
    bandit = make_bandit(name, arms, settings, seed)
    sync(device)
    setup = time.perf_counter() - t0
    hist = torchbkb.run(bandit, objective, budget=T, progress=progress, values=values, time_limit=time_limit)
    sync(device)
    n = len(hist)
    idx = subsample_indices(n, curve_points)
    per_batch = Counter(hist.batch)  # batch id -> evaluations in it
    cum, norm = hist.cumulative_regret, hist.normalized_regret
    s = hist.summary()
    capped_at = n if n < T else None
    return {
        "algorithm": name,
        "seed": seed,
        "T_requested": T,
        "T": n,
        "capped": capped_at is not None,
        "stopped": hist.meta.get("stopped"),
        "setup_time": setup,
        "time": s["time"] + setup,
        "algo_time": s["algo_time"],
        "regret": s["regret"],
        "normalized_regret": s["normalized_regret"],
        "batches": s["batches"],
        "dictionary_size": s["dictionary_size"],
        "curves": {
            "t": [i + 1 for i in idx],
            "cumulative_regret": [cum[i] for i in idx],
            "normalized_regret": [norm[i] for i in idx],
            "time": [hist.time[i] + setup for i in idx],
            "algo_time": [hist.algo_time[i] for i in idx],
            "batch_size": [per_batch[hist.batch[i]] for i in idx],
            "dictionary_size": [hist.dictionary_size[i] for i in idx],
        },
    }


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean/std/median over repetitions of one algorithm's runs."""

    def stats(key):
        vals = [r[key] for r in runs if r[key] is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
        if not vals:
            return float("nan"), float("nan")
        return statistics.fmean(vals), (statistics.pstdev(vals) if len(vals) > 1 else 0.0)

    out = {"algorithm": runs[0]["algorithm"], "repetitions": len(runs)}
    for key in ("time", "algo_time", "normalized_regret", "regret", "batches", "dictionary_size", "T"):
        out[key], out[key + "_std"] = stats(key)
    out["time_median"] = statistics.median(r["time"] for r in runs)
    out["time_min"] = min(r["time"] for r in runs)
    out["ms_per_step"] = 1e3 * out["time_median"] / max(statistics.median(r["T"] for r in runs), 1)
    out["capped"] = any(r["capped"] for r in runs)
    out["T_requested"] = runs[0]["T_requested"]
    return out


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


BANDIT_COLUMNS = ["algorithm", "T", "time [s] (median)", "ms/step", "R_T/R_unif", "± std", "batches", "dict. size", "note"]


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
