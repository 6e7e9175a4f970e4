"""NumPy's BLAS and LAPACK beside torch's threads: what a host-side (NumPy) update would cost in a default process.

A bandit's update works on `(m, m)` matrices with ``m`` of tens, where a torch operation's dispatch outweighs its
arithmetic, so NumPy and SciPy's LAPACK wrappers look cheaper. But NumPy's BLAS keeps its own thread pool next to
torch's OpenMP threads. This times ``iterations`` rounds of one NumPy/SciPy call followed by one threaded torch
product (what an update's scores do next), with NumPy's BLAS at its default thread count and at one
(``threadpoolctl``), torch at its default threads. Calls: small and `(2000, 40)·(40, 40)` GEMMs, a GEMV, and the
LAPACK routines of an `(m, m)` refit and whitening at ``m = 24``: Cholesky (``potrf``), the inverse from it
(``potri``), triangular solve (``trtrs``) and inverse (``trtri``).

Writes ``blas_threads.json`` and ``blas_threads.png``. Usage::

    python -m benchmarks.blas_threads            # ~25 s on 2 cores
"""

from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np
import torch

from benchmarks.cli import base_parser, setup
from benchmarks.report import new_figure, print_table, save_figure, write_json


def calls(m: int = 24) -> dict:
    """name -> zero-argument NumPy/SciPy call, on inputs made once."""
    from scipy.linalg import lapack

    rng = np.random.default_rng(0)
    V = rng.random((m, m))
    V = V @ V.T + m * np.eye(m)
    L, eye = np.linalg.cholesky(V), np.eye(m)
    W, K = rng.random((m, m)), rng.random((m, m + 1))
    Zi, U, Zb, v = rng.random((2000, 40)), rng.random((40, 40)), rng.random((16384, 40)), rng.random(40)
    return {
        "nothing": lambda: None,
        f"GEMM ({m}, {m})·({m}, {m + 1})": lambda: W.dot(K),
        "GEMM (2000, 40)·(40, 40)": lambda: Zi.dot(U),
        "GEMV (16384, 40)·(40,)": lambda: Zb.dot(v),
        f"potrf ({m}×{m} Cholesky)": lambda: lapack.dpotrf(V, lower=1, clean=1),
        f"potri ({m}×{m} inverse from L)": lambda: lapack.dpotri(L, lower=1),
        f"trtrs ({m}×{m} triangular solve)": lambda: lapack.dtrtrs(L, eye, lower=1),
        f"trtri ({m}×{m} triangular inverse)": lambda: lapack.dtrtri(L, lower=1),
    }


def per_round(call, torch_op, iterations: int) -> float:
    """Seconds per round of ``call()`` then ``torch_op()``."""
    t0 = time.perf_counter()
    for _ in range(iterations):
        call()
        torch_op()
    return (time.perf_counter() - t0) / iterations


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=100, help="rounds per measurement")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions (medians reported)")
    args = p.parse_args(argv)
    setup(args)
    if args.quick:
        args.iterations, args.reps = 20, 1
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError as err:
        raise SystemExit(f"blas_threads: expected threadpoolctl installed, got {err!r}") from None
    g = torch.Generator().manual_seed(args.seed)
    A = torch.rand(25, 24, generator=g, dtype=torch.float64)
    B = torch.rand(24, 20_000, generator=g, dtype=torch.float64)
    torch_op = lambda: (A @ B).sum()  # noqa: E731  (a (25, 24)·(24, 2·10⁴) product: threaded by torch)
    table = calls()
    times: dict[str, dict[str, list[float]]] = {name: {"default": [], "one": []} for name in table}
    for rep in range(args.reps):
        for name, call in table.items():
            for mode in (("default", "one") if rep % 2 == 0 else ("one", "default")):
                with threadpool_limits(1, user_api="blas") if mode == "one" else contextlib.nullcontext():
                    times[name][mode].append(per_round(call, torch_op, args.iterations))
    rows = []
    for name, t in times.items():
        d, o = statistics.median(t["default"]), statistics.median(t["one"])
        rows.append({"call": name, "us_default_blas_threads": 1e6 * d, "us_one_blas_thread": 1e6 * o,
                     "slowdown": d / o})
    print_table(rows, ["call", "us_default_blas_threads", "us_one_blas_thread", "slowdown"],
                title=f"a NumPy call, then a threaded torch product ({torch.get_num_threads()} torch threads)")
    pools = [{k: i.get(k) for k in ("internal_api", "num_threads", "version")} for i in threadpool_info()]
    write_json(args.out, "blas_threads", {"iterations": args.iterations, "reps": args.reps, "torch_threads":
                                          torch.get_num_threads(), "thread_pools": pools, "rows": rows})
    fig, axes = new_figure(width=7.0)
    ax = axes[0, 0]
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [r["us_default_blas_threads"] for r in rows], height=0.4, label="NumPy's BLAS, default threads")
    ax.barh(y + 0.2, [r["us_one_blas_thread"] for r in rows], height=0.4, label="NumPy's BLAS, one thread")
    ax.set_yticks(y, [r["call"] for r in rows], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("µs per round (the call, then a threaded torch product)")
    ax.legend(fontsize=7)
    print(save_figure(fig, args.out, "blas_threads"))


if __name__ == "__main__":
    main()
