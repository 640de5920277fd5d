"""bench/published.py: the published figures carry their citation and setting, the script predicts every one of
them with the cost model, and its fit of constants is analysis only (constants.py is untouched after it)."""

from __future__ import annotations

import importlib.util
import math
import re
import statistics
import sys
from pathlib import Path

import pytest

from hetrl_cli.costmodel import constants as C

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def published():
    spec = importlib.util.spec_from_file_location("published", REPO / "bench" / "published.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["published"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("published", None)


def test_figures_have_citation_setting_and_split(published):
    figures = published.FIGURES
    assert len(figures) >= 12
    assert len({f.source for f in figures}) >= 5
    assert len({f.key for f in figures}) == len(figures)
    for f in figures:
        assert re.search(r"https?://\S+", f.citation), f.key
        assert re.search(r"\b20\d\d\b", f.citation), f"{f.key}: the citation has no date"
        assert f.published > 0 and math.isfinite(f.published)
        assert f.split in ("fit", "check") and f.why
        s = f.setting
        assert s.model and s.gpu and s.gpus > 0 and s.kind in ("rl_step", "train", "decode", "serve")
        assert s.gpus % (s.tp * s.pp) == 0 and s.gpus % s.gen_tp == 0
    assert {"fit", "check"} == {f.split for f in figures}


def test_script_predicts_every_recorded_figure(published, tmp_path):
    out = tmp_path / "published.json"
    assert published.main(["--no-fit", "--out", str(out)]) == 0
    import json

    result = json.loads(out.read_text())
    preds = {p["key"]: p for p in result["today"]["predictions"]}
    assert set(preds) == {f.key for f in published.FIGURES}
    for p in preds.values():
        assert p["predicted"] > 0 and math.isfinite(p["predicted"])
        assert p["abs_ln"] == pytest.approx(abs(math.log(p["predicted"] / p["published"])))
    summary = result["today"]["summary"]
    assert summary["fit"]["n"] + summary["check"]["n"] == len(published.FIGURES)


def test_fit_moves_constants_only_in_memory(published, tmp_path):
    before = {k: getattr(C, k) for k in dir(C) if k.isupper()}
    fit_set = tuple(f for f in published.FIGURES if f.split == "fit")
    priors = published.predict_all(fit_set, published.PRIORS, tmp_path)
    values = published.fit_constants(published.FIGURES, tmp_path, sweeps=1)
    fitted = published.predict_all(fit_set, values, tmp_path)
    assert {k: getattr(C, k) for k in dir(C) if k.isupper()} == before
    assert sum(p.log_ratio**2 for p in fitted) < sum(p.log_ratio**2 for p in priors)
    for name, (lo, hi) in published.BOUNDS.items():
        assert lo <= values[name] <= hi


# ---- issue 24, item 1: the fitted constants are applied, and what they reach on the check set ------------------


@pytest.fixture(scope="module")
def today(published, tmp_path_factory):
    """Every figure predicted with the constants costmodel/constants.py holds."""
    config_dir = tmp_path_factory.mktemp("published")
    return {p.key: p for p in published.predict_all(published.FIGURES, published.applied(), config_dir)}


@pytest.mark.slow
def test_constants_py_holds_the_fit(published, tmp_path):
    """costmodel/constants.py holds the values the fit set implies (4 sweeps, as the script runs it; rounded to
    2-3 digits), so the docstrings' 'fitted on' is true; a refit that moves a value by more than 1 % fails here."""
    values = published.fit_constants(published.FIGURES, tmp_path)
    applied = published.applied()
    assert set(values) == set(applied)
    for name, value in values.items():
        assert applied[name] == pytest.approx(value, rel=0.01), name


def test_check_set_error_with_the_applied_constants(published, today):
    """What the applied constants reach on figures the fit never saw (docs/benchmarks.md): median |ln| 0.121
    (target 0.10), max 0.470 (target 0.25; the concurrency-16 TPOT behind a 1.4k tok/s serving ceiling). Before
    issue 24's refit the median was 0.242 and the max 0.479; 0.107 / 0.445 with the refit while the cost model
    still charged autocast casts the runtime does not make (NeMo-RL's steps, which do cast, now come out lower).
    Margins of ~10 % so a small change elsewhere in the cost model does not fail it, a regression does."""
    check = [f for f in published.FIGURES if f.split == "check"]
    errs = sorted(abs(today[f.key].log_ratio) for f in check)
    assert len(check) >= 8
    assert statistics.median(errs) <= 0.135
    assert max(errs) <= 0.52
    # the kernel-level checks (training tokens/s, decode below the serving ceiling) are within 0.10 each
    for key in ("torchtitan/llama3-70b/64xa100", "torchtitan/llama2-13b/64xa100", "torchtitan/llama3.1-8b/128xh100",
                "yobitel/llama3.1-8b/h100/c4"):  # fmt: skip
        assert abs(today[key].log_ratio) <= 0.10, key


def test_fit_set_error_with_the_applied_constants(published, today):
    errs = [abs(today[f.key].log_ratio) for f in published.FIGURES if published.in_loss(f)]
    assert len(errs) >= 6
    assert statistics.median(errs) <= 0.06 and max(errs) <= 0.19


def test_selective_op_ac_recomputes_a_third_of_the_forward(published, tmp_path):
    """torchtitan's op-level SAC recomputes wk, wo and w3 of each layer: 36.6 % of Llama 3 8B's layer matmuls,
    ~30 % of the whole forward with attention and the 128k-entry head at 8192 tokens."""
    fig = next(f for f in published.FIGURES if f.key == "torchtitan/llama3-8b/64xa100")
    from hetrl_cli.costmodel.model import CostModel

    s = fig.setting
    model = CostModel(published.cluster_profile(s), published.workload(s, tmp_path))
    assert 0.28 < published.selective_share(model) < 0.37
