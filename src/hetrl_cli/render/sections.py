"""The sections of `show` as format-neutral tables of strings; rich and markdown draw the same tables.

A section is a `Section` (title, column names, rows); its numbers come from `digest.py` formatted once here,
so the terminal and a PR description never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrl_cli.artifacts.plan import TaskPlan
from hetrl_cli.render.compare import CompareRow, Comparison
from hetrl_cli.render.digest import (
    BREAKDOWN_TERMS,
    IDLE,
    MISSING,
    PlanDigest,
    compact_layers,
    compact_shares,
    gib,
    ratio_text,
    seconds,
    si,
    task_order,
    workload_line,
)


@dataclass(frozen=True)
class Section:
    title: str
    columns: list[str]
    rows: list[list[str]]
    right: set[int] = field(default_factory=set)
    """Indices of numeric columns (right-aligned)."""
    letter_column: int | None = None
    """Column holding a group letter, coloured by the rich renderer."""
    note: str = ""
    """A line under the table (what was left out, a hint)."""


def summary_rows(d: PlanDigest) -> list[tuple[str, str]]:
    """Key/value lines of the summary, in reading order."""
    plan, cost = d.plan, d.plan.cost
    hint = "" if d.has_profile else " (add --profile for device types, regions, capacity)"
    rows = [
        ("plan", f"{plan.name} (made {plan.created_at})"),
        ("profile", f"{plan.profile_name} {plan.profile_fingerprint}{hint}"),
        ("workload", workload_line(plan.workload)),
        *(("warning", w) for w in plan.warnings),  # what the plan means: async without effect, bf16 emulated
        (
            "iteration",
            f"{seconds(cost.iteration_s)} · {si(cost.samples_per_s)} samples/s · {si(cost.tokens_per_s)} tokens/s",
        ),
        ("devices", devices_line(d)),
    ]
    if plan.price is not None:
        rows.insert(rows.index(("devices", devices_line(d))), ("cost", price_line(plan)))
    if cost.breakdown:
        rows.append(("critical path", breakdown_line(cost.breakdown, cost.iteration_s)))
    rows.append(("sync/transfer", f"weight sync {seconds(cost.weight_sync_s)} · transfers {seconds(cost.transfer_s)}"))
    rows.append(("solver", solver_line(d)))
    return rows


def price_line(plan) -> str:
    """`$0.167/iteration · $0.0798/1M tokens · $3.43/hour for 1 device · objective cost`."""
    p = plan.price
    cap = f" (cap ${p.max_usd_per_hour:g}/hour)" if p.max_usd_per_hour is not None else ""
    return (
        f"${p.usd_per_iteration:.4g}/iteration · ${p.usd_per_million_tokens:.4g}/1M tokens · "
        f"${p.usd_per_hour:.4g}/hour for {p.devices} device{'s' if p.devices != 1 else ''}{cap} · "
        f"objective {plan.objective}"
    )


def devices_line(d: PlanDigest) -> str:
    """`20 used of 21 on 3 hosts · 1 idle`: how much of the cluster the plan occupies."""
    marks = [m for row in d.hosts for m in row.marks for _ in row.hosts]
    idle, missing = marks.count(IDLE), marks.count(MISSING)
    hosts = sum(len(row.hosts) for row in d.hosts)
    text = f"{len(d.used)} used of {len(marks)} on {hosts} host{'s' if hosts != 1 else ''}"
    text += f" · {idle} idle" if idle else ""
    return text + (f" · {missing} missing from the profile" if missing else "")


def breakdown_line(breakdown: dict[str, float], iteration_s: float) -> str:
    """`compute 9.1 s (58%) · memory 3 s (19%) · …`, largest first."""
    parts = sorted(breakdown.items(), key=lambda kv: -kv[1])
    return " · ".join(f"{k.replace('_', ' ')} {seconds(v)} ({v / iteration_s:.0%})" for k, v in parts if v > 0)


def solver_line(d: PlanDigest) -> str:
    """`ilp · optimal · objective 15.8 · bound 15.6 · gap 1.27% · 4.2 s · 3,120 evaluations`."""
    s = d.plan.solver
    parts = [s.solver, s.status]
    parts += [f"objective {s.objective:.4g}"] if s.objective is not None else []
    parts += [f"bound {s.bound:.4g}"] if s.bound is not None else []
    parts += [f"gap {s.gap:.2%}"] if s.gap is not None else []
    parts += [f"solved in {seconds(s.seconds)}", f"{s.evaluations:,} evaluations"]
    parts += [f"seed {s.seed}"] if s.seed is not None else []
    parts += [s.note] if s.note else []
    return " · ".join(parts)


def groups_section(d: PlanDigest) -> Section:
    rows = [
        [d.letters[g.name], g.name, ", ".join(task_order(g.tasks)), str(len(g.devices)), d.group_devices[g.name]]
        for g in d.plan.groups
    ]
    return Section("Groups", ["", "group", "tasks", "devs", "devices"], rows, right={3}, letter_column=0)


def task_layout_section(d: PlanDigest) -> Section:
    """How each task is parallelised: degrees, batch shares per replica, layers per stage."""
    rows = []
    for t in _ordered(d):
        degrees = f"{t.tp}/{t.pp}/{t.dp}"
        shares, layers = compact_shares(t), compact_layers(t)
        offload = "yes" if t.offload else ""
        rows.append([t.task, d.letters[t.group], degrees, str(len(t.devices)), shares, layers, offload])
    columns = ["task", "", "TP/PP/DP", "devs", "batch shares", "layers/stage", "offload"]
    if not any(t.offload for t in d.plan.tasks):
        columns, rows = columns[:-1], [r[:-1] for r in rows]
    return Section("Tasks", columns, rows, right={3}, letter_column=1)


def task_time_section(d: PlanDigest) -> Section:
    """Predicted seconds per task and where they go."""
    rows = []
    for t in _ordered(d):
        c = t.predicted
        terms = [seconds(getattr(c, f"{k}_s")) if getattr(c, f"{k}_s") else "" for k in BREAKDOWN_TERMS]
        rows.append([t.task, d.letters[t.group], seconds(c.total_s), *terms])
    return Section(
        "Predicted time per task",
        ["task", "", "total", *BREAKDOWN_TERMS],
        rows,
        right=set(range(2, 8)),
        letter_column=1,
    )


def _ordered(d: PlanDigest) -> list[TaskPlan]:
    by_name = {t.task: t for t in d.plan.tasks}
    return [by_name[n] for n in task_order(list(by_name))]


def device_map_section(d: PlanDigest) -> Section:
    """Each host a row: region, types, then one mark per device (group letter, · idle, ? missing)."""
    rows = [[row.label, row.region or "—", row.types or "—", " ".join(row.marks)] for row in d.hosts]
    legend = [f"{d.letters[g.name]} {g.name}" for g in d.plan.groups]
    note = "  ".join([*legend, f"{IDLE} idle"] + ([f"{MISSING} not in profile"] if d.stale else []))
    return Section("Device map", ["host", "region", "types", "devices by index"], rows, note=note)


def memory_section(d: PlanDigest) -> Section:
    """Peak vs capacity (fullest first), or peak bytes alone without a profile."""
    view = d.memory
    name = "host (fullest device)" if view.per_host else "device"
    with_capacity = any(r.capacity_bytes for r in view.rows)
    columns = [name] + (["devs"] if view.per_host else []) + ["peak"]
    columns += ["capacity", "used"] if with_capacity else []
    rows = []
    for r in view.rows:
        row = [r.name] + ([str(r.devices)] if view.per_host else []) + [gib(r.peak_bytes)]
        if with_capacity:
            row += [gib(r.capacity_bytes) if r.capacity_bytes else "—", _fraction(r.fraction)]
        rows.append(row)
    note = ""
    if view.hidden:
        emptiest = view.emptiest
        least = _fraction(emptiest.fraction) if emptiest and emptiest.fraction is not None else gib(emptiest.peak_bytes)
        note = f"… {view.hidden} more {'hosts' if view.per_host else 'devices'}, the emptiest at {least}"
    if not rows:
        note = "no memory figures in this plan"
    return Section("Peak memory", columns, rows, right=set(range(1, len(columns))), note=note)


def _fraction(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0%}" + (" OVER" if value > 1 else "")


def compare_section(c: Comparison) -> Section:
    rows = [_compare_cells(r) for r in c.rows]
    title = f"a = {c.a.plan.name}, b = {c.b.plan.name}"
    return Section(title, ["metric", "a", "b", "b/a"], rows, right={1, 2, 3}, note=c.headline())


def compare_tasks_section(c: Comparison) -> Section:
    rows = [[r.metric, r.value_text(r.a), r.a_note, r.value_text(r.b), r.b_note, ratio_text(r.ratio)] for r in c.tasks]
    return Section("Per-task time, a vs b", ["task", "a", "a layout", "b", "b layout", "b/a"], rows, right={1, 3, 5})


def _compare_cells(r: CompareRow) -> list[str]:
    return [r.metric, r.value_text(r.a), r.value_text(r.b), ratio_text(r.ratio)]
