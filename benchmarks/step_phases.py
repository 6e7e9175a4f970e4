"""Where a BKB step's time goes, phase by phase: the host's time in each part of ``ask`` and ``tell``.

``benchmarks.launches`` counts a step's operations and host reads; this says which parts of the step the host spends
its time in. Each phase -- the selection, the tell's checks and bookkeeping, the pulled arms' rows, the resample and
its read, the dictionary's rows and ``K_S``'s factor, the refit, the scores, the accuracy check -- is wrapped in a
wall-clock timer that adds nothing to the step (no synchronization): a phase that reads the device holds the host
there until the queued kernels ran, so on a GPU its time includes that wait (``ask``'s own time is mostly its read of
the picks). ``self`` is a phase's time less the phases inside it; ``rest`` is the step's time outside ``ask`` and
``tell`` (the benchmark's objective). On CUDA, events recorded at each phase's ends give
the device's time from its start to its end too (kernels queued there and before; read after the step).

Cases as in ``benchmarks.launches`` (``bkb_anchor``, ``bkb_large``, ... with ``_fixed`` / ``_eager``).

Usage::

    python -m benchmarks.step_phases --cases bkb_anchor_eager --threads 1
    python -m benchmarks.step_phases --device cuda --cases bkb_large_eager --arms 1000000
"""

from __future__ import annotations

import importlib
import statistics
import time
import types
from collections import defaultdict

import torch

from benchmarks.cli import base_parser, setup
from benchmarks.launches import CASES, stepper
from benchmarks.report import new_figure, print_table, save_figure, write_json
from benchmarks.timing import sync

#: (name, owner, attribute): the methods timed, on the bandit (``None``), on one of its parts, or a module's function
#: (``"module:<name>"``).
PHASES = (
    ("ask", None, "ask"),
    ("ask: select", None, "_select"),
    ("tell", None, "tell"),
    ("tell: checks", None, "_check_tell"),
    ("tell: record", None, "_record"),
    ("update", None, "_update"),
    ("update: pulled rows", "rows", "add_pulled"),
    ("update: resample", "sampler", "resample"),
    ("update: fixed-capacity", None, "_update_fixed"),
    ("rebuild", None, "_rebuild"),
    ("rebuild: dictionary rows", "rows", "set_dictionary"),
    ("rebuild: K_S factor", "module:torchbkb.bandits.sketched", "inv_sqrt_factor"),
    ("rebuild: refit", "row_posterior", "refit"),
    ("rebuild: accuracy check", None, "_check_accuracy"),
    ("rebuild: scores", None, "_score"),
)


class PhaseTimer:
    """Wraps :data:`PHASES` on one bandit (instance attributes, removed by :meth:`remove`) and adds up each phase's
    total and self seconds, and on CUDA its device time, over the steps it sees."""

    def __init__(self, bandit, device: torch.device):
        self.bandit, self.cuda = bandit, device.type == "cuda"
        self.total: dict[str, float] = defaultdict(float)
        self.inner: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.stack: list[str] = []
        self.wrapped: list[tuple[object, str, object]] = []
        for name, part, attr in PHASES:
            if part is None:
                owner = bandit
            elif part.startswith("module:"):
                owner = importlib.import_module(part.removeprefix("module:"))
            else:
                owner = getattr(bandit, part, None)
            if owner is not None and hasattr(owner, attr):
                own = vars(owner).get(attr) if isinstance(owner, types.ModuleType) else None
                setattr(owner, attr, self._wrap(name, getattr(owner, attr)))
                self.wrapped.append((owner, attr, own))

    def _wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            if self.cuda:
                start_event = torch.cuda.Event(enable_timing=True)
                start_event.record()
            self.stack.append(name)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                self.stack.pop()
                self.total[name] += dt
                self.calls[name] += 1
                if self.stack:
                    self.inner[self.stack[-1]] += dt
                if self.cuda:
                    end_event = torch.cuda.Event(enable_timing=True)
                    end_event.record()
                    self.events.append((name, start_event, end_event))

        return timed

    def device_seconds(self) -> dict[str, float]:
        """Seconds between each phase's CUDA events, summed (after a synchronization)."""
        if not self.cuda:
            return {}
        torch.cuda.synchronize()
        out: dict[str, float] = defaultdict(float)
        for name, a, b in self.events:
            out[name] += a.elapsed_time(b) / 1e3
        return dict(out)

    def remove(self) -> None:
        """Put every wrapped method back (a module's function as it was; an instance's own attribute dropped)."""
        for owner, attr, own in reversed(self.wrapped):
            if own is not None:
                setattr(owner, attr, own)
            else:
                delattr(owner, attr)


def measure(case: str, args, device, dtype) -> dict:
    """The case's steps after ``--warmup``: each phase's median milliseconds a step over ``--steps`` steps."""
    b, step, _ = stepper(case, args, device, dtype)
    for _ in range(args.warmup):
        step()
    sync(device)
    per_step: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.steps):
        timer = PhaseTimer(b, device)
        t0 = time.perf_counter()
        k = step()
        sync(device)
        wall = (time.perf_counter() - t0) / k
        timer.remove()
        gpu = timer.device_seconds()
        per_step["step"].append(wall)
        inside = (timer.total["ask"] + timer.total["tell"]) / k
        per_step["rest (the objective, outside ask and tell)"].append(wall - inside)
        for name, _, _ in PHASES:
            per_step[name].append(timer.total.get(name, 0.0) / k)
            per_step[name + " (self)"].append((timer.total.get(name, 0.0) - timer.inner.get(name, 0.0)) / k)
            if gpu:
                per_step[name + " (device)"].append(gpu.get(name, 0.0) / k)
    ms = {name: 1e3 * statistics.median(v) for name, v in per_step.items()}
    return {"case": case, "device": str(device), "num_arms": b.num_arms, "dictionary_size": b.dictionary_size,
            "fixed_capacity": bool(getattr(b, "fixed_capacity", False)), "phases_ms": ms}


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="*", choices=CASES, default=["bkb_anchor_eager", "bkb_large_eager"])
    p.add_argument("--arms", type=int, default=100_000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--chunk-size", type=int, default=None)
    args = p.parse_args(argv)
    args.compiled = args.compiled_picks = args.no_update_graphs = args.host_rewards = False
    device, dtype = setup(args, default_threads=1)
    if args.quick:
        args.arms, args.warmup, args.steps = 5000, 10, 3
    rows = [measure(case, args, device, dtype) for case in args.cases]
    shown = ("step", "rest (the objective, outside ask and tell)")
    table = [{"case": r["case"], "phase": name, "ms_per_step": v} for r in rows for name, v in r["phases_ms"].items()
             if (v > 0 and name.endswith(("(self)", "(device)"))) or name in shown]
    print_table(table, ["case", "phase", "ms_per_step"], f"step phases ({torch.get_num_threads()} threads)")
    print(write_json(args.out, "step_phases", {"settings": vars(args), "rows": rows}))
    fig, axes = new_figure(ncols=len(rows), width=4.2)
    for ax, r in zip(axes[0], rows):
        selfs = {n.removesuffix(" (self)"): v for n, v in r["phases_ms"].items() if n.endswith("(self)") and v > 0}
        selfs["rest"] = r["phases_ms"]["rest (the objective, outside ask and tell)"]
        ax.barh(list(selfs), list(selfs.values()))
        ax.set(xlabel="ms per step (self)", title=r["case"])
    save_figure(fig, args.out, "step_phases")


if __name__ == "__main__":
    main()
