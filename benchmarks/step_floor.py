"""How fast a BKB step can be on the CPU: the loop's floor, the fewest operations, the engines, the authors' code.

Issue 38 asks for 5× the authors' NumPy BKB on the anchor (A = 1,000, T = 1,000, constant width, one thread). This
times, with one thread each and interleaved run by run (every method once, then again, ``--reps`` times), the seconds
per step of:

* ``loop`` -- a bandit that always selects arm 0 and learns nothing, through ``torchbkb.run``: what the ask/tell
  protocol and the loop cost before any algorithm;
* ``fewest ops`` -- the fewest tensor operations of a BKB step at the anchor's sizes, dictionary ``m = 25`` of
  ``p = 25`` pulled arms (draw and resample, gather the dictionary's kernel rows, factor ``K_S``, the pulled arms'
  features, ``V`` and ``V⁻¹``, the operator on kernel rows, score every arm, UCB argmax: 35 operations, no checks),
  timed bare: no loop, no protocol;
* ``torchbkb eager`` (the CPU's default update), ``torchbkb fixed`` (the fixed-capacity update, eager) and
  ``torchbkb fixed compiled`` (``torch.compile`` with inductor, compiled before the timing), through ``torchbkb.run``;
* ``fewest ops, NumPy`` -- the same 35 operations in NumPy and SciPy's LAPACK wrappers (scipy is the peers'
  dependency: skipped without it);
* ``authors`` -- the authors' BKB through the peers harness (``--peers``; skipped when it cannot be imported), with
  NumPy's BLAS on one thread (``threadpoolctl``).

``--quick`` runs 100 steps once and leaves out the compiled update. What the target needs:
``authors / (loop + fewest ops)`` bounds the ratio any PyTorch step built from separate
operations reaches through this loop, ``authors / (loop + fewest ops, NumPy)`` one built from NumPy calls.
Writes ``step_floor.json`` and ``step_floor.png``.

Usage::

    python -m benchmarks.step_floor --threads 1
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.cli import base_parser, setup, with_one_blas_thread
from benchmarks.report import new_figure, print_table, save_figure, strip_plot, write_json

T, LAM, Q_BAR, BETA, LENGTHSCALE = 1000, 0.01, 2.0, 0.5, 0.2


def torchbkb_runner(mode: str):
    import torchbkb
    from torchbkb.bandits.base import KernelBandit
    from torchbkb.datasets import anchor_problem
    from torchbkb.gp.kernels import GaussianKernel
    from torchbkb.objectives import ArmObjective

    prob = anchor_problem(dtype=torch.float64)

    class ArmZero(KernelBandit):
        def _select(self):
            return self._long([0])

        def _algorithm_state(self):
            return {}

        def _load_algorithm_state(self, state):
            pass

    def run(seed: int, steps: int = T) -> float:
        if mode == "loop":
            b = ArmZero(prob.arms, GaussianKernel(LENGTHSCALE), noise=LAM, beta=BETA, seed=seed)
        else:
            b = torchbkb.BKB(prob.arms, GaussianKernel(LENGTHSCALE), noise=LAM, q_bar=Q_BAR, beta=BETA, seed=seed)
            b.fixed_capacity = mode != "eager"
            b.engine.compiled = mode == "fixed compiled"
        obj = ArmObjective(prob.values, noise_std=prob.noise_std, seed=seed)
        t0 = time.perf_counter()
        torchbkb.run(b, obj, budget=steps, progress=False, values=prob.values)
        return (time.perf_counter() - t0) / steps

    return run


def timed(step):
    """A runner ``(seed, steps) -> seconds per step`` of the bare ``step`` (the seed is the caller's, unused)."""

    def run(seed: int, steps: int = T) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - t0) / steps

    return run


