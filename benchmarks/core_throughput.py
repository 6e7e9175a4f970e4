"""Issue 2: throughput of the core -- embedding and scoring A arms -- against a bare GEMM of the same shapes.

For ``A ∈ {10⁵, 10⁶}`` arms in ``d = 8``, dictionaries of ``m ∈ {256, 512}`` points, float32 and float64,
Gaussian kernel of width σ² = 5 (the BBKB paper's), this measures in one process:

* ``embed``: ``NystromEmbedding(S)(X)`` -> ``Z`` `(A, m)` (kernel ``k(X, S)``, `(A×d)(d×m)`, an ``exp``, and
  one `(A×m)·(m×m)` product with the projection), chunked over arms;
* ``embed_out``: the same into a preallocated output, ``emb(X, out=buf)`` -- like the GEMM baseline, it
  then pays no first-touch page faults for a fresh `(A, m)` output (1-4 GB at A = 10⁶);
* ``score``: ``DTCPosterior.score_embedded(Z, kdiag)`` -> ``μ̃, σ̃²`` `(A,)` (one `(A×m)·(m×m)` product with
  ``V⁻¹`` plus ``O(A·m)``), chunked over arms;
* ``gemm``: their baseline, a bare ``torch.matmul(Z, W, out=buf)`` of `(A, m)` by `(m, m)` in the same dtype
  (output preallocated, so the baseline measures the machine's GEMM rate, not page faults);
* ``score_cross``: ``DTCPosterior.score_cross(K, kdiag)`` from cached kernel rows ``K = k(X, S)`` `(A, m)`
  (what BKB/BBKB do since they cache ``k(S, arms)``): one `(A×m)·(m×m)` product with ``M = Wᵀ(I/λ − V⁻¹)W``
  plus ``O(A·m)``, against its own baseline ``matmul(K, W_m, out=buf)`` (``gemm_m``).

The first four are timed round-robin (gemm, embed, embed_out, score, gemm, ...), then ``gemm_m`` and
``score_cross`` the same way, so that each operation and its baseline share the machine's conditions;
the table reports the minimum over repeats.

Both core operations contain exactly one `(A×m)·(m×m)` product, so the achieved fraction of the GEMM
rate is ``t_gemm / t_op`` (DESIGN §6 target: ≥ 50 %). Peak memory is the extra resident memory of each
operation beyond its inputs: on CPU the process's peak RSS (``VmHWM``, reset through
``/proc/self/clear_refs``) minus the RSS before the call; on CUDA ``torch.cuda.max_memory_allocated``
minus the allocation before. The chunked path should need ``O(chunk·m + A)`` beyond its output; the
table also shows the unchunked score (``chunk = A``) for contrast.

Sizes: ``--quick`` A = 2·10⁴, m = 256; default A ∈ {10⁵, 10⁶}, m ∈ {256, 512}, 5 timed rounds at
A = 10⁵ and 2 at A = 10⁶ (no warm-up round there: it runs right after the same-m A = 10⁵ case);
``--full`` 5 rounds everywhere. Both dtypes unless ``--dtype`` is given explicitly.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import torch

from benchmarks.cli import base_parser, setup, size_of
from benchmarks.report import new_figure, print_table, save_figure, write_json
from benchmarks.timing import PeakMemory, sync, time_interleaved
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.gp.kernels import GaussianKernel
from torchbkb.gp.nystrom import DEFAULT_CHUNK

NAME = "core_throughput"
SIZES = {
    "quick": {"A": [20_000], "m": [256], "repeats": {20_000: 2}},
    "default": {"A": [100_000, 1_000_000], "m": [256, 512], "repeats": {100_000: 5, 1_000_000: 2}},
    "full": {"A": [100_000, 1_000_000], "m": [256, 512], "repeats": {100_000: 5, 1_000_000: 5}},
}
D = 8


# ---------------------------------------------------------------------------------------- measure
def _setup(A: int, m: int, dtype: torch.dtype, device: torch.device, seed: int):
    """Arms `(A, d)`, a dictionary of ``m`` points, the embedding and a DTC posterior fitted on 2,000 arms."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(A, D, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)  # (A, d) arms
    S = torch.randn(m, D, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)  # (m, d) dictionary
    emb = NystromEmbedding(GaussianKernel.from_width(5.0).to(device), S)
    n_fit = min(2000, A)
    yf = torch.randn(n_fit, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    post = DTCPosterior(emb, noise=0.2).fit(X[:n_fit], yf)
    kdiag = torch.ones(A, dtype=dtype, device=device)
    return gen, X, emb, post, kdiag


def measure_memory(A: int, m: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict:
    """Extra peak memory of embed, chunked score and unchunked score (bytes; ``None`` if unmeasurable).

    On CPU call it in a fresh process (see :func:`_memory_in_subprocess`): glibc keeps freed blocks
    resident, so the RSS of a process that already ran the timings says little.
    """
    _, X, emb, post, kdiag = _setup(A, m, dtype, device, seed)
    out = {}
    with torch.no_grad():
        with PeakMemory(device) as mem:
            Z = emb(X)  # (A, r): the output every later op reads
            sync(device)
        out["embed_peak_extra_bytes"] = mem.extra
        with PeakMemory(device) as mem:
            res = post.score_embedded(Z, kdiag)
            sync(device)
        del res
        out["score_peak_extra_bytes"] = mem.extra
        chunk = post.chunk_size
        post.chunk_size = A  # unchunked: the (A, r) temporaries are materialized
        with PeakMemory(device) as mem:
            res = post.score_embedded(Z, kdiag)
            sync(device)
        del res
        post.chunk_size = chunk
        out["score_unchunked_peak_extra_bytes"] = mem.extra
        del Z
        K = emb.kernel(X, emb.inducing_points)  # (A, m) cached kernel rows
        with PeakMemory(device) as mem:
            res = post.score_cross(K, kdiag)
            sync(device)
        del res
        out["score_cross_peak_extra_bytes"] = mem.extra
    return out


def _memory_in_subprocess(A: int, m: int, dtype: torch.dtype, seed: int) -> dict:
    import json
    import subprocess

    cmd = [sys.executable, "-m", "benchmarks.core_throughput", "--_memory-child",
           f"{A},{m},{str(dtype).replace('torch.', '')},{seed}"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=str(Path(__file__).resolve().parents[1]))
    if res.returncode != 0:
        print(f"  memory child failed: {res.stderr[-500:]}", flush=True)
        return {k: None
                for k in ("embed_peak_extra_bytes", "score_peak_extra_bytes", "score_unchunked_peak_extra_bytes",
                          "score_cross_peak_extra_bytes")}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _memory_child(spec: str) -> None:
    """Entry point of the memory subprocess: large blocks always mmap'd, so freeing returns them."""
    import ctypes
    import json

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB (fixed: no dynamic raise after frees)
        libc.mallopt(-1, 1 << 20)  # M_TRIM_THRESHOLD
    except OSError:
        pass
    A, m, dt, seed = spec.split(",")
    print(json.dumps(measure_memory(int(A), int(m), getattr(torch, dt), torch.device("cpu"), int(seed))))


def measure(A: int, m: int, dtype: torch.dtype, device: torch.device, repeats: int, warmup: int, seed: int = 0) -> dict:
    """Time (and memory) of embed / score / gemm for one shape."""
    gen, X, emb, post, kdiag = _setup(A, m, dtype, device, seed)
    elt = torch.finfo(dtype).bits // 8
    chunk = emb.chunk_size
    r = emb.rank
    out: dict = {"A": A, "m": m, "rank": r, "dtype": str(dtype).replace("torch.", ""), "chunk": chunk,
                 "repeats": repeats}
    with torch.no_grad():
        Z = emb(X)  # (A, r)
        W = torch.randn(r, r, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)  # (r, r) GEMM operand
        buf = torch.empty_like(Z)  # (A, r) preallocated: the baseline pays no page faults for its output
        buf_z = torch.empty_like(Z)  # the same for embed_out
        fns = {
            "gemm": lambda: torch.matmul(Z, W, out=buf),
            "embed": lambda: emb(X),
            "embed_out": lambda: emb(X, out=buf_z),
            "score": lambda: post.score_embedded(Z, kdiag),
        }
        for name, timing in time_interleaved(fns, device=device, repeats=repeats, warmup=warmup).items():
            out[name] = timing.to_dict()
        fns = buf = buf_z = Z = None  # release the (A, r) blocks
        K = emb.kernel(X, emb.inducing_points)  # (A, m): the cached kernel rows of BKB/BBKB
        Wm = torch.randn(m, m, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
        buf = torch.empty_like(K)
        fns = {"gemm_m": lambda: torch.matmul(K, Wm, out=buf), "score_cross": lambda: post.score_cross(K, kdiag)}
        for name, timing in time_interleaved(fns, device=device, repeats=repeats, warmup=warmup).items():
            out[name] = timing.to_dict()
        fns = buf = K = None
    W = X = emb = post = kdiag = None
    gc.collect()
    out.update(measure_memory(A, m, dtype, device, seed) if device.type == "cuda"
               else _memory_in_subprocess(A, m, dtype, seed))
    out["embed_output_bytes"] = A * r * elt
    # O(chunk·m + A) bound with small constants: the outputs (2A), the per-chunk temporaries (<= 4·chunk·r)
    out["score_bound_bytes"] = (2 * A + 4 * min(chunk, A) * r) * elt
    flops = 2.0 * A * r * r
    tg = out["gemm"]["min"]
    out["gemm_gflops"] = flops / tg / 1e9
    for op in ("embed", "score", "embed_out"):
        out[f"{op}_gflops_equiv"] = flops / out[op]["min"] / 1e9
        out[f"{op}_fraction_of_gemm"] = tg / out[op]["min"]
    out["score_cross_fraction_of_gemm"] = out["gemm_m"]["min"] / out["score_cross"]["min"]  # same (A×m)(m×m) shape
    out["score_cross_bound_bytes"] = (2 * A + 4 * min(chunk, A) * m) * elt
    return out


def plot(rows: list[dict], out_dir) -> str:
    fig, axes = new_figure(ncols=2, width=5.4)
    labels = [f"A={r['A']:.0e}\nm={r['m']}\n{r['dtype']}" for r in rows]
    xs = list(range(len(rows)))
    w = 0.2
    ax = axes[0][0]
    ops = (("gemm", "bare GEMM (A×m)(m×m)"), ("embed", "NystromEmbedding"), ("embed_out", "embed into out="),
           ("score", "score_embedded"))
    for k, (key, name) in enumerate(ops):
        ax.bar([x + (k - 1.5) * w for x in xs], [r[key]["min"] for r in rows], width=w, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("time [s] (min over repeats)")
    ax.set_xticks(xs, labels, fontsize=6)
    ax.legend(fontsize=7)
    ax = axes[0][1]
    w = 0.2
    ax.bar([x - 1.5 * w for x in xs], [100 * r["embed_fraction_of_gemm"] for r in rows], width=w, label="embed",
           color="tab:orange")
    ax.bar([x - 0.5 * w for x in xs], [100 * r["embed_out_fraction_of_gemm"] for r in rows], width=w,
           label="embed into out=", color="tab:green")
    ax.bar([x + 0.5 * w for x in xs], [100 * r["score_fraction_of_gemm"] for r in rows], width=w,
           label="score_embedded", color="tab:red")
    ax.bar([x + 1.5 * w for x in xs], [100 * r["score_cross_fraction_of_gemm"] for r in rows], width=w,
           label="score_cross", color="tab:purple")
    ax.axhline(50, color="red", ls="--", lw=1, label="target 50 %")
    ax.set_ylabel("% of the same-shape GEMM rate")
    ax.set_xticks(xs, labels, fontsize=6)
    ax.legend(fontsize=7)
    return str(save_figure(fig, out_dir, NAME))


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_memory-child"]:
        _memory_child(argv[1])
        return {}
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--A", type=str, default=None, help="comma-separated arm counts")
    p.add_argument("--m", type=str, default=None, help="comma-separated dictionary sizes")
    args = p.parse_args(argv)
    cfg = dict(SIZES[size_of(args)])
    if args.A:
        cfg["A"] = [int(float(a)) for a in args.A.split(",")]
    if args.m:
        cfg["m"] = [int(a) for a in args.m.split(",")]
    dtypes = [torch.float32, torch.float64] if "--dtype" not in argv else [getattr(torch, args.dtype)]
    device, _ = setup(args)
    rows = []
    t0 = time.perf_counter()
    for dtype in dtypes:
        for m in cfg["m"]:
            for A in cfg["A"]:
                reps = cfg["repeats"].get(A, 3)
                warm = 1 if A < 1_000_000 else 0
                row = measure(A, m, dtype, device, reps, warm, seed=args.seed)
                rows.append(row)
                print(
                    f"  {row['dtype']:>7} A={A:>8} m={m}: gemm {row['gemm']['min']:.4f}s ({row['gemm_gflops']:.1f} "
                    f"GFLOP/s)  "
                    f"embed {row['embed']['min']:.4f}s ({100 * row['embed_fraction_of_gemm']:.0f}%)  "
                    f"score {row['score']['min']:.4f}s ({100 * row['score_fraction_of_gemm']:.0f}%)  "
                    f"score_cross {row['score_cross']['min']:.4f}s ({100 * row['score_cross_fraction_of_gemm']:.0f}%)",
                    flush=True,
                )

    def mb(b):
        return float("nan") if b is None else b / 2**20

    table = [
        {
            "dtype": r["dtype"],
            "A": f"{r['A']:.0e}",
            "m": r["m"],
            "GEMM GFLOP/s": r["gemm_gflops"],
            "gemm [s]": r["gemm"]["min"],
            "embed [s]": r["embed"]["min"],
            "embed % GEMM": 100 * r["embed_fraction_of_gemm"],
            "embed into out= % GEMM": 100 * r["embed_out_fraction_of_gemm"],
            "score [s]": r["score"]["min"],
            "score % GEMM": 100 * r["score_fraction_of_gemm"],
            "score peak MiB (chunked)": mb(r["score_peak_extra_bytes"]),
            "O(chunk·m+A) bound MiB": mb(r["score_bound_bytes"]),
            "score peak MiB (unchunked)": mb(r["score_unchunked_peak_extra_bytes"]),
            "score_cross [s]": r["score_cross"]["min"],
            "score_cross % GEMM": 100 * r["score_cross_fraction_of_gemm"],
            "score_cross peak MiB": mb(r["score_cross_peak_extra_bytes"]),
            "embed peak MiB / output MiB": f"{mb(r['embed_peak_extra_bytes']):.0f} / {mb(r['embed_output_bytes']):.0f}",
        }
        for r in rows
    ]
    print_table(table, list(table[0]), f"core throughput on {device} (min over repeats; chunk = {DEFAULT_CHUNK} rows)")
    png = plot(rows, args.out)
    payload = {"size": size_of(args), "config": {**cfg, "d": D, "kernel": "Gaussian, width 5"}, "rows": rows,
               "table": table, "plot": png, "time": time.perf_counter() - t0}
    path = write_json(args.out, NAME, payload, device)
    print(f"wrote {path} and {png}")
    return payload


if __name__ == "__main__":
    main()
