"""TuRBO's trust region against hand-computed sequences (grow, shrink, restart), its candidates, and the
trust-region BKB loop: a whole loop in a few lines, its pieces, and typed errors that change nothing."""

import math

import pytest
import torch

from torchbkb.botorch import TrustRegion, TrustRegionBKB
from torchbkb.botorch.trust_region import num_candidates
from torchbkb.errors import InputDataError

F64 = torch.float64


def test_tolerances_are_the_papers():
    assert TrustRegion(20, 100).failure_tolerance == 1  # ⌈max(4/100, 20/100)⌉
    assert TrustRegion(60, 10).failure_tolerance == 6
    assert TrustRegion(2, 1).failure_tolerance == 4
    r = TrustRegion(5, 5)
    assert (r.length, r.length_min, r.length_max, r.success_tolerance) == (0.8, 0.5**7, 1.6, 3)
    assert num_candidates(5) == 2000 and num_candidates(20) == 4000 and num_candidates(60) == 5000


def test_grow_shrink_and_restart_follow_the_hand_computed_sequence():
    r = TrustRegion(dim=8, batch_size=4)  # τ_fail = ⌈max(1, 2)⌉ = 2
    values = [1.0, 2.0, 3.0, 3.0005, 2.0, 5.0, 5.0, 5.0, 5.0]
    lengths, counters = [], []
    for v in values:
        r.update(torch.tensor([v]))
        lengths.append(r.length)
        counters.append((r.success_counter, r.failure_counter))
    # 1, 2, 3: three successes -> 1.6; 3.0005 is within 1e-3·3 of 3: a failure; 2: failure -> 0.8;
    # 5: success; then 5, 5: failures -> 0.4; 5: failure (1)
    assert lengths == [0.8, 0.8, 1.6, 1.6, 0.8, 0.8, 0.8, 0.4, 0.4]
    assert counters == [(1, 0), (2, 0), (0, 0), (0, 1), (0, 0), (1, 0), (0, 1), (0, 0), (0, 1)]
    assert r.best_value == 5.0 and not r.restart_triggered
    for _ in range(2 * 6):  # six more halvings: 0.4 / 2⁶ = 2⁻⁷·0.8 < 2⁻⁷
        r.update(torch.tensor([0.0]))
    assert r.length == pytest.approx(0.4 / 64) and r.restart_triggered
    r.restart()
    assert (r.length, r.best_value, r.restarts, r.restart_triggered) == (0.8, -math.inf, 1, False)


def test_candidates_stay_in_the_region_and_perturb_at_least_one_coordinate():
    r = TrustRegion(dim=40, batch_size=10)
    center = torch.full((40,), 0.95, dtype=F64)
    ls = torch.linspace(0.5, 2.0, 40, dtype=F64)
    lb, ub = r.bounds(center, ls)
    w = ls / ls.mean()
    w = w / w.prod() ** (1 / 40)
    assert torch.allclose(ub - lb, torch.minimum(center + w * 0.4, torch.ones(40, dtype=F64)) - (center - w * 0.4))
    cand = r.candidates(center, ls, 3000, seed=0)
    assert bool(((cand >= lb) & (cand <= ub)).all())
    changed = cand != center
    assert bool(changed.any(-1).all())
    assert abs(float(changed.double().mean()) - 20 / 40) < 0.05  # each coordinate with probability min(1, 20/d)
    assert torch.equal(cand, r.candidates(center, ls, 3000, seed=0))


@pytest.mark.parametrize(
    "center, ls, match",
    [
        (torch.full((3,), 1.5, dtype=F64), torch.ones(3, dtype=F64), "unit cube"),
        (torch.tensor([0.5, float("nan"), 0.5], dtype=F64), torch.ones(3, dtype=F64), "finite"),
        (torch.full((2,), 0.5, dtype=F64), torch.ones(3, dtype=F64), "center"),
        (torch.full((3,), 0.5, dtype=F64), torch.tensor([1.0, -1.0, 1.0], dtype=F64), "lengthscale"),
    ],
)
def test_bad_regions_raise(center, ls, match):
    with pytest.raises(InputDataError, match=match):
        TrustRegion(3, 5).candidates(center, ls, 10)


def test_bad_states_raise_and_change_nothing():
    r = TrustRegion(3, 5)
    before = r.state_dict()
    for bad in (torch.tensor([]), torch.tensor([float("nan")])):
        with pytest.raises(InputDataError):
            r.update(bad)
    with pytest.raises(InputDataError):
        r.load_state_dict({"length": 1.0})
    for field, value in (("length", float("nan")), ("best_value", "1"), ("restart_triggered", 0), ("restarts", -1)):
        with pytest.raises(InputDataError, match=field):
            r.load_state_dict({**before, field: value})
    assert r.state_dict() == before
    for kw in (dict(dim=0, batch_size=1), dict(dim=2, batch_size=2.5), dict(dim=2, batch_size=2, length_min=2.0)):
        with pytest.raises(InputDataError):
            TrustRegion(**kw)


