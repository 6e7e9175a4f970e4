"""sample_dictionary past one chunk of the embedding: the last round follows at once, and stays accurate."""

import torch

from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.botorch import sample_dictionary
from torchbkb.gp.kernels import GaussianKernel
from torchbkb.gp.nystrom import DEFAULT_CHUNK

F64 = torch.float64


class CountingKernel(GaussianKernel):
    """A Gaussian kernel that counts the rows of its first argument: the points a replay embeds."""

    def __init__(self, lengthscale):
        super().__init__(lengthscale)
        self.rows = 0

    def forward(self, X1, X2):
        self.rows += X1.shape[-2]
        return super().forward(X1, X2)


def test_a_replay_past_one_chunk_embeds_about_two_passes_and_its_posterior_is_accurate():
    n, lam = 2 * DEFAULT_CHUNK + 7_000, 0.01
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, 1, generator=g, dtype=F64)
    k = CountingKernel(0.1)
    S = sample_dictionary(k, X, lam, generator=torch.Generator().manual_seed(1))
    # doubling rounds to one chunk (2 chunks of rows), then the last round (the n points once, their features kept
    # between its two passes): 1.84 n here; doubling rounds to n would embed about 5.9 n
    assert k.rows <= 2 * n
    assert 2 <= S.shape[0] < 200  # a smooth 1-d kernel: small effective dimension
    # 000 Theorem 1: the DTC variance within constant factors of the exact one (a 500-point grid: near exact here)
    Xq = torch.rand(200, 1, generator=g, dtype=F64)
    grid = torch.linspace(0, 1, 500, dtype=F64).unsqueeze(-1)
    y = torch.zeros(n, dtype=F64)
    v = DTCPosterior(NystromEmbedding(GaussianKernel(0.1), S), noise=lam).fit(X, y)(Xq)[1]
    ref = DTCPosterior(NystromEmbedding(GaussianKernel(0.1), grid), noise=lam).fit(X, y)(Xq)[1]
    assert bool((v >= ref / 3).all()) and bool((v <= 3 * ref).all())
    assert float((v / ref).max()) > 0.5  # not vacuous: the same scale


def test_the_last_round_scores_with_the_features_it_kept_and_draws_the_same_dictionary(monkeypatch):
    """Keeping the last round's features (up to ``KEEP_FEATURE_BYTES``) saves one embedding of the points and
    changes no value: the same dictionary as embedding them twice."""
    import torchbkb.sampling.dictionary_replay as replay

    n, lam = DEFAULT_CHUNK + 5_000, 0.01
    X = torch.rand(n, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    drawn = {}
    # all, none, or the last round's second chunk only (its 5,000 rows of rank 220 hold 8.8 MB, the first 28.8 MB)
    for keep in (replay.KEEP_FEATURE_BYTES, 0, 16 * 2**20):
        monkeypatch.setattr(replay, "KEEP_FEATURE_BYTES", keep)
        k = CountingKernel(0.2)
        drawn[keep] = (sample_dictionary(k, X, lam, generator=torch.Generator().manual_seed(4)), k.rows)
    (S, rows), (S0, rows0), (S1, rows1) = drawn.values()
    assert torch.equal(S, S0) and torch.equal(S, S1)
    assert rows0 - rows == n  # one embedding of the n points fewer
    assert rows < rows1 < rows0  # a budget under the features keeps some chunks
