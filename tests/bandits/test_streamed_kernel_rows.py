"""Bandits whose dictionary kernel rows exceed ``kernel_cache_bytes`` stream them: the same choices, checkpoints
that resume, and no `(m, A)` tensor."""

import pytest
import torch

from helpers import LargestOutput
from torchbkb.bandits import BBKB, BKB
from torchbkb.gp.kernels import GaussianKernel


def _problem(A=600, seed=0):
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, generator=g, dtype=torch.float64)
    return arms, torch.sin(5 * arms[:, 0]) * torch.cos(3 * arms[:, 1])


def _run(bandit, f, steps):
    picks = []
    for _ in range(steps):
        idx = bandit.ask()
        bandit.tell(idx, f[idx])
        picks.append(idx.tolist())
    return picks


@pytest.mark.parametrize("cls, kw",
                         [(BKB, {"beta": 0.5}), (BKB, {"beta": "theory"}), (BBKB, {"beta": 0.5, "batch_bound": 3.0}),
                          (BBKB, {"beta": "theory", "batch_bound": 2.0})])
def test_streamed_rows_make_the_cached_choices(cls, kw):
    arms, f = _problem()
    cached = cls(arms, GaussianKernel(0.3), noise=0.01, seed=1, **kw)
    streamed = cls(arms, GaussianKernel(0.3), noise=0.01, seed=1, kernel_cache_bytes=0, **kw)
    # the same batches as multisets: within a batch of ~2,000 picks two arms tied to rounding can swap places
    assert [sorted(b) for b in _run(cached, f, 40)] == [sorted(b) for b in _run(streamed, f, 40)]
    assert streamed.streams_kernel_rows and not cached.streams_kernel_rows
    m_c, r_c = cached.scores()
    m_s, r_s = streamed.scores()
    assert torch.allclose(m_c, m_s, atol=1e-10) and torch.allclose(r_c, r_s, atol=1e-8)
    assert torch.equal(cached.dictionary, streamed.dictionary)


def test_cache_switches_with_the_dictionary_size():
    arms, f = _problem(A=400)
    per_row = 400 * 8
    bandit = BKB(arms, GaussianKernel(0.3), noise=0.01, seed=2, beta=0.5, kernel_cache_bytes=5 * per_row)
    ref = BKB(arms, GaussianKernel(0.3), noise=0.01, seed=2, beta=0.5)
    modes = set()
    for _ in range(40):
        i, j = bandit.ask(), ref.ask()
        assert torch.equal(i, j)
        bandit.tell(i, f[i])
        ref.tell(j, f[j])
        modes.add(bandit.streams_kernel_rows)
    assert modes == {True, False}  # it streamed while m > 5 and cached while m <= 5


def test_streamed_checkpoint_resumes_identically():
    arms, f = _problem()
    a = BBKB(arms, GaussianKernel(0.3), noise=0.01, seed=3, beta=0.5, kernel_cache_bytes=0)
    _run(a, f, 10)
    state = a.state_dict()
    b = BBKB(arms, GaussianKernel(0.3), noise=0.01, seed=3, beta=0.5, kernel_cache_bytes=0)
    b.load_state_dict(state)
    assert _run(a, f, 10) == _run(b, f, 10)


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_streamed_steps_form_no_m_by_A_tensor(cls):
    arms, f = _problem(A=20_000, seed=4)
    bandit = cls(arms, GaussianKernel(0.1), noise=0.001, seed=0, beta=1.0, kernel_cache_bytes=0, chunk_size=256,
                 row_cache_bytes=0)
    _run(bandit, f, 30)
    m, A = bandit.dictionary_size, arms.shape[0]
    assert m >= 8
    with LargestOutput() as rec:
        _run(bandit, f, 3)
    assert bandit.streams_kernel_rows
    assert rec.numel <= max(A * 2, 256 * (m + 1) * 2) < m * A, (rec.numel, m * A)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_finite_rows_names_every_row_with_a_non_finite_value(dtype, bad, device):
    """NumPy scans CPU float32/float64 rows, torch the others; both name the same rows, and finite rows come back as
    they are (a transposed view, a tensor that requires grad)."""
    from torchbkb.bandits.kernel_rows import finite_rows
    from torchbkb.errors import NumericsError

    rows = torch.rand(5, 7, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    assert finite_rows(rows, None) is rows
    view = rows.T  # (7, 5), not contiguous
    assert finite_rows(view, None) is view
    grad = rows.clone().requires_grad_(dtype != torch.float16 or device.type != "cpu")
    assert finite_rows(grad, None) is grad
    rows[1, 3] = bad
    rows[4, 0] = bad
    with pytest.raises(NumericsError, match=r"rows of arms \[11, 14\]") as named:
        finite_rows(rows, [10, 11, 12, 13, 14])
    assert named.value.arms == (11, 14)
    with pytest.raises(NumericsError, match=r"rows of arms \[11, 14\]") as named:
        finite_rows(rows, lambda: [10, 11, 12, 13, 14])  # names given on failure only
    assert named.value.arms == (11, 14)
    with pytest.raises(NumericsError, match=r"rows of positions \[0, 3\]") as unnamed:
        finite_rows(rows.T, None)  # (7, 5): its rows 0 and 3 hold them
    assert unnamed.value.arms == ()


@pytest.mark.parametrize("scan", ["numpy", "torch"])
def test_a_streamed_product_reads_its_chunks_finiteness_once(scan, monkeypatch):
    """``a @ rows`` over many chunks: where torch scans the chunks (a GPU), their finiteness is read once after the
    last chunk, not once a chunk; the product is the dense one, and a NaN in any chunk raises the row check's error
    (a NaN arm spoils its whole chunk through the kernel's centring: every row of S)."""
    from helpers import DeviceReads, HostReads
    from torchbkb.bandits import kernel_rows
    from torchbkb.errors import NumericsError

    if scan == "torch":
        monkeypatch.setattr(kernel_rows, "HOST_DTYPES", ())
    arms, _ = _problem(A=1000, seed=5)
    k = GaussianKernel(0.3)
    S, a = arms[:6], torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rows = kernel_rows.StreamedKernelRows(k, S, arms, chunk_size=64)  # 16 chunks
    with HostReads() as host, DeviceReads() as device:
        out = a @ rows
    assert torch.allclose(out, a @ k(S, arms), rtol=1e-12, atol=1e-12)
    assert len(host.calls) + len(device.names) == (2 if scan == "torch" else 0)  # the bool and its scalar
    holey = arms.clone()
    holey[700, 0] = float("nan")  # chunk 10
    with pytest.raises(NumericsError, match=r"rows of positions \[0, 1, 2, 3, 4, 5\]"):  # S's rows, unnamed
        a @ kernel_rows.StreamedKernelRows(k, S, holey, chunk_size=64)
    named = kernel_rows.StreamedKernelRows(k, S, holey, chunk_size=64, ids=[10, 11, 12, 13, 14, 15])
    with pytest.raises(NumericsError, match=r"rows of arms \[10, 11, 12, 13, 14, 15\]") as err:
        a @ named  # the dictionary's arms, whose rows k(s, ·) hold the NaN
    assert err.value.arms == (10, 11, 12, 13, 14, 15)
    with pytest.raises(NumericsError, match=r"rows of arms \[700\]") as err:
        named.T[torch.tensor([5, 700])]  # the arms' rows k(a, S), named by the arms
    assert err.value.arms == (700,)
