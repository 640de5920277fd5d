"""bench/validate_local.py and bench/emulated_suite.py re-score recorded runs with the rollout engine each run used
(its launch.json), as `hetrl validate --calibration` and `hetrl calibrate` do (5d701c0): hf runs fitted and scored
with the hf engine's decode host work, not a vLLM-like engine's."""

from __future__ import annotations

from benchload import load_bench
from hetrl_cli.planner import build

from .test_engine_priced import hf_run
from .test_validate_fit import TRUE, plans, profile  # noqa: F401 (fixtures)


def _bench(name: str):
    return load_bench(name)


def _recording(monkeypatch, module) -> tuple[list, list]:
    """The module's fit_calibration and rescore, recording the runs' engines and the engine each rescore prices."""
    fitted, scored = [], []
    fit, rescore = module.fit_calibration, build.rescore

    def fit_recorded(runs, *args, **kwargs):
        fitted.extend(run[3] if len(run) > 3 else None for run in runs)
        return fit(runs, *args, **kwargs)

    def rescore_recorded(*args, engine=None, **kwargs):
        scored.append(engine)
        return rescore(*args, engine=engine, **kwargs)

    monkeypatch.setattr(module, "fit_calibration", fit_recorded)
    monkeypatch.setattr(module, "rescore", rescore_recorded)
    return fitted, scored


def test_validate_local_fits_and_scores_hf_runs_with_the_hf_engine(tmp_path, plans, profile, monkeypatch) -> None:  # noqa: F811
    bench = _bench("validate_local")
    fitted, scored = _recording(monkeypatch, bench)
    layouts = ("single", "colocated-25", "colocated-50", "gen|ref+train")
    dirs = {name: hf_run(tmp_path / name.replace("|", "_"), plans[name], TRUE, profile) for name in layouts}
    runs = [{"workload": "tiny", "layout": name, "wall_s": 1.0, "run_dir": path} for name, path in dirs.items()]
    fits = bench.cross_fit(profile, runs)
    rows = bench.evaluate(profile, runs, fits)
    assert fitted == ["hf"] * len(runs) and scored == ["hf"] * len(runs)
    hf = build.rescore(plans["single"], profile, calibration=fits["A"].factors(), engine="hf")
    generation = next(t for t in hf.tasks if t.task == "generation").predicted.total_s
    assert rows[0]["tasks"]["generation"]["after_s"] == generation


def test_emulated_suite_fits_and_scores_hf_runs_with_the_hf_engine(tmp_path, plans, profile, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv("HETRL_EMULATE_PREFIX", "hetrl-emb-")  # the suite's own, set before it imports emulate
    bench = _bench("emulated_suite")
    fitted, scored = _recording(monkeypatch, bench)
    runs = [
        {"run_dir": str(hf_run(tmp_path / name, plans[name], TRUE, profile))} for name in ("single", "colocated-50")
    ]
    data = bench.fit_data(runs)
    calibration = bench.fit_calibration(list(data.values()), profile, 1)
    assert fitted == ["hf", "hf"]
    plan = data[runs[0]["run_dir"]][1]
    checked = bench.scored_run(runs[0]["run_dir"], plan, profile, 1, calibration.factors(), "fold A")
    assert scored == ["hf"]
    hf = build.rescore(plan, profile, calibration=calibration.factors(), engine="hf")
    generation = next(t for t in hf.tasks if t.task == "generation").predicted.total_s
    assert next(c for c in checked.tasks if c.task == "generation").predicted_s == generation
