"""Numerics that never answer silently wrong: the bandits and posteriors are invariant to the units of the kernel
and the noise (or refuse them), the DTC posterior with a tiny noise is as accurate as the exact one or warns,
and float32 runs warn when the dictionary's conditioning makes the variances unreliable."""

import warnings

import pytest
import torch

from torchbkb import BBKB, BKB, GPBUCB, GPUCB, DTCPosterior, ExactPosterior, NumericsWarning, NystromEmbedding
from torchbkb.errors import InputDataError, NumericsError
from torchbkb.gp.kernels import GaussianKernel
from torchbkb.gp.linalg import inv_sqrt_factor
from torchbkb.gp.stable_scoring import reference_rls, rls_from_kernel_values

mpmath = pytest.importorskip("mpmath")

pytestmark = pytest.mark.usefixtures("one_thread")

ARMS = torch.rand(150, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
F = torch.sin(5 * ARMS[:, 0]) + ARMS[:, 1]


class Scaled:
    """``c · exp(-‖x - x'‖² / (2 · 0.2²))``: the Gaussian kernel in other units."""

    def __init__(self, c):
        self.c = c

    def __call__(self, X1, X2):
        return self.c * torch.exp(-torch.cdist(X1, X2) ** 2 / (2 * 0.2**2))


def _choices(cls, c, dtype, beta=0.3, steps=40, **kw):
    arms, f = ARMS.to(dtype), F.to(dtype)
    bandit = cls(arms, Scaled(c), noise=0.01 * c, beta=beta if beta == "theory" else beta * c**0.5, seed=0, **kw)
    picks = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericsWarning)
        for _ in range(steps):
            i = bandit.ask()
            bandit.tell(i, f[i] * c**0.5)
            picks += i.tolist()
    return picks


BANDITS = [(BKB, {}), (BBKB, {"batch_bound": 3.0}), (GPUCB, {}), (GPBUCB, {"batch_bound": 3.0})]


