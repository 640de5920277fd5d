"""bench/published.py: the published figures carry their citation and setting, the script predicts every one of
them with the cost model, and its fit of constants is analysis only (constants.py is untouched after it)."""

from __future__ import annotations

import dataclasses
import math
import re
import statistics

import pytest

from benchload import bench_module
from hetrl_cli.costmodel import constants as C


@pytest.fixture(scope="module")
def published():
    with bench_module("published") as module:
        yield module


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
    """What the applied constants reach on figures the fit never saw (docs/benchmarks.md): median |ln| 0.064 over
    10 since the large-batch vLLM figures, the KV-after-GEMM decode step, the batch's decline with each sequence's
    own KV context and their refits (0.075 with the first of these) (0.114 over the 8 before;
    0.121 before NeMo-RL's own per-step work was priced, `framework_s`; target 0.10), max 0.463 (target 0.25;
    the concurrency-16 TPOT behind a 1.4k tok/s serving ceiling). Before
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


# ---- issue 24, item 1: where the NeMo-RL steps' residual lies (their own per-phase split) ----------------------


def test_phase_breakdowns_are_cited_and_not_in_the_figures(published):
    """The per-phase splits are diagnostics: cited, with a total and the four phases, and never a Figure (so
    neither fitted nor counted in the check median)."""
    keys = {f.key for f in published.FIGURES}
    assert len(published.PHASE_BREAKDOWNS) >= 3
    for bd in published.PHASE_BREAKDOWNS:
        assert bd.key not in keys
        assert re.search(r"https?://\S+", bd.citation) and re.search(r"\b20\d\d\b", bd.citation), bd.key
        phases = dict(bd.phases)
        assert set(phases) == {"total", "generation", "logprobs", "training", "refit"}, bd.key
        assert sum(v for k, v in phases.items() if k != "total") <= phases["total"]


def test_phases_add_up_to_the_step_and_carry_the_framework_work(published, tmp_path):
    """predict_phases splits the step the cost model prices (plus the framework's work) into NeMo-RL's phases
    without losing or double-counting a second, and the framework's work is where NeMo-RL's source puts it."""
    rows = {r["key"]: r for r in published.all_phases(tmp_path)}
    assert set(rows) >= {bd.key for bd in published.PHASE_BREAKDOWNS}
    for r in rows.values():
        pred = r["predicted"]
        assert sum(v for k, v in pred.items() if k != "total") == pytest.approx(pred["total"], rel=1e-9)
        assert all(pred[k] > 0 for k in ("generation", "logprobs", "training", "refit")), r["key"]
        extra = r["framework"]
        assert set(extra) == {"training", "refit", "generation", "logprobs", "other"}, r["key"]
        assert all(v > 0 for v in extra.values()), r["key"]
    # the whole-step figures' predictions include the same framework work
    fig = next(f for f in published.FIGURES if f.key == "nemo-rl/llama3.1-8b/16xh100")
    pred = published.predict(fig, tmp_path)
    framework = sum(v for k, v in pred.terms.items() if k.startswith("framework:"))
    assert framework == pytest.approx(sum(rows[fig.key]["framework"].values()), rel=1e-9)
    assert pred.predicted == pytest.approx(rows[fig.key]["predicted"]["total"], rel=1e-9)


def test_framework_work_is_only_the_named_frameworks(published, tmp_path):
    """A setting without a framework gets none of it; NeMo-RL's four optimizer steps add three updates' DP reduce,
    optimizer step and pipeline flush, and its host copies are bytes over HOST_DEVICE_Bps."""
    from hetrl_cli.costmodel.model import CostModel

    bd = published.PHASE_BREAKDOWNS[0]
    s = bd.setting
    profile = published.cluster_profile(s)
    model = CostModel(profile, published.workload(s, tmp_path))
    est, _ = published.rl_step_estimate(model, s, [d.id for d in profile.devices])
    plain = dataclasses.replace(s, framework="")
    assert published.framework_s(model, plain, est) == {}
    extra = published.framework_s(model, s, est)
    terms = est.tasks["actor_train"].terms
    per_update = sum(terms.get(k, 0.0) for k in ("dp_allreduce", "optimizer", "bubble"))
    assert extra["training"] == pytest.approx((s.optimizer_steps - 1) * per_update)
    params = model.step.arch["actor_train"].param_count()
    # 8B, TP1 PP1, vLLM TP1, bf16: the reference swap moves the policy's bytes three times
    assert extra["logprobs"] == pytest.approx(3 * 2 * params / C.HOST_DEVICE_Bps)


# ---- issue 24, item 1: a compute-bound decode step still reads its KV cache -------------------------------------


def test_compute_bound_decode_step_adds_its_kv_reads():
    """At 256 sequences of Llama 3.1 8B on an H100 a decode step's GEMMs are compute bound; the attention's
    KV-cache reads are their own kernels after them, so the step costs max(GEMM FLOPs, weight reads) + KV reads
    (the large-batch vLLM figures, bench/published.py). Before, max(FLOPs, weights + KV) hid the KV reads
    entirely under the FLOPs (memory term 0)."""
    from hetrl_cli.artifacts.workload import LengthDistribution, ModelSpec, Workload
    from hetrl_cli.costmodel.architectures import resolve
    from hetrl_cli.costmodel.devices import Cluster
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.costmodel.types import TaskPlacement
    from hetrl_cli.profiling.catalog import profile_from_cluster

    spec = {"name": "c", "node_groups": [{"gpu": "H100 SXM", "gpus_per_node": 1, "nodes": 1}],
            "network": {"intra_region": {"bandwidth": "100Gbps", "latency": "5us"}}}  # fmt: skip
    profile = profile_from_cluster(spec, created_at="2026-01-01T00:00:00Z")
    w = Workload(
        name="w", algorithm="ppo", actor=ModelSpec(arch="llama-3.1-8b"), critic=ModelSpec(arch="llama-3.1-8b"),
        prompts_per_step=256, responses_per_prompt=1, max_prompt_tokens=215, max_response_tokens=194,
        response_length=LengthDistribution(mean_fraction=1.0, p99_fraction=1.0),
    )  # fmt: skip
    est = CostModel(profile, w).task(TaskPlacement(task="generation", replicas=((("h100-0/0",),),)))
    mem_Bps = Cluster(profile, "bf16", {}).classes[0].mem_Bps * C.HBM_EFFICIENCY
    kv_per_step = 256 * (215 + 194 / 2) * resolve(ModelSpec(arch="llama-3.1-8b")).kv_bytes_per_token("bf16") / mem_Bps
    assert est.terms["compute"] > 194 * kv_per_step  # compute bound
    assert est.terms["memory"] == pytest.approx(194 * kv_per_step, rel=1e-6)
