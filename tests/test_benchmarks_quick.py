"""Smoke tests of the benchmark suite at ``--quick`` size, plus the checks its numbers depend on.

These never assert on wall time; they check that every benchmark runs end to end, writes its JSON and
PNG, and that the quantities the reports rely on mean what they claim (the BoTorch peer makes GP-UCB's
choices, SoR starves where DTC does not, the memory probe sees an allocation).
"""

import importlib
import json
import subprocess
import sys

import pytest
import torch

from benchmarks import BENCHMARKS
from benchmarks.report import REPO
from benchmarks.harness import run_bandit
from benchmarks.registry import BanditSettings, make_bandit
from benchmarks.report import fit_loglog_slope, format_table
from benchmarks.timing import time_call


def _run(name, tmp_path, *extra):
    import importlib

    payload = importlib.import_module(BENCHMARKS.get(name, f"benchmarks.{name}")).main(["--quick", "--out",
            str(tmp_path), "--no-progress", *extra])
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["benchmark"] == name and doc["machine"]["torch"] == torch.__version__
    assert doc["size"] == "quick"
    return payload, doc


def test_variance_starvation_quick(tmp_path):
    _, doc = _run("variance_starvation", tmp_path)
    assert (tmp_path / "variance_starvation.png").stat().st_size > 10_000
    for row in doc["mean_over_seeds"]:
        # far from every evaluation SoR's σ collapses while DTC keeps the exact (≈ prior) one
        assert row["sor_sigma_right"] < 0.5 * row["exact_sigma_right"]
        assert abs(row["dtc_sigma_right"] - row["exact_sigma_right"]) < 0.1 * row["exact_sigma_right"]
        assert row["m"] <= row["t"]


def test_core_throughput_quick(tmp_path):
    _, doc = _run("core_throughput", tmp_path)
    assert (tmp_path / "core_throughput.png").exists()
    assert {r["dtype"] for r in doc["rows"]} == {"float32", "float64"}
    for r in doc["rows"]:
        assert r["gemm"]["min"] > 0 and r["embed"]["min"] > 0 and r["score"]["min"] > 0
        assert r["rank"] <= r["m"]
        if r["score_peak_extra_bytes"] is not None:  # the probe sees at least the two (A,) outputs
            assert r["score_peak_extra_bytes"] >= 2 * r["A"] * (4 if r["dtype"] == "float32" else 8) * 0.9


def test_scaling_quick(tmp_path):
    _, doc = _run("scaling", tmp_path)
    assert [r["A"] for r in doc["vs_A"]] == [1000, 10_000]
    assert doc["vs_t"]["T"] == 300 or doc["vs_t"]["capped"]
    assert (tmp_path / "scaling.png").exists()


def test_sequential_quick(tmp_path):
    _, doc = _run("sequential", tmp_path)
    assert (tmp_path / "sequential_scan.png").exists() and (tmp_path / "sequential_anchor.png").exists()
    algos = [s["algorithm"] for s in doc["anchor"]["summaries"]]
    assert algos == ["BKB-theory", "BKB", "GPUCB-theory", "GPUCB", "BoTorch-UCB"]
    runs = doc["anchor"]["runs"]
    # same UCB, same posterior: the BoTorch peer and exact GP-UCB pick the same arms, hence same regret
    assert runs["BoTorch-UCB"][0]["regret"] == pytest.approx(runs["GPUCB"][0]["regret"], rel=1e-9)


def test_sequential_studies_quick(tmp_path):
    _, doc = _run("sequential_studies", tmp_path)
    # the regret study: q̄ = 10⁶ keeps every pulled arm, so BKB pulls exact GP-UCB's arms on every seed
    study = doc["regret_study"]
    assert (tmp_path / "sequential_regret.png").exists() and len(study["seeds"]) == 2
    exact = study["summary"]["BKB q̄=1e6"]
    assert exact["seeds_same_arms_as_reference"] == 2 and exact["ratio_of_medians"] == 1.0
    assert study["summary"]["BKB theory q̄=2"]["reference"] == "GP-UCB theory"
    rows = doc["width_scan"]["rows"]
    assert [r["beta"] for r in rows] == [0.1, 0.2, 0.3, 0.5, 1.0] and all(r["gpucb_median"] > 0 for r in rows)


def test_float32_check_quick(tmp_path):
    _, doc = _run("float32_check", tmp_path, "--T", "400")
    (row,) = doc["rows"]
    assert 0 <= row["rls_rel_err_median"] <= row["rls_rel_err_max"] and row["dictionary_size"] > 0


