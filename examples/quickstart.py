"""Quick start of the core modules on the bundled California housing arms.

A DTC posterior on a dictionary chosen by BKB's variance-based (ridge leverage score) sampling,
next to the exact GP on the same data: prediction error, variance ratio (000 Theorem 1 says
σ²/α <= σ̃² <= ασ²), dictionary size and time.

Run from the repository root:  python examples/quickstart.py
"""

from __future__ import annotations

import time

import torch

import torchbkb
from torchbkb.datasets import load
from torchbkb.gp.kernels import GaussianKernel


def main() -> None:
    torch.manual_seed(0)
    X, y = load("cadata")  # standardized arms (20640, 8) and rewards (20640,)
    n, lam = 2000, 0.2
    idx = torch.randperm(len(X))[:n]
    Xtr, ytr, Xte, yte = X[idx], y[idx], X[:5000], y[:5000]
    kernel = GaussianKernel.from_width(5.0)

    t0 = time.perf_counter()
    exact = torchbkb.ExactPosterior(kernel, noise=lam).fit(Xtr, ytr)
    m_ex, v_ex = exact(Xte)
    t_exact = time.perf_counter() - t0

    # BKB-style dictionary: start from one point, resample from the training set by σ̃² a few times
    t0 = time.perf_counter()
    dic = torchbkb.RLSDictionary(q_bar=2.0, seed=0)
    post = torchbkb.DTCPosterior(torchbkb.NystromEmbedding(kernel, Xtr[:1]), noise=lam).fit(Xtr, ytr)
    for _ in range(5):
        keep = dic.resample(post.rls(Xtr))
        post.set_inducing_points(Xtr[keep])
    m_dtc, v_dtc = post(Xte)
    t_dtc = time.perf_counter() - t0

    ratio = v_dtc / v_ex
    print(f"train n={n}, test A={len(Xte)}, λ={lam}, Gaussian kernel σ²=5")
    print(f"exact GP : rmse {float((m_ex - yte).pow(2).mean().sqrt()):.4f}   time {t_exact:.2f}s")
    print(
        f"DTC (BKB): rmse {float((m_dtc - yte).pow(2).mean().sqrt()):.4f}   time {t_dtc:.2f}s   "
        f"dictionary m={post.embedding.num_inducing}   σ̃²/σ² in [{float(ratio.min()):.3f}, {float(ratio.max()):.3f}]"
    )


if __name__ == "__main__":
    main()
