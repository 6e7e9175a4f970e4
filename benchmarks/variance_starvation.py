"""BKB paper (000) Fig. 1: variance starvation of SoR, none for DTC with BKB's dictionary.

Setting of the paper: "a GP on [0, 1] using a Gaussian kernel with bandwidth σ² ≜ 100; f drawn from
the GP; t ∈ {6, 63, 215} evaluations sampled uniformly in [0, 0.5]; plot f and μ̃ₜ ± 3σ̃ₜ".

Kernel choice. Read as the width of ``exp(-‖x - x'‖²/(2σ²))``, σ² = 100 is a lengthscale of 10 on an
interval of length 1: f would be a straight line and nothing could starve. We read it as the
*inverse* bandwidth of ``exp(-σ²‖x - x'‖²) = exp(-100 (x - x')²)``, i.e. lengthscale
``ℓ = 1/√200 ≈ 0.071`` (about 14 lengthscales on [0, 1], matching the wiggly sample of the figure).
``--lengthscale`` changes it.

Everything else: noise ``ξ = 0.1`` (``λ = ξ² = 0.01``), f an exact GP sample drawn jointly at a plot
grid and at the evaluation points, evaluations nested across t (the first 6 of the 63, ...).

Three posteriors on the same data, GP scale:

* exact GP: ``μ, σ²`` (:class:`torchbkb.ExactPosterior`);
* DTC (BKB): dictionary built by BKB's resampling (000 Algorithm 1): ``S_1 = {x_1}``; after each
  evaluation every evaluated point enters ``S_s`` with probability ``min(1, q̄ σ̃²_{s-1}(x_i))``;
  ``σ̃²_DTC = k(x, x) − ‖z‖² + λ zᵀV⁻¹z``;
* SoR on the *same* dictionary and ``V``: the same mean, ``σ²_SoR = λ zᵀV⁻¹z`` -- DTC without the
  ``k(x, x) − ‖z‖²`` term, computed here from :class:`torchbkb.DTCPosterior`'s embedding and ``V_inv``.

Far from the dictionary ``z(x) → 0``: SoR's variance collapses to 0 on ``[0.5, 1]`` (starvation, the
band hugs the wrong mean), DTC's returns to the prior ``k(x, x)``. The JSON reports, per t and over
``--seeds`` repetitions, the mean predicted σ on [0.5, 1] and on [0, 0.5] for each method, the ratio
σ̃²/σ² to the exact variance (000 Theorem 1 bounds it in [1/α, α]), the dictionary size and the
fraction of grid points where f lies inside μ ± 3σ.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.cli import base_parser, setup, size_of
from benchmarks.report import new_figure, print_table, save_figure, write_json
from torchbkb import DTCPosterior, ExactPosterior, NystromEmbedding, RLSDictionary
from torchbkb.datasets import gp_sample
from torchbkb.gp.kernels import GaussianKernel

NAME = "variance_starvation"
TS = (6, 63, 215)
SIZES = {"quick": {"grid": 200, "seeds": 2}, "default": {"grid": 500, "seeds": 20},
         "full": {"grid": 1000, "seeds": 100}}


@dataclass
class Panel:
    """One t: the data, the dictionary and the three posteriors on the grid (GP scale, float64 CPU)."""

    t: int
    grid: torch.Tensor  # (G,)
    f_grid: torch.Tensor  # (G,)
    X: torch.Tensor  # (t,) evaluations
    y: torch.Tensor  # (t,) rewards
    dictionary: torch.Tensor  # (m,) dictionary points
    exact: tuple[torch.Tensor, torch.Tensor]  # mean, var on the grid
    dtc: tuple[torch.Tensor, torch.Tensor]
    sor: tuple[torch.Tensor, torch.Tensor]


def simulate(
    seed: int = 0,
    *,
    ts: tuple[int, ...] = TS,
    grid_size: int = 500,
    lengthscale: float = 1.0 / math.sqrt(200.0),
    lam: float = 0.01,
    q_bar: float = 2.0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float64,
) -> list[Panel]:
    """Draw f and the evaluations, run BKB's dictionary resampling, return one :class:`Panel` per t.

    Args:
        seed: seed of f, of the evaluation points and noise, and of the dictionary draws.
        ts: numbers of evaluations (nested: the first ``ts[0]`` are among the first ``ts[1]``...).
        grid_size: points of the plot grid on [0, 1].
        lengthscale: Gaussian kernel lengthscale (see the module docstring).
        lam: ``λ = ξ²``, the noise variance of the rewards and of the posteriors.
        q_bar: BKB's oversampling.
        device: where the posteriors are computed.
        dtype: their dtype.
    """
    if min(ts) < 2:
        raise ValueError(f"ts: expected numbers of evaluations >= 2, got {ts}")
    T = max(ts)
    gen = torch.Generator().manual_seed(seed)
    grid = torch.linspace(0.0, 1.0, grid_size, dtype=torch.float64)
    X_eval = 0.5 * torch.rand(T, generator=gen, dtype=torch.float64)  # uniform in [0, 0.5]
    pts = torch.cat([grid, X_eval]).unsqueeze(-1)  # (G + T, 1): f drawn jointly at both
    f = gp_sample(pts, kernel="rbf", lengthscale=lengthscale, seed=seed, method="exact")
    noise = math.sqrt(lam) * torch.randn(T, generator=gen, dtype=torch.float64)
    f_grid, y_all = f[:grid_size], f[grid_size:] + noise

    kernel = GaussianKernel(lengthscale=lengthscale)
    Xd = X_eval.unsqueeze(-1).to(device=device, dtype=dtype)  # (T, 1)
    yd = y_all.to(device=device, dtype=dtype)
    Gd = grid.unsqueeze(-1).to(device=device, dtype=dtype)  # (G, 1)
    sampler = RLSDictionary(q_bar=q_bar, generator=torch.Generator().manual_seed(seed + 1))

    panels = []
    dict_idx = torch.tensor([0])  # S_1 = {x_1}
    post = DTCPosterior(NystromEmbedding(kernel, Xd[:1]), noise=lam).fit(Xd[:1], yd[:1])
    for s in range(2, T + 1):
        # BKB: each evaluated point enters S_s w.p. min(1, q̄ σ̃²_{s-1}(x_i)), σ̃² of the previous posterior
        keep = (sampler.resample(post.rls(Xd[:s]).to(torch.float64).cpu()) if post is not None
                else torch.ones(s, dtype=torch.bool))
        dict_idx = keep.nonzero().squeeze(1)
        if dict_idx.numel() == 0:
            post = None  # S = ∅: the DTC posterior is the prior
        else:
            post = DTCPosterior(NystromEmbedding(kernel, Xd[dict_idx.to(device)]), noise=lam).fit(Xd[:s], yd[:s])
        if s in ts:
            panels.append(_panel(s, grid, f_grid, X_eval, y_all, dict_idx, post, kernel, lam, Xd, yd, Gd))
    return panels


def sor_posterior(post: DTCPosterior, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Subset-of-regressors mean and GP-scale variance ``λ zᵀV⁻¹z`` from a fitted :class:`DTCPosterior`.

    Args:
        post: the DTC posterior (its embedding, ``V_inv`` and ``weights`` are reused).
        Xq: `(q, d)` query points.

    Returns:
        ``(mean, var)``, `(q,)` each; the mean is DTC's.
    """
    with torch.no_grad():
        Z = post.embedding(Xq)  # (q, r)
        V_inv = post.V_inv.to(Z.dtype)  # (r, r)
        mean = Z @ post.weights.to(Z.dtype)
        quad = ((Z @ V_inv) * Z).sum(-1)  # zᵀ V⁻¹ z
    return mean, post.lam * quad.clamp_min(0.0)