def test_off_mode_fraction_counts_steps_away_from_the_exploited_arm():
    from benchmarks.sequential_studies import off_mode_fraction

    # before step 2 arm 7 leads (2 pulls); steps 2, 3, 4 pull arm 3, which takes the lead after step 4
    # (3 pulls against 2), so step 5 is on the exploited arm again: 3 of the 4 counted steps are off it
    assert off_mode_fraction([7, 7, 3, 3, 3, 3], after=2) == pytest.approx(3 / 4)
    assert off_mode_fraction([7, 7, 3, 3, 7, 3], after=2) == pytest.approx(3 / 4)  # a tie keeps the first leader
    assert off_mode_fraction([5] * 10, after=0) == pytest.approx(1 / 10)  # the first step has no arm yet


def test_regret_quick(tmp_path):
    _, doc = _run("regret", tmp_path, "--algorithms", "BBKB,BKB,GPUCB,GPBUCB,Random")
    s = {x["algorithm"]: x for x in doc["datasets"]["cadata"]["summaries"]}
    assert set(s) == {"BBKB", "BKB", "GPUCB", "GPBUCB", "Random"}
    assert s["BBKB"]["batches"] < s["BKB"]["batches"]  # adaptive batches: fewer than T
    assert all(0 <= x["normalized_regret"] for x in s.values())
    assert (tmp_path / "regret_cadata.png").exists()


def test_paper_readings_quick(tmp_path):
    from benchmarks.paper_readings import rewards_at, summarize
    from torchbkb.datasets import load

    _, doc = _run("paper_readings", tmp_path)
    rows = {(r["rewards"], r["width"]): r for r in doc["table"]}
    assert set(rows) == {("z", "practical"), ("100", "practical")} and (tmp_path / "paper_readings.png").exists()
    assert all(r["largest batch"] >= 1 and r["t"] <= 300 for r in rows.values())
    arms, z = rewards_at("abalone", "z", torch.float64, "cpu")
    _, raw = load("abalone", standardize_rewards=False)
    assert (torch.equal(z, load("abalone")[1])
            and torch.equal(rewards_at("abalone", "10", torch.float64, "cpu")[1], raw * 10))
    run = {"normalized_regret": 0.01, "growth": 1.1, "largest_batch": 3000, "batches": 20, "dictionary_size": 5,
           "t": 10, "time": 1.0, "capped": False}
    assert summarize([run])["shows_paper_figures"]
    assert not summarize([run | {"growth": 1.9}])["shows_paper_figures"]  # linear regret
    assert not summarize([run | {"largest_batch": 300}])["shows_paper_figures"]  # small batches
    assert not summarize([run | {"capped": True}])["shows_paper_figures"]  # did not reach T


def test_regret_takes_the_reward_units(tmp_path):
    _, doc = _run("regret", tmp_path, "--algorithms", "BBKB-practical,Random", "--rewards", "100")
    assert doc["rewards"] == "100"
    s = {x["algorithm"]: x for x in doc["datasets"]["cadata"]["summaries"]}
    assert s["Random"]["normalized_regret"] > 0.5  # R/R_unif is unit-free


