"""`fit_calibration(runs, profile) -> Calibration`: the cost model's factors fitted from measured runs.

Method (docs/calibration.md). The uncalibrated model splits each task's seconds into terms; calibration
divides the compute terms (compute, bubble) by the device class's `compute` factor, the memory term by its
`memory` factor, the optimizer step by its rate (`memory` × `optimizer`: elementwise work, streamed by a
fused GPU kernel, element by element on a CPU), multiplies the communication terms by a link kind's time
factor, and adds a per-task fixed overhead. So a prediction is linear in the unknowns x = (1/compute,
1/memory, 1/optimizer rate, link time, overhead seconds):

    predicted(run, task) = fixed + Σ_k coefficient_k · x_k

We solve non-negative least squares on the *relative* residuals (predicted − measured) / measured (the
first-order form of a log-space fit: every observation counts by its error ratio, not its seconds), plus weak
ridge rows that keep a factor no run exercises at its prior (1, or 0 s of overhead). The residuals reported
are exact: every run is re-scored with the fitted calibration.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import numpy as np

from hetrl_cli.artifacts.calibration import Calibration, DeviceFactors, LinkFactors, Residual
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.calibration.validate import abs_error_stats, measured_seconds, steady
from hetrl_cli.errors import BadInput

METHOD = (
    "non-negative least squares on relative residuals of the linearised cost model: "
    "1/compute, 1/memory, 1/optimizer-step rate per device class, a time factor per link kind, "
    "fixed seconds per task, "
    "a factor on the built-in per-step host costs"
)
COMPUTE_TERMS = ("compute", "bubble")
MEMORY_TERMS = ("memory",)
OPTIMIZER_TERMS = ("optimizer",)
COMM_TERMS = ("tp_comm", "pp_p2p", "dp_allreduce")
PRIOR_WEIGHT = 0.05
"""Ridge weight pulling each unknown to its prior, in relative-error units: a factor moves off 1 only when
that lowers the squared relative errors by more than (0.05 · its change)²."""
FACTOR_RANGE = (1e-3, 1e3)
"""Fitted factors are clamped to this range (an unknown with no signal would otherwise run to 0 or ∞)."""
_LINK_KIND = re.compile(r" (\S+) link ")

Run = tuple  # (str, Plan, list[dict]) or (str, Plan, list[dict], str | None)
"""(run id, the plan it executed, its metrics lines[, the engine priced: calibration.inputs.run_engine]): a run
of the hf engine is scored with its decode host work (CostModel(engine="hf")), as it ran."""


def _unpack(run: Run) -> tuple[str, Plan, list[dict], str | None]:
    run_id, plan, metrics, *engine = run
    return run_id, plan, metrics, engine[0] if engine else None


def link_kind(label: str) -> str | None:
    """'12.5 GB/s loopback link inside localhost' → 'loopback' (the cost model's LinkInfo.label)."""
    found = _LINK_KIND.search(label)
    return found.group(1) if found else None


def _check_profile(runs: list[Run], profile: ClusterProfile) -> str:
    fingerprint = profile.fingerprint or profile.compute_fingerprint()
    for run_id, plan, _, _ in map(_unpack, runs):
        if plan.profile_fingerprint != fingerprint:
            raise BadInput(
                f"run {run_id} was planned on profile {plan.profile_name!r} ({plan.profile_fingerprint}), not "
                f"{profile.name!r} ({fingerprint}); calibrate runs of one profile together"
            )
    return fingerprint


def _observations(runs: list[Run], profile: ClusterProfile, warmup: int):
    """Per (run, task): the measured median, the uncalibrated terms, the device names it ran on and the
    factor the cost model puts on a calibrated overhead there (CostModel.overhead_scale: the slowest host's
    speed for a task; summed over the syncs for the weight sync)."""
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.planner.build import placement_from_plan

    names = {d.id: d.name for d in profile.devices}
    out = []
    for run_id, plan, metrics, engine in map(_unpack, runs):
        measured = measured_seconds(steady(metrics, warmup)[0])
        try:
            model = CostModel(profile, plan.workload, engine=engine)
        except BadInput as exc:  # the run's plan.json names a model the cost model does not know
            raise BadInput(f"run {run_id}: plan.json: {exc}") from None
        groups, placements = placement_from_plan(plan)
        estimate = model.evaluate(groups, placements)
        for task, est in estimate.tasks.items():
            if measured.get(task):
                devices = est.placement.devices
                classes = sorted({names[d] for d in devices if d in names})
                scale = model.overhead_scale(devices, task)
                m = float(np.median(measured[task]))
                out.append((run_id, task, m, dict(est.terms), dict(est.links), classes, scale))
        if measured.get("weight_sync"):
            terms, links, classes, scale = _weight_sync_terms(model, model.weight_syncs(placements, groups), names)
            tasks = [p.task for p in placements]  # the gathers and TP hand-off evaluate() adds: fixed seconds here
            terms["layouts"] = sum(
                model.sync_gathers_s([p for p in placements if p.task in g.tasks], tasks) for g in groups
            )
            out.append((run_id, "weight_sync", float(np.median(measured["weight_sync"])), terms, links, classes, scale))
    return out


def _weight_sync_terms(model, syncs, names: dict[str, str]) -> tuple[dict, dict, list[str], float]:
    """A plan's weight syncs as fit terms, the way the calibrated model charges them: each sync's slower part
    (the local reshard: a `memory` term of its devices' classes; the remote copies: a `sync` term on its
    bottleneck link's kind), the per-tensor host part (`overhead`, scaled by overhead_factor), and the
    factor on a fitted fixed overhead (summed over the syncs)."""
    terms: dict[str, float] = {"memory": 0.0, "overhead": 0.0}
    links: dict[str, str] = {}
    classes: set[str] = set()
    scale = 0.0
    for i, (role, train, infer, *in_place) in enumerate(syncs):
        parts = model.weight_sync_parts(train, infer, role, *in_place)
        if parts is None:
            continue
        local_s, remote_s, label, tensors_s, _host_s = parts
        if local_s >= remote_s:
            terms["memory"] += local_s
            classes |= {names[d] for d in infer if d in set(train) and d in names}
        else:
            terms[f"sync {i}"] = remote_s
            links[f"sync {i}"] = label
        terms["overhead"] += tensors_s
        scale += model.overhead_scale((*train, *infer))
    return terms, links, sorted(classes), scale


def _design(observations) -> tuple[list[tuple[str, str]], np.ndarray, np.ndarray]:
    """Unknowns, and the rows A x = b of relative residuals (one per observation)."""
    unknowns: dict[tuple[str, str], int] = {}

    def col(key: tuple[str, str]) -> int:
        return unknowns.setdefault(key, len(unknowns))

    rows: list[tuple[dict[int, float], float, float]] = []
    for _run, task, measured, terms, links, classes, overhead_scale in observations:
        coef: dict[int, float] = {}
        fixed = 0.0
        for term, seconds in terms.items():
            if seconds == 0:
                continue
            kind = link_kind(links.get(term, "")) if term in COMM_TERMS or term.startswith("sync") else None
            if term in COMPUTE_TERMS + MEMORY_TERMS + OPTIMIZER_TERMS and classes:
                what = "compute" if term in COMPUTE_TERMS else "memory" if term in MEMORY_TERMS else "optimizer"
                for name in classes:  # a task on several device classes: its terms split evenly between them
                    c = col((what, name))
                    coef[c] = coef.get(c, 0.0) + seconds / len(classes)
            elif kind is not None:
                c = col(("link", kind))
                coef[c] = coef.get(c, 0.0) + seconds
            elif term == "overhead":  # the model's built-in per-step host cost, scaled by overhead_factor
                c = col(("overhead_factor", task))
                coef[c] = coef.get(c, 0.0) + seconds
            else:
                fixed += seconds
        if overhead_scale > 0:
            c = col(("overhead", task))
            coef[c] = coef.get(c, 0.0) + overhead_scale
        rows.append((coef, fixed, measured))
    keys = list(unknowns)
    A = np.zeros((len(rows), len(keys)))
    b = np.zeros(len(rows))
    for i, (coef, fixed, measured) in enumerate(rows):
        for c, v in coef.items():
            A[i, c] = v / measured
        b[i] = (measured - fixed) / measured
    return keys, A, b


def _with_priors(keys, A: np.ndarray, b: np.ndarray, scale_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Append one ridge row per unknown: factors towards 1, overheads towards 0 (in units of `scale_s`)."""
    prior_rows = np.zeros((len(keys), len(keys)))
    prior_b = np.zeros(len(keys))
    for i, (what, _name) in enumerate(keys):
        if what == "overhead":
            prior_rows[i, i] = PRIOR_WEIGHT / scale_s
        else:
            prior_rows[i, i] = PRIOR_WEIGHT
            prior_b[i] = PRIOR_WEIGHT
    return np.vstack([A, prior_rows]), np.concatenate([b, prior_b])


def nnls(A: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """min ‖Ax − b‖ subject to x ≥ 0 (Lawson & Hanson 1974, ch. 23: the active-set algorithm).

    >>> nnls(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([2.0, -1.0])).round(6).tolist()
    [2.0, 0.0]
    """
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        w = A.T @ (b - A @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-12
    return x


def _factors(keys, x: np.ndarray) -> dict:
    """The solution as a CostModel calibration dict (inverse factors back to multipliers of the profile)."""
    lo, hi = FACTOR_RANGE
    cal: dict = {"device_class": {}, "link_class": {}, "task_overhead_s": {}, "overhead_factor": {}}
    for (what, name), value in zip(keys, x, strict=True):
        if what == "overhead":
            if value > 0:
                cal["task_overhead_s"][name] = float(value)
            continue
        if what == "overhead_factor":  # a multiplier itself, not an inverse rate
            cal["overhead_factor"][name] = min(hi, max(lo, float(value)))
            continue
        if what == "link":  # the unknown is the time multiplier t: time × t  ⇔  bandwidth ÷ t and latency × t
            t = min(hi, max(lo, float(value)))
            cal["link_class"][name] = {"bandwidth": 1.0 / t, "latency": t}
            continue
        cal["device_class"].setdefault(name, {})[what] = min(hi, max(lo, 1.0 / value if value > 0 else hi))
    for factors in cal["device_class"].values():  # the fitted rate is memory × optimizer
        if "optimizer" in factors:
            factors["optimizer"] = min(hi, max(lo, factors["optimizer"] / factors.get("memory", 1.0)))
    return cal


def _residuals(runs: list[Run], profile: ClusterProfile, cal: dict, warmup: int) -> list[Residual]:
    """Exact re-scores of every run, uncalibrated and calibrated, per task with a measurement."""
    from hetrl_cli.planner.build import rescore

    out = []
    for run_id, plan, metrics, engine in map(_unpack, runs):
        measured = measured_seconds(steady(metrics, warmup)[0])
        before = rescore(plan, profile, engine=engine)
        after = rescore(plan, profile, calibration=cal, engine=engine)
        pairs = [
            (t.task, t.predicted.total_s, u.predicted.total_s) for t, u in zip(before.tasks, after.tasks, strict=True)
        ]
        pairs.append(("weight_sync", before.cost.weight_sync_s, after.cost.weight_sync_s))
        for task, b, a in pairs:
            if measured.get(task):
                m = float(np.median(measured[task]))
                out.append(Residual(run_id=run_id, task=task, measured_s=m, before_s=b, after_s=a,
                                    error_before=(b - m) / m, error_after=(a - m) / m))  # fmt: skip
    return out


def fit_calibration(runs: list[Run], profile: ClusterProfile, warmup: int = 1) -> Calibration:
    """Fit the factors from `runs` (all planned on `profile`) and report the fit's residuals."""
    if not runs:
        raise BadInput("calibrate needs at least one run directory")
    fingerprint = _check_profile(runs, profile)
    observations = _observations(runs, profile, warmup)
    if not observations:
        raise BadInput("no task of these runs has a measurement; run the plans for more steps than --warmup")
    keys, A, b = _design(observations)
    scale_s = float(np.median([o[2] for o in observations]))
    x = nnls(*_with_priors(keys, A, b, scale_s))
    cal = _factors(keys, x)
    residuals = _residuals(runs, profile, cal, warmup)
    med_b, p90_b = abs_error_stats([r.error_before for r in residuals])
    med_a, p90_a = abs_error_stats([r.error_after for r in residuals])
    return Calibration(
        profile_name=profile.name,
        profile_fingerprint=fingerprint,
        created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        method=METHOD,
        runs=[r[0] for r in runs],
        device_class={k: DeviceFactors(**v) for k, v in cal["device_class"].items()},
        link_class={k: LinkFactors(**v) for k, v in cal["link_class"].items()},
        task_overhead_s=cal["task_overhead_s"],
        overhead_factor=cal["overhead_factor"],
        residuals=residuals,
        median_abs_error_before=med_b,
        median_abs_error_after=med_a,
        p90_abs_error_before=p90_b,
        p90_abs_error_after=p90_a,
    )