def _panel(s, grid, f_grid, X_eval, y_all, dict_idx, post, kernel, lam, Xd, yd, Gd) -> Panel:
    with torch.no_grad():
        ex = ExactPosterior(kernel, noise=lam).fit(Xd[:s], yd[:s])
        exact = tuple(v.to("cpu", torch.float64) for v in ex(Gd))
        if post is None:
            dtc = (torch.zeros_like(grid), torch.ones_like(grid))  # S = ∅: the prior
            sor = (torch.zeros_like(grid), torch.zeros_like(grid))
        else:
            dtc = tuple(v.to("cpu", torch.float64) for v in post(Gd))
            sor = tuple(v.to("cpu", torch.float64) for v in sor_posterior(post, Gd))
    return Panel(s, grid, f_grid, X_eval[:s], y_all[:s], X_eval[dict_idx], exact, dtc, sor)


def panel_numbers(p: Panel) -> dict:
    """Summary numbers of one panel (σ on the two halves, ratio to exact, coverage of ±3σ)."""
    right, left = p.grid >= 0.5, p.grid <= 0.5
    out = {"t": p.t, "m": int(p.dictionary.numel())}
    for name, (mu, var) in (("exact", p.exact), ("dtc", p.dtc), ("sor", p.sor)):
        sd = var.clamp_min(0).sqrt()
        out[f"{name}_sigma_right"] = float(sd[right].mean())
        out[f"{name}_sigma_left"] = float(sd[left].mean())
        out[f"{name}_coverage"] = float(((p.f_grid - mu).abs() <= 3 * sd).double().mean())
        out[f"{name}_coverage_right"] = float(((p.f_grid - mu).abs() <= 3 * sd)[right].double().mean())
    for name in ("dtc", "sor"):
        ratio = getattr(p, name)[1] / p.exact[1]
        out[f"{name}_var_ratio_min"] = float(ratio.min())
        out[f"{name}_var_ratio_max"] = float(ratio.max())
    out["dtc_mean_max_abs_diff"] = float((p.dtc[0] - p.exact[0]).abs().max())
    return out