def _sphere(X):
    return -((X - 0.3) ** 2).sum(-1)


@pytest.mark.parametrize("acquisition", ["thompson", "bbkb"])
def test_a_whole_loop_in_a_few_lines(acquisition):
    bounds = torch.tensor([[0.0] * 4, [1.0] * 4], dtype=F64)
    loop = TrustRegionBKB(bounds, batch_size=10, acquisition=acquisition, seed=0)
    X, Y = loop.optimize(_sphere, budget=88)
    assert X.shape == (88, 4) and torch.equal(Y, _sphere(X))
    assert loop.best[1] > -0.02 and loop.models[0] is not None


def _spy_fits(monkeypatch, exhaust_warm: bool = False) -> list:
    """Record each fit's optimizer options and evaluations; ``exhaust_warm``: a warm fit reports its whole budget."""
    import torchbkb.botorch.trust_region_loop as trl

    calls = []
    fit = trl.fit_gpytorch_mll

    def spy(mll, **kw):
        out = fit(mll, **kw)
        options = (kw.get("optimizer_kwargs") or {}).get("options", {})
        if exhaust_warm and "maxfun" in options:
            mll.evaluations = options["maxfun"]
        calls.append((kw.get("optimizer_kwargs"), mll.evaluations))
        return out

    monkeypatch.setattr(trl, "fit_gpytorch_mll", spy)
    return calls


@pytest.mark.parametrize("user_options", [None, {"options": {"maxiter": 7}}])
def test_one_fit_per_proposal_and_a_warm_fit_costs_at_most_the_last_fit_from_the_defaults(monkeypatch, user_options):
    """Each proposal fits once; a fit from the defaults stops at FIT_FTOL; a warm fit also stops after the
    evaluations of the region's last fit from the defaults (and WARM_MAXITER); a user's own options win."""
    import torchbkb.botorch.trust_region_loop as trl

    calls = _spy_fits(monkeypatch)
    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=F64)
    fit_kwargs = None if user_options is None else {"optimizer_kwargs": user_options}
    loop = TrustRegionBKB(bounds, batch_size=5, n_init=6, fit_kwargs=fit_kwargs, seed=0)
    loop.optimize(_sphere, budget=36)  # the design, then 6 proposals
    assert len(calls) == 6
    if user_options is not None:
        assert all(kw == user_options for kw, _ in calls)
        return
    cold = {"options": {"ftol": trl.FIT_FTOL}}
    assert calls[0][0] == cold
    budget, warm = None, 0
    for kw, evaluations in calls:
        if kw == cold:
            budget = min(trl.WARM_MAXITER, evaluations)
        else:
            warm += 1
            assert kw == {"options": {"ftol": trl.FIT_FTOL, "maxiter": budget, "maxfun": budget}}
    assert warm >= 2


def test_a_region_whose_warm_fit_uses_its_whole_budget_fits_from_the_defaults_until_it_restarts(monkeypatch):
    import torchbkb.botorch.trust_region_loop as trl

    calls = _spy_fits(monkeypatch, exhaust_warm=True)
    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=F64)
    loop = TrustRegionBKB(bounds, batch_size=5, n_init=6, seed=0)
    loop.optimize(_sphere, budget=41)
    warm = [i for i, (kw, _) in enumerate(calls) if "maxfun" in kw["options"]]
    assert len(warm) == 1 and len(calls) == 7  # the first warm fit was its last
    assert all(kw == {"options": {"ftol": trl.FIT_FTOL}} for kw, _ in calls[warm[0] + 1 :])


def test_the_loops_seed_decides_its_thompson_draws_and_the_callers_rng_is_untouched():
    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=F64)
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        loop = TrustRegionBKB(bounds, batch_size=5, n_init=6, seed=0)
        X, _ = loop.optimize(_sphere, budget=21)
        after = torch.rand(3)
        torch.manual_seed(global_seed)
        assert torch.equal(after, torch.rand(3))  # the loop drew nothing from the global generator
        runs.append(X)
    assert torch.equal(runs[0], runs[1])


def test_several_regions_share_a_batch_and_restart_on_their_own():
    bounds = torch.tensor([[-1.0] * 3, [1.0] * 3], dtype=F64)
    loop = TrustRegionBKB(bounds, batch_size=6, num_regions=2, n_init=5, seed=1)
    first = loop.ask()
    assert first.shape == (10, 3)  # both regions' designs
    loop.tell(first, _sphere(first))
    second = loop.ask()
    assert second.shape == (6, 3)
    loop.tell(second[:4], _sphere(second[:4]))  # the first rows of a batch
    assert loop.Y.numel() == 14