def fewest_ops_runner(ucb: bool = True):
    """The bare step at the anchor's sizes, 35 operations (see the module docstring); without ``ucb``, the update
    alone: the step up to every arm's mean and variance, without the UCB and its argmax."""
    g = torch.Generator().manual_seed(0)
    A, p, lam = 1000, 25, LAM
    X = torch.rand(A, 2, dtype=torch.float64, generator=g)
    K_P = torch.exp(-torch.cdist(X[:p], X) ** 2 / (2 * LENGTHSCALE**2))  # (p, A) the pulled arms' kernel rows
    pulled = torch.arange(p)
    counts = torch.zeros(A, dtype=torch.float64)
    counts[:p] = 40.0
    sums = torch.zeros(A, dtype=torch.float64)
    sums[:p] = 3.0
    rls = torch.full((A,), 0.5, dtype=torch.float64)
    kdiag = torch.ones(A, dtype=torch.float64)

    def step() -> int:
        u = torch.rand(p, generator=g, dtype=torch.float64)
        n = counts.index_select(0, pulled)
        keep = u < (Q_BAR * n * rls.index_select(0, pulled)).clamp_(0.0, 1.0)  # every arm kept (p = 1)
        idx = keep.nonzero().squeeze(1)
        S = pulled.index_select(0, idx)
        K_SA = K_P.index_select(0, idx)
        L = torch.linalg.cholesky_ex(K_SA.index_select(1, S))[0]
        W = torch.linalg.solve_triangular(L, torch.eye(S.numel(), dtype=L.dtype), upper=False)
        Zt = W @ K_SA.index_select(1, pulled)
        V = (Zt * n) @ Zt.T
        V.diagonal().add_(lam)
        V_inv = torch.cholesky_inverse(torch.linalg.cholesky_ex(V)[0])
        w = V_inv @ (Zt @ sums.index_select(0, pulled))
        inner = V_inv.neg()
        inner.diagonal().add_(1.0 / lam)
        Ma = torch.cat([W.T @ (inner @ W), (w @ W).unsqueeze(0)])
        P = Ma @ K_SA
        var = (kdiag / lam - (P[:-1] * K_SA).sum(0)).clamp_(min=0.0)
        return int((P[-1] + BETA * var.sqrt()).argmax()) if ucb else 0

    return timed(step)


def fewest_numpy_ops_runner(ucb: bool = True):
    """The same bare step in NumPy and SciPy's LAPACK wrappers (the draw from the same torch generator): what the
    fewest operations cost with the cheapest dispatch Python has, about a microsecond a call (``ucb`` as in
    :func:`fewest_ops_runner`)."""
    import numpy as np
    from scipy.linalg import lapack

    g = torch.Generator().manual_seed(0)
    A, p, lam = 1000, 25, LAM
    X = torch.rand(A, 2, dtype=torch.float64, generator=g).numpy()
    K_P = np.exp(-((X[:p, None, :] - X[None, :, :]) ** 2).sum(-1) / (2 * LENGTHSCALE**2))  # (p, A)
    pulled = np.arange(p)
    counts, sums, rls, kdiag = np.zeros(A), np.zeros(A), np.full(A, 0.5), np.ones(A)
    counts[:p], sums[:p] = 40.0, 3.0

    def step() -> int:
        u = torch.rand(p, generator=g, dtype=torch.float64).numpy()
        n = counts[pulled]
        idx = np.flatnonzero(u < np.minimum(Q_BAR * n * rls[pulled], 1.0))
        S = pulled[idx]
        K_SA = K_P[idx]
        L = lapack.dpotrf(K_SA[:, S], lower=1)[0]
        W = lapack.dtrtri(L, lower=1)[0]
        Zt = W @ K_SA[:, pulled]
        V = (Zt * n) @ Zt.T
        V.flat[:: V.shape[0] + 1] += lam
        C = lapack.dpotrf(V, lower=1)[0]
        V_inv = lapack.dpotri(C, lower=1)[0]  # the lower triangle
        V_inv += np.tril(V_inv, -1).T
        w = V_inv @ (Zt @ sums[pulled])
        inner = -V_inv
        inner.flat[:: inner.shape[0] + 1] += 1.0 / lam
        P = np.vstack([W.T @ (inner @ W), (w @ W)[None]]) @ K_SA
        var = np.maximum(kdiag / lam - (P[:-1] * K_SA).sum(0), 0.0)
        return int(np.argmax(P[-1] + BETA * np.sqrt(var))) if ucb else 0

    return timed(step)


