"""bench/published.py: the published figures carry their citation and setting, the script predicts every one of
them with the cost model, and its fit of constants is analysis only (constants.py is untouched after it)."""

from __future__ import annotations

import importlib.util
import math
import re
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