def plot(panels: list[Panel], out_dir, name: str = NAME, title: str = ""):
    """Three panels: f, exact / DTC / SoR mean ± 3σ, evaluations and dictionary points."""
    fig, axes = new_figure(ncols=len(panels), width=4.6, height=3.6)
    styles = (("exact GP", "exact", "tab:green"), ("DTC (BKB)", "dtc", "tab:blue"), ("SoR", "sor", "tab:red"))
    for ax, p in zip(axes[0], panels):
        g = p.grid.numpy()
        ax.plot(g, p.f_grid.numpy(), color="black", lw=1.4, label="f")
        for label, key, color in styles:
            mu, var = getattr(p, key)
            sd = var.clamp_min(0).sqrt().numpy()
            mu = mu.numpy()
            if key == "exact":  # dashed edges, so the DTC band underneath stays visible
                ax.plot(g, mu, color=color, lw=1.0, ls="--", label=f"{label} μ ± 3σ")
                ax.plot(g, mu - 3 * sd, color=color, lw=0.9, ls="--")
                ax.plot(g, mu + 3 * sd, color=color, lw=0.9, ls="--")
            else:
                ax.plot(g, mu, color=color, lw=1.0, label=f"{label} μ ± 3σ")
                ax.fill_between(g, mu - 3 * sd, mu + 3 * sd, color=color, alpha=0.18, lw=0)
        ax.plot(p.X.numpy(), p.y.numpy(), "k.", ms=3, alpha=0.6, label="evaluations")
        lo = float(min(p.f_grid.min(), p.exact[0].min())) - 3.5
        ax.plot(p.dictionary.numpy(), [lo] * p.dictionary.numel(), "b|", ms=10,
                label=f"dictionary (m={p.dictionary.numel()})")
        ax.axvline(0.5, color="gray", lw=0.6, ls=":")
        ax.set_title(f"t = {p.t}")
        ax.set_xlabel("x")
        ax.set_ylim(lo - 0.5, float(p.f_grid.max()) + 4.0)
        ax.legend(fontsize=6, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, out_dir, name)


def main(argv: list[str] | None = None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--lengthscale", type=float, default=1.0 / math.sqrt(200.0),
                   help="default 1/√200: exp(-100 (x-x')²)")
    p.add_argument("--lam", type=float, default=0.01)
    p.add_argument("--q-bar", type=float, default=2.0)
    p.add_argument("--seeds", type=int, default=None, help="repetitions for the numbers (the plot uses --seed)")
    args = p.parse_args(argv)
    cfg = dict(SIZES[size_of(args)])
    if args.seeds is not None:
        cfg["seeds"] = args.seeds
    device, dtype = setup(args, default_threads=1)
    kw = dict(grid_size=cfg["grid"], lengthscale=args.lengthscale, lam=args.lam, q_bar=args.q_bar, device=device,
              dtype=dtype)
    t0 = time.perf_counter()
    panels = simulate(args.seed, **kw)
    title = (f"000 Fig. 1: k = exp(-(x-x')²/(2ℓ²)), ℓ = {args.lengthscale:.4f}, λ = {args.lam}, q̄ = {args.q_bar}; "
             f"evaluations uniform in [0, 0.5]")
    png = plot(panels, args.out, NAME, title)
    per_seed = [[panel_numbers(q) for q in simulate(args.seed + s, **kw)] for s in range(cfg["seeds"])]
    rows, agg = [], []
    for j, t in enumerate(TS):
        nums = [ps[j] for ps in per_seed]
        mean = {k: statistics.fmean(n[k] for n in nums) for k in nums[0]}
        agg.append(mean)
        rows.append(
            {
                "t": t,
                "m (mean)": mean["m"],
                "σ exact [.5,1]": mean["exact_sigma_right"],
                "σ DTC [.5,1]": mean["dtc_sigma_right"],
                "σ SoR [.5,1]": mean["sor_sigma_right"],
                "σ exact [0,.5]": mean["exact_sigma_left"],
                "σ DTC [0,.5]": mean["dtc_sigma_left"],
                "σ̃²/σ² DTC min..max": f"{min(n['dtc_var_ratio_min'] for n in nums):.2f}.."
                                       f"{max(n['dtc_var_ratio_max'] for n in nums):.2f}",
                "f in ±3σ [.5,1]: exact/DTC/SoR": f"{mean['exact_coverage_right']:.2f}/"
                                                  f"{mean['dtc_coverage_right']:.2f}/{mean['sor_coverage_right']:.2f}",
            }
        )
    print_table(rows, list(rows[0]), f"variance starvation, means over {cfg['seeds']} seeds ({device}, {args.dtype})")
    payload = {
        "size": size_of(args),
        "config": {**cfg, "ts": TS, "lengthscale": args.lengthscale, "lam": args.lam, "q_bar": args.q_bar,
                   "seed": args.seed},
        "kernel_choice": "exp(-100 (x - x')^2): the paper's 'bandwidth σ² = 100' read as inverse bandwidth; "
        "lengthscale 1/sqrt(200)",
        "mean_over_seeds": agg,
        "per_seed": per_seed,
        "plotted_seed": [panel_numbers(q) for q in panels],
        "plot": str(png),
        "time": time.perf_counter() - t0,
    }
    path = write_json(args.out, NAME, payload, device)
    print(f"wrote {path} and {png}")
    return payload


if __name__ == "__main__":
    main()
