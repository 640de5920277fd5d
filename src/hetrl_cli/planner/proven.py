"""Why the exact solver proved that no plan exists: the cause in the user's words, read off the ILP's space.

When the full ILP (planner/ilp.py) finds no grouping whose groups fit on disjoint pools, the budget was not
the limit and "raise --budget" would be wrong advice. The space says why: each task fits (with whatever group
mates) only on pools that take at least so many devices of some class, and two tasks that each need more than
half of one class and do not fit together in one group can never both be placed.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetrl_cli.planner.ilp import IlpSpace
    from hetrl_cli.planner.space import DeviceClass, Pool
    from hetrl_cli.planner.tables import Tables


def explain_proven(tables: Tables, space: IlpSpace) -> str:
    """One line: the task that fits nowhere, else the two tasks that need the same devices and do not fit
    together, else the scarcest tasks' counts of pools; always what was proven and over what."""
    classes = tables.classes
    proof = f"the ILP proved that no plan fits over its {len(space.pools)} {space.granularity}-granularity pools"
    fits = {t: _pools_of(space, t) for t in tables.tasks}
    for task, pools in fits.items():
        if not pools:
            return f"{proof}: {task} fits on none of them with any group mates; {_FIX}"
    need = {t: _least_per_class(classes, [space.pools[p] for p in pools]) for t, pools in fits.items()}
    for a, b in itertools.combinations(tables.tasks, 2):
        if _fit_together(space, a, b):
            continue
        for c, cls in enumerate(classes):
            if need[a][c] + need[b][c] > cls.size:
                label = cls.name.removeprefix("NVIDIA ")
                return (
                    f"{proof}: {a} needs ≥ {need[a][c]} and {b} ≥ {need[b][c]} of the {cls.size} {label} GPUs "
                    f"(on every pool either fits on), and they do not fit together in one group; {_FIX}"
                )
    scarce = sorted((len(p), t) for t, p in fits.items())[:2]
    where = " and ".join(f"{t} fits on {n}" for n, t in scarce)
    return f"{proof} ({where} of them, with any group mates; no grouping's groups fit on disjoint pools); {_FIX}"


_FIX = "add devices, use ZeRO sharding or shorten sequences"


def _pools_of(space: IlpSpace, task: str) -> set[int]:
    """Pools some group holding `task` fits on."""
    return {p for (s, p) in space.options if task in space.subsets[s]}


def _fit_together(space: IlpSpace, a: str, b: str) -> bool:
    return any(a in space.subsets[s] and b in space.subsets[s] for (s, _) in space.options)


def _least_per_class(classes: list[DeviceClass], pools: list[Pool]) -> list[int]:
    """Per class, the fewest devices of it among `pools` (0 where some pool takes none)."""
    least = [math.inf] * len(classes)
    for pool in pools:
        for c, (whole, part) in enumerate(pool):
            least[c] = min(least[c], whole * classes[c].per_host + part)
    return [int(x) if math.isfinite(x) else 0 for x in least]
