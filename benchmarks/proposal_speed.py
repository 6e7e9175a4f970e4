"""High-throughput BO at scale: the time of one proposal against the number of observations (trust-region BKB
against TuRBO-1 with SingleTaskGP), and fixed-q BBKB batches from huge candidate sets (time, extra peak memory).

Run through ``python -m benchmarks.high_throughput --study speed`` or ``--study fixed_q``.
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.report import new_figure, save_figure
from benchmarks.timing import PeakMemory


ACKLEY_BOX = (-32.768, 32.768)  # Ackley's box in every coordinate


def _ackley_region(n: int, d: int, seed: int):
    """``(f, U)``: the negated Ackley-``d`` on its box, and `(n, d)` unit-cube points uniform in the region of side
    0.8 around its optimum (the centre), the points both methods of the speed study are timed on."""
    import botorch.test_functions as tf

    fn = tf.Ackley(dim=d, negate=True).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    return fn, 0.5 + 0.8 * (torch.rand(n, d, generator=g, dtype=torch.float64) - 0.5)


def proposal_time(method: str, n: int, d: int, q: int, seed: int) -> tuple[float, int | None]:
    """Seconds of one proposal (fit + q picks) from ``n`` Ackley points in a region of side 0.8 around the optimum,
    and TuRBO-1's mean number of fit evaluations. Trust-region BKB alternates warm fits with fits from the defaults
    (:data:`~torchbkb.botorch.trust_region_loop.COLD_EVERY`), so both methods are timed over the same cycle: the
    mean of ``COLD_EVERY`` proposals after a first one, each batch told before the next (``n`` to
    ``n + (COLD_EVERY - 1) q`` points), TuRBO-1 fitting from the defaults at each as it does."""
    from benchmarks.high_throughput import optimizer
    from torchbkb.botorch.trust_region_loop import COLD_EVERY

    fn, U = _ackley_region(n, d, seed)
    lo, hi = ACKLEY_BOX
    X = lo + U * (hi - lo)
    bounds = torch.tensor([[lo] * d, [hi] * d], dtype=torch.float64)
    opt = optimizer(method, bounds, q, seed)
    if method == "turbo1":
        opt.tell(X, fn(X))
    else:
        opt.initialize(X[:-q], fn(X[:-q]))
        first = opt.ask()
        opt.tell(first, fn(first))  # n points in all, as TuRBO-1's
    times, evaluations = [], []
    for _ in range(COLD_EVERY):
        t0 = time.perf_counter()
        batch = opt.ask()
        times.append(time.perf_counter() - t0)
        evaluations.append(getattr(opt, "fit_evaluations", None))
        opt.tell(batch, fn(batch))
    return statistics.mean(times), (statistics.mean(evaluations) if method == "turbo1" else None)


def turbo_estimate(n: int, d: int, q: int, seed: int, evaluations: int) -> dict:
    """TuRBO-1's proposal at ``n`` points estimated from its parts: one exact-MLL evaluation (forward and backward,
    Cholesky) timed at ``n``, times the ``evaluations`` a measured fit took, plus its Thompson draw timed at ``n``."""
    from botorch.generation import MaxPosteriorSampling
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood
    from gpytorch.settings import max_cholesky_size

    from torchbkb.botorch import TrustRegion
    from torchbkb.botorch.trust_region import num_candidates
    from torchbkb.botorch.trust_region_loop import turbo_modules

    fn, U = _ackley_region(n, d, seed)
    lo, hi = ACKLEY_BOX
    Y = fn(lo + U * (hi - lo)).unsqueeze(-1)
    with max_cholesky_size(float("inf")):
        model = SingleTaskGP(U, Y, **turbo_modules(d))
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        mll.train()
        t0 = time.perf_counter()
        (-mll(model(*model.train_inputs), model.train_targets)).backward()
        per_eval = time.perf_counter() - t0
        model.eval()
        ones = torch.ones(d, dtype=torch.float64)
        cand = TrustRegion(d, q).candidates(U[Y.argmax()], ones, num_candidates(d), seed=seed)
        t0 = time.perf_counter()
        with torch.no_grad():
            MaxPosteriorSampling(model=model, replacement=False)(cand, num_samples=q)
        sampling = time.perf_counter() - t0
    return {"per_evaluation_s": per_eval, "evaluations": evaluations, "sampling_s": sampling,
            "seconds": per_eval * evaluations + sampling}


def speed(args) -> list[dict]:
    """One proposal against ``n``, TuRBO-1 and trust-region BKB interleaved; past ``--measure-max`` points TuRBO-1 is
    estimated from its parts (:func:`turbo_estimate`) with the evaluation count of its largest measured fit, and
    where its ``n × n`` matrices exceed ``--max-gib`` it is not run at all (its time extrapolated as ``n³`` from the
    largest ``n`` it ran at, recorded apart as ``extrapolated_s``)."""
    rows = []
    for d in args.dims:
        evaluations, largest = None, None
        for n in args.sizes:
            for method in ("turbo1", "trbkb_thompson"):
                gib = n * n * 8 / 2**30
                row = {"method": method, "d": d, "n": n, "seconds": None}
                if method == "turbo1" and 3 * gib > args.max_gib:  # K, its factor and a gradient's workspace
                    row["note"] = f"not run: {gib:.1f} GiB per n x n matrix"
                    if largest:  # its Cholesky work, n^3, from the largest n it ran at
                        row["extrapolated_s"] = largest[1] * (n / largest[0]) ** 3
                        row["note"] += f"; n^3 from n = {largest[0]}: {row['extrapolated_s']:.0f} s"
                elif method == "turbo1" and n > args.measure_max and evaluations:
                    row.update(turbo_estimate(n, d, args.q, args.seed, evaluations), note="estimated from its parts")
                else:
                    row["seconds"], fit = proposal_time(method, n, d, args.q, args.seed)
                    if method == "turbo1":
                        evaluations = row["fit_evaluations"] = fit
                if method == "turbo1" and row["seconds"] is not None:
                    largest = (n, row["seconds"])
                rows.append(row)
                print(f"d={d} n={n} {method}: {row}", flush=True)
    return rows


def plot_speed(rows: list[dict], out: str) -> None:
    fig, axes = new_figure(ncols=1, nrows=1, width=5.0, height=3.8)
    ax = axes[0][0]
    for k, (method, d) in enumerate(dict.fromkeys((r["method"], r["d"]) for r in rows)):
        mine = [r for r in rows if r["method"] == method and r["d"] == d]
        pts = [(r["n"], r["seconds"]) for r in mine if r["seconds"] is not None]
        if pts:
            ax.loglog(*zip(*pts), "o-" if method == "turbo1" else "s--", color=f"C{k}", label=f"{method}, d = {d}")
        far = [(r["n"], r["extrapolated_s"]) for r in mine if "extrapolated_s" in r]
        if far and pts:
            ax.loglog(*zip(pts[-1], *far), ":", marker="o", mfc="none", color=f"C{k}", label=f"{method}, d = {d}, n³")
    ax.set(xlabel="n (observations)", ylabel="seconds per proposal (fit + q picks)")
    ax.legend(fontsize=7)
    save_figure(fig, out, "high_throughput_speed")


def fixed_q(args) -> list[dict]:
    """A fixed-``q`` BBKB batch and 001's adaptive batch (``q=None``, today's memory bound) from ``A`` uniform
    candidates, for a BKBModel fitted on ``n`` Ackley points in ``d`` dimensions: seconds, extra peak memory
    (resident-set high-water mark) and its multiple of the candidates' own bytes, distinct picks."""
    import botorch.test_functions as tf
    from botorch.fit import fit_gpytorch_mll

    from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood, optimize_acqf_bbkb

    rows = []
    for d in args.dims:
        fn = tf.Ackley(dim=d, negate=True).to(torch.float64)
        g = torch.Generator().manual_seed(args.seed)
        X = torch.rand(args.fit_n, d, generator=g, dtype=torch.float64)
        lo, hi = ACKLEY_BOX
        model = BKBModel(X, fn(lo + X * (hi - lo)).unsqueeze(-1), seed=args.seed)
        fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
        for A in args.candidates:
            C = torch.rand(A, d, generator=g, dtype=torch.float64)
            for q in (None, args.fixed_q):
                with PeakMemory(torch.device("cpu")) as peak:
                    t0 = time.perf_counter()
                    out = optimize_acqf_bbkb(model, C, q=q, beta=2.0, return_indices=True)
                    seconds = time.perf_counter() - t0
                extra = None if peak.extra is None else peak.extra / 2**20
                row = {"d": d, "n": args.fit_n, "A": A, "q": q, "seconds": seconds, "picks": int(out.indices.numel()),
                       "distinct": int(out.indices.unique().numel()), "stop_reason": out.stop_reason,
                       "dictionary_size": model.dictionary_size, "extra_peak_mb": extra,
                       "candidates_mb": C.numel() * C.element_size() / 2**20}
                row["extra_over_candidates"] = None if extra is None else extra / row["candidates_mb"]
                rows.append(row)
                print(f"d={d} A={A} q={q}: {row}", flush=True)
            del C
    return rows


