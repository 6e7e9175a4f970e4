"""A kernel or embedding that returns NaN/inf for some inputs: a round is learned whole or not at all.

The rule (``torchbkb.online.stream``): the round whose kernel values or features are not finite raises
``NumericsError`` before it writes anything; the rows before it are learned and counted, so the learner is
the learner fed only those rows, and it goes on learning from clean rows as if the bad one never came.
"""

import pytest
import torch

from torchbkb.errors import InputDataError, NumericsError
from torchbkb.online import PKAWV, IncrementalNystromBasis, KernelAWV, KORSDictionary, OnlineKRR, ProsNKONS
from torchbkb.online import TaylorEmbedding

from ._refs import DEVICES, learner_state, rbf, same_state, single_thread  # noqa: F401 (autouse fixture)


def nan_kernel(A, B):
    """The Gaussian kernel, NaN between inputs whose first coordinates lie past 0.9 and below 0.1."""
    K = rbf(A, B, 0.5)
    a, b = A[..., :, :1], B[..., :, 0].unsqueeze(-2)
    bad = ((a > 0.9) & (b < 0.1)) | ((a < 0.1) & (b > 0.9))
    return torch.where(bad, torch.full_like(K, float("nan")), K)


class NaNTaylor:
    """Taylor features, NaN for inputs whose first coordinate is past 0.95."""

    dim = 2

    def __init__(self):
        self.taylor = TaylorEmbedding(2, degree=2)

    def __call__(self, X):
        return torch.where(X[:, :1] > 0.95, float("nan"), self.taylor(X))


LEARNERS = {
    "KernelAWV": lambda X: KernelAWV(nan_kernel),
    "OnlineKRR": lambda X: OnlineKRR(nan_kernel),
    "PKAWV-KORS": lambda X: PKAWV(kernel=nan_kernel, dictionary="kors", beta=5.0, seed=0),
    "PKAWV-Nystrom": lambda X: PKAWV(kernel=nan_kernel, dictionary=X[X[:, 0] < 0.5][:15].clone()),
    "PKAWV-embedding": lambda X: PKAWV(embedding=NaNTaylor()),
    "ProsNKONS": lambda X: ProsNKONS(nan_kernel, beta=5.0, seed=0),
}


