import math

import pytest

from torchbkb.bandits.confidence import alpha_from_epsilon, bbkb_beta, bkb_beta, gpucb_beta, to_botorch_beta
from torchbkb.errors import InputDataError


def test_bkb_theorem2_formula():
    xi, lam, F, delta, eps, t, s = 0.1, 0.01, 2.0, 0.05, 0.5, 300, 12.5
    alpha = (1 + eps) / (1 - eps)
    ref = (2 * xi * math.sqrt(alpha * math.log(t) * s + math.log(1 / delta))
           + (1 + 1 / math.sqrt(1 - eps)) * math.sqrt(lam) * F)
    assert bkb_beta(s, t, noise_std=xi, lam=lam, F=F, delta=delta, epsilon=eps) == pytest.approx(ref, rel=1e-14)
    assert alpha_from_epsilon(eps) == pytest.approx(3.0)


def test_bbkb_theorem2_formula():
    ref = 2 * 0.3 * math.sqrt(7.0 + math.log(1e4)) + (1 + math.sqrt(2)) * math.sqrt(0.2) * 20
    assert bbkb_beta(7.0, noise_std=0.3, lam=0.2, F=20.0, delta=1e-4) == pytest.approx(ref, rel=1e-14)


def test_gpucb_and_botorch_conversion():
    ref = 2 * 0.1 * math.sqrt(3.0 + math.log(100)) + 0.1 * 1.0
    assert gpucb_beta(3.0, noise_std=0.1, lam=0.01, F=1.0, delta=0.01) == pytest.approx(ref)
    assert to_botorch_beta(3.0, 0.5) == pytest.approx(18.0)


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(noise_std=-1.0, lam=0.1, F=1.0, delta=0.1), "noise_std"),
        (dict(noise_std=0.1, lam=0.0, F=1.0, delta=0.1), "lam"),
        (dict(noise_std=0.1, lam=0.1, F=-1.0, delta=0.1), "F"),
        (dict(noise_std=0.1, lam=0.1, F=1.0, delta=1.0), "delta"),
    ],
)
def test_bad_parameters(kw, msg):
    with pytest.raises(InputDataError, match=msg):
        bbkb_beta(1.0, **kw)
    with pytest.raises(InputDataError, match="epsilon"):
        alpha_from_epsilon(1.0)
