"""Sentences for people: the plan's bottleneck ("actor_train on group g1 (8×H100, us-east) takes 61 % of
the iteration; its DP all-reduce over the 1 Gbps wan link ... is 40 % of it").

They are not physics: the cost model's numbers say everything a solver needs. They live here rather than in
render/ because the Plan artifact stores the sentence (`PlanCost.bottleneck`) and the planner, below render in
the layering, writes it; `evaluate` fills it in from the critical path it already has.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetrl_cli.artifacts.rl import SYNC_WORDS
from hetrl_cli.costmodel.devices import Cluster
from hetrl_cli.costmodel.types import GroupPlacement, TaskEstimate

TERM_LABEL: dict[str, str] = {
    "compute": "compute",
    "memory": "memory traffic",
    "tp_comm": "TP all-reduces",
    "pp_p2p": "pipeline sends",
    "dp_allreduce": "DP all-reduce",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
    "offload": "offload copies",
    "overhead": "per-step overhead",
    "host": "host dispatch (eager launches)",
}
"""How a task's time term is named in the bottleneck sentence."""

PathItem = tuple[str, str, str, float]
"""(kind: task, transfer or weight_sync; name; group; seconds) of one item on the critical path."""


def short_name(name: str) -> str:
    """A device name without its vendor's prefix ('NVIDIA H100' → 'H100')."""
    return name.removeprefix("NVIDIA ").removeprefix("Tesla ").strip()


def group_desc(cluster: Cluster, group: GroupPlacement) -> str:
    """'8×H100 + 2×L4, us-east/eu-west': a group's devices by name and its regions."""
    counts: dict[str, int] = {}
    regions: list[str] = []
    for d in group.devices:
        dev = cluster.devices.get(d)
        if dev is None:
            continue
        name = short_name(dev.name)
        counts[name] = counts.get(name, 0) + 1
        region = cluster.links.region(dev.host)
        if region not in regions:
            regions.append(region)
    kinds = " + ".join(f"{n}×{name}" for name, n in counts.items())
    return f"{kinds}, {'/'.join(regions)}" if regions else kinds


def sync_label(role: str, link_label: str) -> str:
    """How the bottleneck sentence names a weight sync and its link (it follows "weight sync (")."""
    return f"{SYNC_WORDS[role]}) over the {link_label}"


def bottleneck(
    cluster: Cluster,
    path: Sequence[PathItem],
    iteration: float,
    groups: Sequence[GroupPlacement],
    estimates: dict[str, TaskEstimate],
    ws_label: str,
) -> str:
    """The sentence naming the longest item on the critical path and, for a task, its largest term (and the
    link that term ran on); "" for an empty path. `ws_label` names the slower weight sync and its link."""
    if not path or iteration <= 0:
        return ""
    kind, name, g, s = max(path, key=lambda x: x[3])
    pct = 100 * s / iteration
    if kind == "weight_sync":
        return f"weight sync ({ws_label} takes {pct:.0f} % of the iteration"
    if kind == "transfer":
        return f"moving data between groups at {name} takes {pct:.0f} % of the iteration"
    group = next(x for x in groups if x.name == g)
    sentence = f"{name} on group {g} ({group_desc(cluster, group)}) takes {pct:.0f} % of the iteration"
    est = estimates[name]
    if est.terms and s > 0:
        term, ts = max(est.terms.items(), key=lambda kv: kv[1])
        label = TERM_LABEL.get(term, term)
        link = est.links.get(term)
        if link:
            sentence += f"; its {label} over the {link} is {100 * ts / s:.0f} % of it"
        else:
            sentence += f"; {label} is {100 * ts / s:.0f} % of it"
    return sentence