@pytest.mark.parametrize("cls,kw", BANDITS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("dtype,exponents",
                         [(torch.float64, (-300, -100, 100, 300)), (torch.float32, (-30, -16, 16, 30))])
def test_the_bandits_make_the_same_choices_in_any_units(cls, kw, dtype, exponents):
    """Kernel and noise times ``c``, rewards and width times ``√c`` (``c`` an even power of two: exact): the same
    picks."""
    ref = _choices(cls, 1.0, dtype, **kw)
    for e in exponents:
        assert _choices(cls, 2.0**e, dtype, **kw) == ref, f"c = 2^{e}"


@pytest.mark.parametrize("cls,kw", BANDITS[1:], ids=lambda v: getattr(v, "__name__", ""))
def test_the_theory_width_follows_the_units(cls, kw):
    """BBKB, GP-UCB and GP-BUCB's theory widths scale with √c. (BKB's does not: 000 Thm 2 has ``log(κ² t)``, which
    depends on the kernel's units as the paper prints it -- see docs/numerics.md.)"""
    ref = _choices(cls, 1.0, torch.float64, beta="theory", steps=20, **kw)
    assert _choices(cls, 2.0**-120, torch.float64, beta="theory", steps=20, **kw) == ref


@pytest.mark.parametrize("cls,kw", BANDITS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("c", [1e-200, 1e200])
def test_units_beyond_what_the_arithmetic_holds_are_refused(cls, kw, c):
    with pytest.raises(InputDataError, match="rescale the rewards"):
        cls(ARMS, Scaled(c), noise=0.01 * c, beta=0.3, seed=0, **kw)


def test_float32_units_are_refused_where_float32_under_or_overflows():
    with pytest.raises(InputDataError, match="float32"):
        BKB(ARMS.float(), Scaled(1e-20), noise=1e-22, beta=0.3)


def test_a_kernel_without_finite_prior_variances_is_refused():
    with pytest.raises(InputDataError, match="prior variances"):
        BKB(ARMS, Scaled(float("nan")), noise=0.1, beta=0.3)


@pytest.mark.parametrize("c", [2.0**-300, 2.0**300])
def test_the_posteriors_are_invariant_to_units_or_refuse(c):
    X, Xq = ARMS[:30], ARMS[100:107]
    y = F[:30]
    k1, kc = Scaled(1.0), Scaled(c)
    for make in (lambda k, lam: DTCPosterior(NystromEmbedding(k, X[:20]), noise=lam),
                 lambda k, lam: ExactPosterior(k, noise=lam)):
        m1, v1 = make(k1, 0.01).fit(X, y)(Xq)
        mc, vc = make(kc, 0.01 * c).fit(X, y * c**0.5)(Xq)
        torch.testing.assert_close(mc / c**0.5, m1, rtol=1e-12, atol=0)
        torch.testing.assert_close(vc / c, v1, rtol=1e-12, atol=0)
    with pytest.raises(InputDataError, match="rescale"):
        DTCPosterior(NystromEmbedding(Scaled(1e-200), X[:20]), noise=1e-202)


def _reference_variance(k, X, Xq, lam):
    """The exact GP posterior variance with 50 significant digits."""
    mpmath.mp.dps = 50
    K = mpmath.matrix(k(X, X).tolist())
    Kq = mpmath.matrix(k(Xq, X).tolist())
    Kinv = mpmath.inverse(K + lam * mpmath.eye(X.shape[0]))
    kqq = k(Xq, Xq).diagonal().tolist()
    return torch.tensor([float(kqq[i] - (Kq[i, :] * Kinv * Kq[i, :].T)[0]) for i in range(Xq.shape[0])],
                        dtype=torch.float64)


@pytest.mark.parametrize("lengthscale", [0.15, 0.3, 0.6])
@pytest.mark.parametrize("lam", [1e-2, 1e-4, 1e-6, 1e-8, 1e-10])
def test_the_dtc_posterior_with_a_tiny_noise_is_as_accurate_as_the_exact_one(lengthscale, lam):
    """With the dictionary = the data, DTC is the exact GP: its variances (and joint covariance) match a 50-digit
    reference to 1e-5 relative or within 20× of the float64 ExactPosterior's error (the one-product form alone
    is off by up to 10⁴ at λ = 1e-10 here; both errors are rounding of the kernel values at a condition number
    past 10¹⁰, and move by 2× with the order of the kernel's floating-point operations)."""
    g = torch.Generator().manual_seed(7)
    X = torch.rand(40, 2, dtype=torch.float64, generator=g)
    Xq = torch.cat([torch.rand(8, 2, dtype=torch.float64, generator=g), X[:8]])
    k = GaussianKernel(lengthscale)
    y = torch.sin(6 * X[:, 0])
    ref = _reference_variance(k, X, Xq, lam)
    post = DTCPosterior(NystromEmbedding(k, X), noise=lam).fit(X, y)
    exact = ExactPosterior(k, noise=lam).fit(X, y)
    exact_err = float(((exact(Xq)[1] - ref).abs() / ref).max())
    for var in (post(Xq)[1], post.joint(Xq)[1].diagonal()):
        assert float(((var - ref).abs() / ref).max()) < max(1e-5, 20 * exact_err)
    assert exact_err < 1e-3  # the float64 exact answer's own error depends on the BLAS (1.1e-4 with CUDA torch's)
    torch.testing.assert_close(post(Xq)[0], exact(Xq)[0], rtol=1e-4, atol=1e-6 * float(y.abs().max()))


def test_float32_runs_warn_when_the_dictionary_makes_variances_unreliable():
    dense = torch.rand(400, 2, generator=torch.Generator().manual_seed(3))
    f = torch.sin(5 * dense[:, 0])

    def run(dtype, lam):
        bandit = BKB(dense.to(dtype), GaussianKernel(0.3), noise=lam, beta=0.3, q_bar=50.0, seed=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(30):
                i = bandit.ask()
                bandit.tell(i, f.to(dtype)[i])
        ours = [w for w in caught if issubclass(w.category, NumericsWarning)
                and "variances at the dictionary points are off" in str(w.message)]
        assert all(w.filename == __file__ for w in ours)  # the user's line
        return ours

    assert len(run(torch.float32, 1e-4)) == 1  # once per bandit
    assert run(torch.float64, 1e-4) == []
    assert run(torch.float32, 0.5) == []


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_float64_runs_warn_when_the_fast_form_cancels_checked_on_their_own_kernel_rows(cls, fixed):
    # float64 bandits check with the kernel values they hold: the warning comes where the one-product form loses its
    # digits (a noise of 1e-12 here), not at a usable noise
    dense = torch.rand(400, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    f = torch.sin(5 * dense[:, 0])

    def warned(lam):
        kw = {"batch_bound": 2.0} if cls is BBKB else {}
        bandit = cls(dense, GaussianKernel(0.3), noise=lam, beta=0.3, q_bar=50.0, seed=0, **kw)
        bandit.fixed_capacity = fixed  # the update a GPU runs checks with its own whitening
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(30):
                i = bandit.ask()
                bandit.tell(i, f[i])
        ours = [w for w in caught if issubclass(w.category, NumericsWarning) and "dictionary points are off" in
                str(w.message)]
        assert all(w.filename == __file__ for w in ours)  # the user's line, on the eager and the fixed path
        return len(ours)

    assert warned(1e-12) == 1
    assert warned(1e-4) == 0


def test_the_reference_from_kernel_values_at_hand_is_the_reference_from_the_kernel():
    g = torch.Generator().manual_seed(0)
    S, X = torch.rand(12, 3, generator=g, dtype=torch.float64), torch.rand(40, 3, generator=g, dtype=torch.float64)
    k, counts = GaussianKernel(0.4), torch.randint(1, 4, (40,), generator=g).double()
    ref = reference_rls(k, S, X, counts, 1e-3)
    K_SS = k(S, S)
    for W in (None, inv_sqrt_factor(K_SS, name="K_S")):
        torch.testing.assert_close(rls_from_kernel_values(K_SS, k(X, S), counts, 1e-3, W), ref, rtol=1e-12, atol=0)


def test_a_float32_dtc_posterior_warns_when_its_kernel_values_cannot_carry_the_variances():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(300, 2, dtype=torch.float64, generator=g)
    y = torch.sin(5 * X[:, 0])

    def fit(lengthscale, m, lam):
        k = GaussianKernel(lengthscale)
        S = X[:m]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            post = DTCPosterior(NystromEmbedding(k, S.float()), noise=lam).fit(X.float(), y.float())
            var32 = post(X[:40].float())[1].double()
        var64 = DTCPosterior(NystromEmbedding(k, S), noise=lam).fit(X, y)(X[:40])[1]
        warned = [w for w in caught if issubclass(w.category, NumericsWarning)]
        return float(((var32 - var64).abs() / var64).max()), warned

    err, warned = fit(0.3, 12, 1e-3)  # cond(K_S) ≈ 3e4: float32 is fine
    assert err < 5e-3 and warned == []
    err, warned = fit(0.3, 30, 1e-3)  # cond(K_S) ≈ 8e7: off by 200 %
    assert err > 0.1 and len(warned) == 1 and "DTCPosterior" in str(warned[0].message)
    assert warned[0].filename == __file__  # the user's line (the check runs at the first read after the fit)


@pytest.mark.parametrize("cls", [BKB, BBKB])
@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("scan", ["numpy", "torch"])
def test_a_kernel_that_returns_nan_never_puts_nan_into_a_bandit(cls, fixed, scan, monkeypatch):
    """A newly pulled arm's NaN kernel row raises a NumericsError: checked on arrival (NumPy's scan) or with the
    update's own read (torch's, as on a GPU), the eager update or the fixed-capacity one. Either way the row and its
    arm are dropped, no NaN is scored, and the bandit goes on once the arm is excluded: later steps succeed or raise
    the same error."""
    from torchbkb.bandits import kernel_rows

    if scan == "torch":
        monkeypatch.setattr(kernel_rows, "HOST_DTYPES", ())

    class Holey:
        def __call__(self, X1, X2):
            K = torch.exp(-torch.cdist(X1, X2) ** 2 / 0.08)
            return K.masked_fill((X1[..., :, None, 0] > 0.9) & (X2[..., None, :, 0] < 0.1), float("nan"))

        def diag(self, X):
            return torch.ones(X.shape[:-1], dtype=X.dtype)

    from torchbkb.gp.kernels import as_kernel

    bandit = cls(ARMS, as_kernel(Holey(), diag=Holey().diag), noise=0.01, beta=0.3, seed=0)
    bandit.fixed_capacity = fixed
    errors = 0
    for _ in range(60):
        i = bandit.ask()
        try:
            bandit.tell(i, F[i])
        except NumericsError as err:
            assert "NaN/inf in the rows of arms" in str(err)
            errors += 1
            bandit.excluded[i] = True  # the user's way on: never that arm again
        mean, rls = bandit.scores()
        assert bool(torch.isfinite(mean).all() and torch.isfinite(rls).all())
    assert errors >= 1 and bandit.t > 20 + errors
    assert all(float(ARMS[a, 0]) <= 0.9 for a in bandit.dictionary.tolist())