def _stream(n=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.9 + 0.05  # first coordinates in [0.05, 0.95)
    return X, torch.sin(4 * X[:, 0]) * X[:, 1]


def _bad_rows(X, learner_name):
    """Inputs made bad for the learner at rows 40 (a clean history before it) and 41."""
    X = X.clone()
    X[40, 0], X[41, 0] = 0.97, 0.98
    X[:40, 0] = X[:40, 0].clamp(0.1, 0.9)
    if learner_name != "PKAWV-embedding":
        X[5, 0] = 0.05  # a past input whose kernel value with rows 40 and 41 is NaN
    return X


def _learn(learner, X, y, entry):
    if entry == "update":
        learner.update(X, y)
    elif entry == "fit_stream":
        learner.fit_stream(X, y, chunk_size=16)
    else:
        for i in range(X.shape[0]):
            learner.step(X[i : i + 1], y[i : i + 1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ["update", "fit_stream", "step"])
@pytest.mark.parametrize("name", list(LEARNERS))
def test_a_bad_round_raises_and_the_learner_is_the_one_fed_the_rows_before_it(name, entry, device):
    """Rows 40 and 41 are bad; the embedding's blocked update (``update``, ``fit_stream``) learns the rows before
    row 40 in blocks, ``step`` one round at a time."""
    X, y = _stream()
    X, y = _bad_rows(X, name).to(device), y.to(device)
    probe = _stream(30, seed=1)[0].clamp(0.3, 0.7).to(device)  # inputs whose kernel values are finite with all
    learner = LEARNERS[name](X)
    with pytest.raises(NumericsError, match="expected finite") as info:
        _learn(learner, X, y, entry)
    err = info.value
    assert err.nonfinite and learner.num_rounds == 40
    if entry != "step":
        assert err.rows == (40,) and "at row 40 of X" in str(err) and "the 40 rows before it were learned" in str(err)
    else:
        assert err.rows == (0,) and "the learner's round 41" in str(err)
    ref = LEARNERS[name](X)
    _learn(ref, X[:40], y[:40], entry)
    assert same_state(learner_state(learner), learner_state(ref))  # buffers, counts, KORS draws, history
    if entry == "fit_stream":  # the forecasts of the rounds learned come with the error (row 40: 8 into a block)
        kept = LEARNERS[name](X).fit_stream(X[:40], y[:40], chunk_size=16)
        assert err.result.n_rounds == 40 and err.result.n_total == 120 and err.result.stopped_early
        assert torch.equal(err.result.predictions, kept.predictions) and torch.equal(err.result.losses, kept.losses)
    assert torch.equal(learner.predict(probe), ref.predict(probe))
    assert bool(torch.isfinite(learner.predict(probe)).all())

    # the next bad row raises too and changes nothing; clean rows after it are learned as if it never came
    with pytest.raises(NumericsError):
        learner.update(X[41:42], y[41:42])
    rest, y_rest = X[42:].clamp(0.3, 0.7), y[42:]
    learner.update(rest, y_rest)
    ref.update(rest, y_rest)
    assert learner.num_rounds == ref.num_rounds == 40 + rest.shape[0]
    assert torch.equal(learner.predict(probe), ref.predict(probe))


def _marked_kernel(m1, m2):
    """The Gaussian kernel, NaN between the inputs ``m1`` and ``m2`` only."""

    def k(A, B):
        K = rbf(A, B, 0.5)
        a_m1 = (A == m1).all(-1).unsqueeze(-1)
        a_m2 = (A == m2).all(-1).unsqueeze(-1)
        b_m1 = (B == m1).all(-1).unsqueeze(-2)
        b_m2 = (B == m2).all(-1).unsqueeze(-2)
        return torch.where((a_m1 & b_m2) | (a_m2 & b_m1), torch.full_like(K, float("nan")), K)

    return k


def test_pkawv_kors_a_new_direction_nan_only_against_the_history_puts_the_draw_back():
    """``m1`` stays out of the dictionary (it nearly repeats a point of it: p = 0.75, and the seed's draw is
    0.89); ``m2`` joins it (far from all: p = 1), and only its kernel value with ``m1``, read by the new
    direction's moments, is NaN."""
    a = torch.tensor([[0.2, 0.2]], dtype=torch.float64)
    m1, m2 = a.clone(), torch.tensor([[3.0, 3.0]], dtype=torch.float64)
    m1[0, 1] += 1e-12
    X = torch.cat([a, m1, m2, torch.rand(20, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)])
    y = torch.sin(X.sum(-1))

    def make():
        return PKAWV(kernel=_marked_kernel(m1[0], m2[0]), dictionary="kors", beta=1.5, seed=6)

    learner, ref = make(), make()
    with pytest.raises(NumericsError, match="against the past inputs") as info:
        learner.update(X, y)
    assert info.value.rows == (2,) and learner.num_rounds == 2
    assert learner.basis_indices.tolist() == [0] and len(learner.dictionary) == 1
    ref.update(X[:2], y[:2])
    assert same_state(learner_state(learner), learner_state(ref))
    assert len(ref.dictionary) == 1 and ref.dictionary.last_probability == pytest.approx(0.75)
    assert learner.dictionary.last_probability == ref.dictionary.last_probability
    assert torch.equal(learner.dictionary.generator.get_state(), ref.dictionary.generator.get_state())
    learner.update(X[3:], y[3:])
    ref.update(X[3:], y[3:])
    assert torch.equal(learner.predict(X), ref.predict(X))
    assert learner.basis_indices.tolist() == ref.basis_indices.tolist()


def test_kors_offer_with_nan_kernel_values_changes_nothing():
    kors = KORSDictionary(nan_kernel, beta=5.0, seed=0)
    kors.offer(torch.tensor([[0.05, 0.5]], dtype=torch.float64), index=0)
    before = (len(kors), kors.generator.get_state(), kors.last_probability)
    with pytest.raises(NumericsError, match="against the dictionary"):
        kors.offer(torch.tensor([[0.95, 0.5]], dtype=torch.float64), index=1)
    assert (len(kors), kors.last_probability) == (before[0], before[2])
    assert torch.equal(kors.generator.get_state(), before[1])


def test_kors_add_refuses_given_nan_kernel_values():
    kors = KORSDictionary(rbf, seed=0)
    kors.add(torch.zeros(1, 2, dtype=torch.float64), p=1.0, index=0)
    with pytest.raises(InputDataError, match="k_xI"):
        kors.add(torch.ones(1, 2, dtype=torch.float64), p=1.0, k_xI=torch.tensor([float("nan")]), k_xx=1.0)
    with pytest.raises(InputDataError, match="k_xx"):
        kors.add(torch.ones(1, 2, dtype=torch.float64), p=1.0, k_xI=torch.tensor([0.5]), k_xx=float("inf"))
    assert len(kors) == 1


@pytest.mark.parametrize("l, delta", [([float("nan")], 0.5), ([0.1], float("inf")), ([0.1], float("nan"))])
def test_basis_append_refuses_nonfinite_coordinates(l, delta):
    basis = IncrementalNystromBasis(rbf)
    basis.append(torch.zeros(1, 2, dtype=torch.float64), torch.zeros(0, dtype=torch.float64), 1.0)
    with pytest.raises(InputDataError):
        basis.append(torch.ones(1, 2, dtype=torch.float64), torch.tensor(l, dtype=torch.float64), delta)
    assert basis.size == 1