def test_cli_lists_and_rejects(tmp_path):
    env_cmd = [sys.executable, "-m", "benchmarks"]
    out = subprocess.run(env_cmd + ["--list"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and all(n in out.stdout for n in BENCHMARKS)
    bad = subprocess.run(env_cmd + ["--only", "nope"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "nope" in bad.stderr


def test_botorch_peer_matches_gpucb_choices():
    from torchbkb.datasets import anchor_problem

    p = anchor_problem()
    s = BanditSettings(lengthscale=0.2, lam=0.01, beta=0.5)
    runs = {a: run_bandit(a, p.arms, p.objective(3), p.values, s, 25, seed=3, progress=False)
            for a in ("GPUCB", "BoTorch-UCB", "BoTorch-UCB-cond")}
    assert (runs["GPUCB"]["curves"]["cumulative_regret"]
            == pytest.approx(runs["BoTorch-UCB"]["curves"]["cumulative_regret"], rel=1e-9))
    assert (runs["GPUCB"]["curves"]["cumulative_regret"]
            == pytest.approx(runs["BoTorch-UCB-cond"]["curves"]["cumulative_regret"], rel=1e-9))


def test_registry_and_helpers():
    with pytest.raises(KeyError, match="BKB"):
        make_bandit("NoSuchAlgorithm", torch.rand(5, 2, dtype=torch.float64), BanditSettings(), 0)
    arms = torch.rand(5, 2, dtype=torch.float64)
    assert make_bandit("BBKB-practical", arms, BanditSettings(), 0).beta_mode == "practical"
    assert make_bandit("GPBUCB-desautels", arms, BanditSettings(), 0).stop_rule == "in_batch"
    assert fit_loglog_slope([1, 10, 100], [2, 20, 200]) == pytest.approx(1.0)
    assert fit_loglog_slope([1, 10, 100], [3, 3, 3]) == pytest.approx(0.0)
    calls = []
    t = time_call(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5 and len(t.values) == 3 and t.min <= t.median
    table = format_table([{"a": 1.23456, "b": None}], ["a", "b"])
    assert "1.23" in table and "| -" in table


@pytest.mark.parametrize(
    "name, args, outputs",
    [
        ("batch", ["--T", "300", "--threads", "1"], ["batch.json", "batch.png"]),
        ("batch_studies", ["--T", "200", "--c-scan", "1.5,2"], ["batch_c_scan.json"]),
        ("batch_studies", ["--T", "200", "--q-scan", "2,4"], ["batch_q_scan.json"]),
        ("botorch_peer", ["--sizes", "100"], ["botorch_peer_quick.json", "botorch_peer_quick.png"]),
        ("botorch_iteration", ["--sizes", "60", "--dims", "2"], ["botorch_iteration.json", "botorch_iteration.png"]),
        ("botorch_candidates", ["--candidates", "20000"], ["botorch_candidates.json", "botorch_candidates.png"]),
        ("botorch_scale", ["--seeds", "1", "--functions", "hartmann6"], ["botorch_scale.json", "botorch_scale.png"]),
        ("botorch_closed_loop", ["--seeds", "1", "--iterations", "1"],
         ["botorch_closed_loop.json", "botorch_closed_loop.png"]),
        ("launches", ["--cases", "bkb_anchor", "bbkb_anchor_fixed"], ["launches.json", "launches.png"]),
        ("step_floor", ["--peers", "no-such-directory"], ["step_floor.json", "step_floor.png"]),
        ("batch_floor", ["--peers", "no-such-directory"], ["batch_floor.json", "batch_floor.png"]),
        ("step_phases", ["--cases", "bkb_anchor_eager", "bkb_anchor_fixed"], ["step_phases.json", "step_phases.png"]),
        ("blas_threads", [], ["blas_threads.json", "blas_threads.png"]),
        ("inclusion", ["--seeds", "1", "--problems", "anchor,cadata"], ["inclusion.json", "inclusion.png"]),
        ("sbpe", ["--threads", "1"], ["sbpe.json", "sbpe.png"]),
        ("online", ["--threads", "1"], ["online.json", "online.png"]),
    ],
)
def test_issue_benchmarks_quick(tmp_path, name, args, outputs):
    """The per-issue benchmarks run end to end at smoke size and write their JSON (with the machine) and PNG."""
    import importlib

    importlib.import_module(BENCHMARKS.get(name, f"benchmarks.{name}")).main(["--quick", "--out", str(tmp_path), *args])
    for out in outputs:
        assert (tmp_path / out).stat().st_size > 0, out
    doc = json.loads((tmp_path / outputs[0]).read_text())
    assert "machine" in json.dumps(doc)
    if name == "botorch_candidates":  # every selection ran in its child process and measured its memory
        assert len(doc["rows"]) == 4 and all("seconds" in r and r["extra_mb"] == r["extra_mb"] for r in doc["rows"])


def test_ab_commits_runs_a_committed_version_beside_the_working_tree(tmp_path):
    """``benchmarks.ab_commits`` imports the package at a git revision as a second package (skipped outside a git
    checkout), runs both alternately with the same picks, writes JSON and PNG and leaves nothing imported."""
    import subprocess
    import sys

    from benchmarks import ab_commits

    if subprocess.run(["git", "-C", str(ab_commits.REPO), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    ab_commits.main(["--quick", "--base", "HEAD", "--cases", "bbkb_anchor", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "ab_commits.json").read_text())
    assert doc["rows"][0]["case"] == "bbkb_anchor" and doc["rows"][0]["pairs"] == 1
    assert (tmp_path / "ab_commits.png").stat().st_size > 0
    assert ab_commits.BASE_NAME not in sys.modules


def test_runner_defaults_to_main_job_and_drops_unknown_options(tmp_path, capsys):
    from benchmarks import MAIN
    from benchmarks.__main__ import main

    assert MAIN == "regret"
    rc = main(["--only", "sbpe", "--quick", "--seed", "3", "--out", str(tmp_path), "--threads", "1"])
    assert rc == 0 and (tmp_path / "sbpe.json").exists()
    assert "sbpe does not take --seed" in capsys.readouterr().out


def test_runner_does_not_leak_one_benchmarks_thread_count_into_the_next(monkeypatch, capsys):
    """A benchmark that sets one thread (the bandit loops do) must not change the next one's default."""
    import types

    import benchmarks.__main__ as runner

    seen = []

    def fake(name):
        mod = types.ModuleType(name)

        def main(argv):
            seen.append(torch.get_num_threads())
            torch.set_num_threads(1)

        mod.main = main
        monkeypatch.setitem(sys.modules, name, mod)
        return name

    monkeypatch.setattr(runner, "BENCHMARKS", {"first": fake("_fake_first"), "second": fake("_fake_second")})
    monkeypatch.setattr(runner, "OPTIONS", {})
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert runner.main(["--only", "first,second"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [3, 3]


def test_every_benchmark_runs_as_a_module():
    """``python -m benchmarks.<name>`` runs ``main``: every benchmark and study module has the guard."""
    import ast

    names = set(BENCHMARKS.values()) | {f"benchmarks.{n}"
            for n in ("batch_studies", "sequential_studies", "float32_check", "figures", "paper_readings")}
    for module in sorted(names):
        tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
        guards = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert guards and "main(" in ast.unparse(guards[0]), module


def test_high_throughput_quick(tmp_path):
    _, doc = _run("high_throughput", tmp_path)
    assert (tmp_path / "high_throughput.png").exists()
    methods = {r["method"] for r in doc["rows"]}
    assert methods == {"turbo1", "trbkb_thompson", "trbkb_bbkb", "bkb_thompson", "bkb_bbkb", "sobol"}
    for r in doc["rows"]:
        assert r["evaluations"][-1] == doc["budget"] and r["best"] == sorted(r["best"])  # best-so-far curves
    other = tmp_path / "other"  # a second run (another seed) merged into one report
    other.mkdir()
    second = dict(doc, rows=[dict(r, seed=r["seed"] + 1) for r in doc["rows"]])
    (other / "high_throughput.json").write_text(json.dumps(second))
    merged = importlib.import_module("benchmarks.high_throughput").main(
        ["--merge", str(tmp_path), str(other), "--out", str(tmp_path / "merged")])
    assert len(merged["rows"]) == 2 * len(doc["rows"]) and {r["seeds"] for r in merged["summary"]} == {2}
    assert (tmp_path / "merged" / "high_throughput.png").exists()
    (other / "high_throughput.json").write_text(json.dumps(dict(second, budget=doc["budget"] + 1)))
    with pytest.raises(SystemExit, match="one \\(budget, q, size\\)"):
        importlib.import_module("benchmarks.high_throughput").main(["--merge", str(tmp_path), str(other)])


def test_high_throughput_speed_quick(tmp_path):
    """The speed study: both methods timed at a size TuRBO-1 runs at; past --max-gib TuRBO-1 is not run and its
    time is extrapolated as n^3 from the largest size it ran at, apart from the measured seconds."""
    payload = importlib.import_module("benchmarks.high_throughput").main(
        ["--study", "speed", "--quick", "--sizes", "100,400", "--max-gib", "0.002", "--out", str(tmp_path)])
    rows = {(r["method"], r["n"]): r for r in payload["rows"]}
    assert all(rows[key]["seconds"] > 0 for key in (("turbo1", 100), ("trbkb_thompson", 100), ("trbkb_thompson", 400)))
    far = rows["turbo1", 400]
    assert far["seconds"] is None and far["extrapolated_s"] == pytest.approx(rows["turbo1", 100]["seconds"] * 64)
    assert (tmp_path / "high_throughput_speed.png").exists()


def test_high_throughput_fixed_q_quick(tmp_path):
    payload = importlib.import_module("benchmarks.high_throughput").main(
        ["--study", "fixed_q", "--quick", "--out", str(tmp_path)])
    fixed = [r for r in payload["rows"] if r["q"] is not None]
    assert fixed and all(r["picks"] == r["distinct"] == r["q"] and r["stop_reason"] == "q" for r in fixed)
    assert all(r["seconds"] > 0 for r in payload["rows"]) and (tmp_path / "high_throughput_fixed_q.json").exists()


def test_tutorial_swap_quick(tmp_path):
    _, doc = _run("tutorial_swap", tmp_path)
    assert {r["flow"] for r in doc["table"]} == {"batch_cross_validation", "fit_with_torch_optimizer"}
    assert all(r["bkb_errors"] == 0 and r["within_or_above"] for r in doc["table"])
