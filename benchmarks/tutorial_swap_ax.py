"""The Ax flows of :mod:`benchmarks.tutorial_swap`: Ax's Client with ``BKBModel`` or ``SingleTaskGP`` as its
``botorch_model_class`` (its modular BoTorch generator, its multi-objective loop and its sensitivity analysis)."""

from __future__ import annotations

import math
import time

import torch

__all__ = ["ax_analyses", "ax_modular"]

F64 = torch.float64


def ax_modular(kind, seed, quick, objectives=1):
    """Ax's Client with ``ModelConfig(botorch_model_class=...)``: Branin's best predicted value (or, with two
    objectives, the hypervolume of BraninCurrin's observed outcomes)."""
    import logging

    from ax.api.client import Client
    from ax.api.configs import RangeParameterConfig
    from ax.api.utils.generation_strategy_dispatch import choose_generation_strategy
    from ax.api.utils.structs import GenerationStrategyDispatchStruct
    from ax.generators.torch.botorch_modular.surrogate import ModelConfig
    from botorch.models import SingleTaskGP
    from botorch.test_functions import Branin
    from botorch.test_functions.multi_objective import BraninCurrin

    from torchbkb.botorch import BKBModel

    logging.getLogger("ax").setLevel(logging.ERROR)
    client = Client(random_seed=seed)
    client.configure_experiment(parameters=[RangeParameterConfig(name=f"x{i}", parameter_type="float",
                                                                 bounds=(0.0, 1.0)) for i in range(2)])
    client.configure_optimization(objective="branin" if objectives == 1 else "branin, currin")
    cls = BKBModel if kind == "BKBModel" else SingleTaskGP
    gs = choose_generation_strategy(GenerationStrategyDispatchStruct(method="custom", initialization_budget=5,
                                                                     initialization_random_seed=seed),
                                    model_config=ModelConfig(botorch_model_class=cls))
    client.set_generation_strategy(gs)
    f1, f2 = Branin(negate=True).to(F64), BraninCurrin(negate=True).to(F64)
    lb, ub = f1.bounds.to(F64)
    seen = []
    for _ in range(8 if quick else 15):
        for index, p in client.get_next_trials(max_trials=1).items():
            x = torch.tensor([[p["x0"], p["x1"]]], dtype=F64)
            if objectives == 1:
                data = {"branin": float(f1(lb + x * (ub - lb)))}
            else:
                y = f2(x)[0]
                seen.append(y)
                data = {"branin": float(y[0]), "currin": float(y[1])}
            client.complete_trial(trial_index=index, raw_data=data)
    if objectives == 1:
        _, prediction, _, _ = client.get_best_parameterization()
        return float(prediction["branin"][0])
    from botorch.utils.multi_objective.hypervolume import Hypervolume
    from botorch.utils.multi_objective.pareto import is_non_dominated

    Y = torch.stack(seen)
    return float(Hypervolume(ref_point=f2.ref_point).compute(Y[is_non_dominated(Y)]))  # of the observed outcomes


def ax_analyses(kind, seed, quick):
    """Ax's compute_analyses (sensitivity): minus its seconds (marginal posteriors over 4,096-point chunks)."""
    import logging

    from ax.analysis.plotly.sensitivity import SensitivityAnalysisPlot
    from ax.api.client import Client
    from ax.api.configs import RangeParameterConfig
    from ax.api.utils.generation_strategy_dispatch import choose_generation_strategy
    from ax.api.utils.structs import GenerationStrategyDispatchStruct
    from ax.generators.torch.botorch_modular.surrogate import ModelConfig
    from botorch.models import SingleTaskGP

    from torchbkb.botorch import BKBModel

    logging.getLogger("ax").setLevel(logging.ERROR)
    client = Client(random_seed=seed)
    client.configure_experiment(parameters=[RangeParameterConfig(name=f"x{i}", parameter_type="float",
                                                                 bounds=(0.0, 1.0)) for i in range(4)])
    client.configure_optimization(objective="f")
    cls = BKBModel if kind == "BKBModel" else SingleTaskGP
    gs = choose_generation_strategy(GenerationStrategyDispatchStruct(method="custom", initialization_budget=8,
                                                                     initialization_random_seed=seed),
                                    model_config=ModelConfig(botorch_model_class=cls))
    client.set_generation_strategy(gs)
    for _ in range(10):
        for index, p in client.get_next_trials(max_trials=1).items():
            client.complete_trial(trial_index=index, raw_data={"f": math.sin(3 * p["x0"]) + p["x1"] * p["x2"]})
    t0 = time.perf_counter()
    client.compute_analyses(analyses=[SensitivityAnalysisPlot()], display=False)
    return -(time.perf_counter() - t0)