def authors_runner(peers: str, name: str = "authors BKB (β=0.5)"):
    """The authors' BKB (constant width; or the harness's method ``name``) through the peers harness, as seconds
    per step, or ``None`` when it cannot be imported."""
    try:
        sys.path.insert(0, str(Path(peers).resolve()))
        argv, sys.argv = sys.argv, [sys.argv[0]]
        try:
            import run_peers
        finally:
            sys.argv = argv
        method = run_peers.p1_methods(T)[name]
    except Exception as err:  # numpy/scipy/scikit-learn missing, or no peers directory
        print(f"authors' code skipped: {err!r}")
        return None

    def run(seed: int, steps: int = T) -> float:
        return method(seed, steps)["wall_s"] / steps

    return run


def main(argv=None):
    return with_one_blas_thread(measure, argv)


def measure(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3, help="interleaved rounds (seeds 0, 1, ...)")
    p.add_argument("--peers", default="../shared/peers", help="the peers harness directory")
    args = p.parse_args(argv)
    setup(args, default_threads=1)
    if args.quick:
        args.reps = 1
    modes = [("loop", "loop"), ("torchbkb eager", "eager"), ("torchbkb fixed", "fixed")]
    if not args.quick:  # compiling takes tens of seconds on a fresh machine
        modes.append(("torchbkb fixed compiled", "fixed compiled"))
    runners = {name: torchbkb_runner(mode) for name, mode in modes}
    runners["fewest ops"] = fewest_ops_runner()
    try:
        runners["fewest ops, NumPy"] = fewest_numpy_ops_runner()
    except ImportError as err:  # scipy missing
        print(f"the NumPy step skipped: {err!r}")
    authors = authors_runner(args.peers)
    if authors is not None:
        runners["authors"] = authors
    warm = {}
    for name, run in runners.items():  # imports, caches, the compiled update's capacities
        t0 = time.perf_counter()
        run(1000, 60 if args.quick else T)
        warm[name] = time.perf_counter() - t0
    times = {name: [] for name in runners}
    for rep in range(args.reps):
        for name, run in runners.items():
            times[name].append(run(rep, 100 if args.quick else T))
        print(f"round {rep}: " + ", ".join(f"{k} {1e3 * v[-1]:.3f} ms" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [{"method": k, "ms_per_step": 1e3 * med[k], "runs_ms": [1e3 * x for x in times[k]],
             "authors_over_this": med["authors"] / med[k] if "authors" in med else None} for k in runners]
    bound = med["authors"] / (med["loop"] + med["fewest ops"]) if "authors" in med else None
    np_bound = (med["authors"] / (med["loop"] + med["fewest ops, NumPy"])
                if "authors" in med and "fewest ops, NumPy" in med else None)
    print_table(rows, ["method", "ms_per_step", "authors_over_this"], title="seconds per BKB step, one thread")
    if bound is not None:
        print(f"authors / (loop + fewest ops) = {bound:.2f}x: the most a PyTorch step of separate operations gets")
    if np_bound is not None:
        print(f"authors / (loop + fewest NumPy ops) = {np_bound:.2f}x: the same step with NumPy's dispatch")
    write_json(args.out, "step_floor", {"T": T, "reps": args.reps, "warmup_s": warm, "rows": rows,
                                        "bound_authors_over_loop_plus_fewest_ops": bound,
                                        "bound_authors_over_loop_plus_fewest_numpy_ops": np_bound})
    fig, axes = new_figure(width=7.0)
    ax = axes[0, 0]
    strip_plot(ax, list(times), [[1e3 * x for x in v] for v in times.values()], rotation=20)
    ax.set_ylabel("ms per step (one thread)")
    ax.set_title("A BKB step on the anchor (A = 1,000, T = 1,000)")
    print(save_figure(fig, args.out, "step_floor"))


if __name__ == "__main__":
    main()