def test_initialize_and_bad_tells_raise_and_change_nothing():
    bounds = torch.tensor([[0.0] * 2, [1.0] * 2], dtype=F64)
    loop = TrustRegionBKB(bounds, batch_size=4, seed=0)
    X0 = torch.rand(12, 2, dtype=F64)
    loop.initialize(X0, _sphere(X0))
    batch = loop.ask()
    assert batch.shape == (4, 2)  # no design: the model proposes at once
    for X, Y in ((batch, _sphere(batch)[:3]), (batch + 5.0, _sphere(batch)), (batch[:, :1], _sphere(batch)),
                 (batch, torch.full((4,), float("nan"), dtype=F64))):
        with pytest.raises(InputDataError):
            loop.tell(X, Y)
    assert loop.Y.numel() == 12
    loop.tell(batch, _sphere(batch))
    with pytest.raises(InputDataError, match="asked"):
        loop.tell(batch, _sphere(batch))
    for kw in (dict(bounds=torch.tensor([[1.0], [0.0]], dtype=F64)), dict(bounds=bounds, acquisition="ei"),
               dict(bounds=bounds, batch_size=0)):
        with pytest.raises(InputDataError):
            TrustRegionBKB(**kw)


@pytest.mark.parametrize("num_regions", [1, 2])
def test_the_users_model_modules_are_copied_for_each_model_and_never_fitted_in_place(num_regions):
    """``model_kwargs=turbo_modules(d)`` is the default: each model fits its own copy (a fit from the defaults starts
    from the user's values, and regions do not share a kernel), so both loops ask the same batches."""
    from torchbkb.botorch.trust_region_loop import turbo_modules

    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=F64)
    f = lambda X: _sphere(X) + 0.1 * torch.sin(9 * X).sum(-1)  # noqa: E731
    modules = turbo_modules(3)
    before = {k: v.clone() for k, v in modules["covar_module"].state_dict().items()}
    given = TrustRegionBKB(bounds, batch_size=5, num_regions=num_regions, seed=0, model_kwargs=modules)
    given.optimize(f, 80)
    default = TrustRegionBKB(bounds, batch_size=5, num_regions=num_regions, seed=0)
    default.optimize(f, 80)
    assert torch.equal(given.X, default.X)
    assert all(torch.equal(v, modules["covar_module"].state_dict()[k]) for k, v in before.items())
    if num_regions == 2:
        assert given.models[0].covar_module is not given.models[1].covar_module


def test_a_fit_from_the_defaults_whose_line_searches_stall_is_kept_where_it_stopped(monkeypatch):
    """Without priors BoTorch's retries repeat the same start, so one ``ABNORMAL`` line search (float32 evidence at
    its rounding floor: Levy-20 in float32 at evaluation 940) failed every attempt and stopped the loop with
    ``ModelFittingError``. The fit is then redone accepting such stops, with a warning, and the loop goes on."""
    import warnings as w

    from botorch.exceptions.errors import ModelFittingError
    from botorch.exceptions.warnings import OptimizationWarning

    import torchbkb.botorch.trust_region_loop as trl
    from torchbkb.botorch.trust_region import accept_stalled_line_search
    from torchbkb.errors import NumericsWarning

    def message(text, category=OptimizationWarning):
        return w.WarningMessage(text, category, "f.py", 1)

    abnormal = "`scipy_minimize` terminated with status OptimizationStatus.FAILURE, displaying original message " \
               "from `scipy.optimize.minimize`: ABNORMAL: "
    assert accept_stalled_line_search(message(abnormal)) and accept_stalled_line_search(message("x", UserWarning))
    assert not accept_stalled_line_search(message("terminated with status OptimizationStatus.FAILURE: NaN"))

    fit, handlers = trl.fit_gpytorch_mll, []

    def stalled(mll, **kw):
        handlers.append(kw.get("warning_handler"))
        if len(handlers) == 3 and kw.get("warning_handler") is None:  # the third fit's line searches stall
            raise ModelFittingError("All attempts to fit the model have failed.")
        return fit(mll, **kw)

    monkeypatch.setattr(trl, "fit_gpytorch_mll", stalled)
    loop = TrustRegionBKB(torch.tensor([[0.0] * 3, [1.0] * 3], dtype=F64), batch_size=5, seed=0, warm_start=False)
    with pytest.warns(NumericsWarning, match="region 0: its fit from the defaults ended in L-BFGS-B line searches"):
        loop.optimize(_sphere, 40)
    assert loop.Y.numel() == 40 and handlers[3] is accept_stalled_line_search
    assert all(h is None for i, h in enumerate(handlers) if i != 3)
