import pytest
import torch

from torchbkb.errors import InputDataError
from torchbkb.online import FOGD, PKAWV, KernelAWV, OnlineLearner, StreamResult, TaylorEmbedding

from ._refs import single_thread  # noqa: F401 (autouse fixture)


def _stream(n, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1
    return X, torch.sin(3 * X[:, 0]) + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)


def _learners():
    k = lambda A, B: torch.exp(-0.5 * torch.cdist(A, B) ** 2)  # noqa: E731
    return [
        PKAWV(embedding=TaylorEmbedding(2, 3), lam=1.0),
        PKAWV(kernel=k, lam=1.0, dictionary="kors", seed=0),
        KernelAWV(k, lam=1.0),
        FOGD(2, num_features=100, lr=0.1, seed=0),
    ]


@pytest.mark.parametrize("i", range(4))
def test_regression_result(i):
    X, y = _stream(150)
    f = _learners()[i]
    res = f.fit_stream(X, y, chunk_size=32)
    assert isinstance(f, OnlineLearner) and isinstance(res, StreamResult)
    assert res.n_rounds == res.n_total == 150 == f.num_rounds and not res.stopped_early
    assert torch.allclose(res.losses, (y - res.predictions) ** 2)
    assert torch.allclose(res.cumulative_loss, res.losses.cumsum(0))
    assert res.time_per_round.shape == (150,) and bool((res.time_per_round >= 0).all())
    assert res.time_per_round.device.type == "cpu" and res.losses.dtype == torch.float64
    assert res.average_loss == pytest.approx(float(res.losses.mean()))
    assert res.total_time == pytest.approx(float(res.time_per_round.sum()))
    s = res.summary()
    assert s["n_rounds"] == 150 and s["task"] == "regression"
    assert s["cumulative_loss"] == pytest.approx(float(res.losses.sum()))


def test_classification_error_uses_the_sign():
    X, y = _stream(200)
    labels = torch.where(X[:, 0] + X[:, 1] > 0, 1.0, -1.0).double()
    res = PKAWV(embedding=TaylorEmbedding(2, 2), lam=1.0).fit_stream(X, labels, task="classification")
    signs = torch.where(res.predictions >= 0, 1.0, -1.0).double()
    assert torch.equal(res.losses, (signs != labels).double())
    assert res.average_loss < 0.2


def test_progress_bar(capsys):
    X, y = _stream(20)
    res = PKAWV(embedding=TaylorEmbedding(2, 2), lam=1.0).fit_stream(X, y, progress=True)
    assert res.n_rounds == 20
    assert "PKAWV" in capsys.readouterr().err


def test_predict_before_learning_is_zero_and_does_not_bind():
    f = PKAWV(embedding=TaylorEmbedding(2, 2), lam=1.0)
    assert torch.equal(f.predict(torch.rand(3, 2)), torch.zeros(3))
    assert not f.is_bound
    f.update(*_stream(5))  # float64 now fixes the stream dtype
    assert f.is_bound
    with pytest.raises(InputDataError, match="expected dtype torch.float64"):
        f.predict(torch.rand(3, 2))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(task="ranking"),
        dict(chunk_size=0),
        dict(chunk_size=2.0),
        dict(max_time=0.0),
        dict(max_time=-1.0),
        dict(task="classification"),  # y is not in {-1, +1}
    ],
)
def test_bad_stream_arguments_leave_the_learner_untouched(kwargs):
    X, y = _stream(10)
    f = PKAWV(embedding=TaylorEmbedding(2, 2), lam=1.0)
    with pytest.raises(InputDataError, match="expected"):
        f.fit_stream(X, y, **kwargs)
    assert not f.is_bound and f.num_rounds == 0 and f.precision is None


def test_step_takes_exactly_one_round():
    X, y = _stream(3)
    f = FOGD(2, seed=0)
    with pytest.raises(InputDataError, match=r"expected shape \(1, d\)"):
        f.step(X, y)
    assert f.step(X[:1], y[:1]).shape == (1,) and f.num_rounds == 1
