"""Ax with ``ModelConfig(botorch_model_class=BKBModel)`` and nothing else: trials (with and without a known SEM),
best point, predictions and cross-validation."""

import logging
import math

import pytest
import torch

pytest.importorskip("ax")

from ax.adapter.cross_validation import cross_validate  # noqa: E402
from ax.analysis.plotly.cross_validation import CrossValidationPlot  # noqa: E402
from ax.api.client import Client  # noqa: E402
from ax.api.configs import RangeParameterConfig  # noqa: E402
from ax.api.utils.generation_strategy_dispatch import choose_generation_strategy  # noqa: E402
from ax.api.utils.structs import GenerationStrategyDispatchStruct  # noqa: E402
from ax.core.analysis_card import ErrorAnalysisCard  # noqa: E402
from ax.generators.torch.botorch_modular.surrogate import ModelConfig  # noqa: E402

from torchbkb.botorch import BKBModel  # noqa: E402


def _branin(x1, x2):
    quadratic = (x2 - 5.1 / (4 * math.pi**2) * x1**2 + 5 / math.pi * x1 - 6) ** 2
    return quadratic + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10


def _walk(card):
    yield card
    for child in getattr(card, "children", None) or []:
        yield from _walk(child)


@pytest.mark.parametrize("sem", [None, 0.5])
def test_ax_client_runs_with_bkb_model(sem):
    logging.getLogger("ax").setLevel(logging.WARNING)
    client = Client(random_seed=0)
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
            RangeParameterConfig(name="x2", parameter_type="float", bounds=(0.0, 15.0)),
        ]
    )
    client.configure_optimization(objective="-branin")
    gs = choose_generation_strategy(
        GenerationStrategyDispatchStruct(method="custom", initialization_budget=5, initialization_random_seed=0),
        model_config=ModelConfig(botorch_model_class=BKBModel),
    )
    client.set_generation_strategy(gs)
    for _ in range(9):
        for index, params in client.get_next_trials(max_trials=1).items():
            y = _branin(params["x1"], params["x2"])
            client.complete_trial(trial_index=index, raw_data={"branin": y if sem is None else (y, sem)})
    model = gs.adapter.generator.surrogate.model
    assert isinstance(model, BKBModel) and model.train_inputs[0].shape[-2] >= 8
    (data,) = gs.adapter.generator.surrogate.training_data
    if sem is None:
        assert data.Yvar is None
    else:  # the known noise (in Ax's transformed units) reached the model
        scale = model.outcome_transform.stdvs.square() if hasattr(model, "outcome_transform") else 1.0
        assert model.noise == pytest.approx(float((data.Yvar / scale).mean()), rel=1e-9)
    params, prediction, _, _ = client.get_best_parameterization()
    assert set(params) == {"x1", "x2"} and math.isfinite(prediction["branin"][0])
    (pred,) = client.predict([{"x1": 1.0, "x2": 2.0}])
    mean, sd = pred["branin"]
    assert math.isfinite(mean) and sd > 0
    results = cross_validate(adapter=gs.adapter)  # loads the full model's state_dict into each fold's model
    assert len(results) >= 8
    assert all(math.isfinite(float(r.predicted.means[0])) and float(r.predicted.covariance[0, 0]) > 0 for r in results)
    cards = client.compute_analyses(analyses=[CrossValidationPlot()], display=False)
    assert cards and not any(isinstance(c, ErrorAnalysisCard) for card in cards for c in _walk(card))
    assert torch.is_tensor(model.inducing_points)


def test_a_saved_client_restores_and_continues_with_no_user_code(tmp_path):
    logging.getLogger("ax").setLevel(logging.WARNING)
    client = Client(random_seed=0)
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(name="x1", parameter_type="float", bounds=(-5.0, 10.0)),
            RangeParameterConfig(name="x2", parameter_type="float", bounds=(0.0, 15.0)),
        ]
    )
    client.configure_optimization(objective="-branin")
    gs = choose_generation_strategy(
        GenerationStrategyDispatchStruct(method="custom", initialization_budget=4, initialization_random_seed=0),
        model_config=ModelConfig(botorch_model_class=BKBModel),
    )
    client.set_generation_strategy(gs)
    for _ in range(6):
        for index, params in client.get_next_trials(max_trials=1).items():
            client.complete_trial(trial_index=index, raw_data={"branin": _branin(params["x1"], params["x2"])})
    path = tmp_path / "client.json"
    client.save_to_json_file(str(path))
    restored = Client.load_from_json_file(str(path))
    for c in (client, restored):  # both continue: a BKBModel is fitted on the same data
        (index, params), = c.get_next_trials(max_trials=1).items()
        c.complete_trial(trial_index=index, raw_data={"branin": _branin(params["x1"], params["x2"])})
        assert index == 6
    assert "BKBModel" in path.read_text()  # the model class is stored by name and found again on load
    (a,), (b,) = client.predict([{"x1": 1.0, "x2": 2.0}]), restored.predict([{"x1": 1.0, "x2": 2.0}])
    assert a["branin"][0] == pytest.approx(b["branin"][0], rel=0.05) and math.isfinite(b["branin"][1])
