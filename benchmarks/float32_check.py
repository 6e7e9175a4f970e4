"""BBKB on Cadata with float32 arms: time, regret, and how far its RLS variances are from float64's.

The settings are :mod:`benchmarks.batch`'s (001 Sec. 4, constant width). Per seed, BBKB runs to T on
float32 arms; its final ``σ̃²`` of every arm is compared with the float64 DTC posterior on the same
dictionary and pulls. float32 kernel values carry a relative error of ~6e-8, which ``cond(K_S)`` amplifies
in ``k/λ − k_Sᵀ M k_S``: the small variances of well-pulled arms are the ones that suffer.

    python -m benchmarks.float32_check            # T = 10⁴, 3 seeds (~1 minute on 2 cores)
    python -m benchmarks.float32_check --quick    # T = 2,000, 1 seed

Writes ``<out>/float32_check.json``.
"""

from __future__ import annotations

import time

import torch

import torchbkb
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.gp.kernels import GaussianKernel

from benchmarks.batch import LAM, WIDTH, build, load_cadata
from benchmarks.cli import base_parser, setup, size_of
from benchmarks.report import print_table, write_json
from benchmarks.timing import sync

NAME = "float32_check"
SIZES = {"quick": {"T": 2000, "seeds": 1}, "default": {"T": 10_000, "seeds": 3}, "full": {"T": 10_000, "seeds": 10}}


def float32_check(arms32: torch.Tensor, arms64: torch.Tensor, f: torch.Tensor, T: int, seed: int,
                  device: torch.device) -> dict:
    """BBKB (constant width) on ``arms32`` `(A, d)` for T steps; its final ``σ̃²`` `(A,)` against the float64 DTC
    posterior on ``arms64`` with the same dictionary and pulls: relative errors (max, median, max over pulled arms)."""
    bandit = build("BBKB", "constant", arms32, T, seed)
    sync(device)
    t0 = time.perf_counter()
    hist = torchbkb.run(bandit, f, T, progress=False)
    sync(device)
    wall = time.perf_counter() - t0
    pulled = (bandit.counts > 0).nonzero().squeeze(1)
    emb = NystromEmbedding(GaussianKernel.from_width(WIDTH).to(device), arms64[bandit.dictionary])
    n = bandit.counts[pulled].to(torch.float64)
    post = DTCPosterior(emb, noise=LAM).fit(arms64[pulled], bandit.reward_sums[pulled] / n, n)
    rls64 = post(arms64)[1] / LAM
    rel = (bandit.scores()[1].to(torch.float64) - rls64).abs() / rls64  # (A,)
    return {
        "seed": seed, "wall_s": wall, "normalized_regret": hist.normalized_regret[-1],
        "batches": len(bandit.batch_sizes),
        "dictionary_size": bandit.dictionary_size, "rls_rel_err_max": float(rel.max()),
        "rls_rel_err_median": float(rel.median()),
        "rls_rel_err_pulled_max": float(rel[pulled].max()),
    }


def main(argv: list[str] | None = None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=None, help="horizon (default from the size)")
    args = p.parse_args(argv)
    cfg = dict(SIZES[size_of(args)])
    T = args.T or cfg["T"]
    device, _ = setup(args, default_threads=1)
    arms64, f = load_cadata(torch.float64, str(device))
    arms32, _ = load_cadata(torch.float32, str(device))
    rows = []
    for seed in range(args.seed, args.seed + cfg["seeds"]):
        rows.append(float32_check(arms32, arms64, f, T, seed, device))
        print(f"  seed {seed}: wall {rows[-1]['wall_s']:.2f} s, σ̃² max relative error "
              f"{rows[-1]['rls_rel_err_max']:.1e}", flush=True)
    print_table(rows, list(rows[0]), f"BBKB on float32 Cadata arms, T = {T}: σ̃² against the float64 posterior")
    payload = {"size": size_of(args), "config": cfg | {"T": T}, "rows": rows}
    path = write_json(args.out, NAME, payload, device)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
