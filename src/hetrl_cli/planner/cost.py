"""The planner's objective: iteration time, or dollars per iteration, under an optional cap on dollars per hour.

A plan rents the devices its groups hold and nothing else (idle devices are not rented): its hourly price is
the sum of those devices' `price_per_gpu_hour`, and its cost per iteration is that price × the predicted
iteration time. `Objective.key` is the number every search minimises (seconds, or dollars per iteration; inf
for a plan over the cap), so the hybrid, the baselines and the checks compare plans the same way; with the
default objective (time, no cap) it is the iteration time itself, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from hetrl_cli.errors import BadInput, Infeasible
from hetrl_cli.planner.search import Candidate

if TYPE_CHECKING:
    from hetrl_cli.artifacts.plan import Plan, PlanPrice
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.planner.space import DeviceClass, Pool
    from hetrl_cli.planner.tables import GroupOption

ObjectiveKind = Literal["time", "cost"]
OBJECTIVES: tuple[ObjectiveKind, ...] = ("time", "cost")
SECONDS_PER_HOUR = 3600.0


@dataclass
class Objective:
    """What a search minimises (`kind`) and the cap; `prices` is $/hour per device id (all of them where a
    price matters)."""

    kind: ObjectiveKind = "time"
    max_cost_per_hour: float | None = None
    prices: dict[str, float] = field(default_factory=dict)
    cheapest_over_cap: float = math.inf
    """The lowest hourly price of a plan that fitted but was over the cap (for the exit-3 message)."""

    @property
    def plain(self) -> bool:
        """Time without a cap: the planner as it was before prices."""
        return self.kind == "time" and self.max_cost_per_hour is None

    def hourly(self, devices: Iterable[str]) -> float:
        """$/hour of renting `devices` (each counted once)."""
        return sum(self.prices[d] for d in set(devices))

    def allows(self, devices: Iterable[str]) -> bool:
        return self.max_cost_per_hour is None or self.hourly(devices) <= self.max_cost_per_hour * (1 + 1e-12)

    def score(self, iteration_s: float, devices: Iterable[str]) -> float:
        """The objective's value of a plan: seconds per iteration, or dollars per iteration."""
        if self.kind == "time":
            return iteration_s
        return iteration_s * self.hourly(devices) / SECONDS_PER_HOUR

    def key(self, iteration_s: float, devices: Sequence[str]) -> float:
        """`score`, or inf over the cap (recording the cheapest such plan)."""
        if self.plain:
            return iteration_s
        if not self.allows(devices):
            if math.isfinite(iteration_s):
                self.cheapest_over_cap = min(self.cheapest_over_cap, self.hourly(devices))
            return math.inf
        return self.score(iteration_s, devices)

    def candidate(self, genome: tuple[int, ...], seconds: float, options: list[GroupOption]) -> Candidate:
        """The hybrid's scored genome under this objective (unchanged for `plain`). The cap filters, it does not
        steer: a plan over it keeps its score and options (the search goes where the uncapped one goes) and is
        marked not `allowed`, so it is never the answer."""
        if self.plain:
            return Candidate(genome, seconds, options)
        devices = [d for o in options for d in o.devices]
        allowed = math.isfinite(self.key(seconds, devices))
        return Candidate(genome, self.score(seconds, devices), options, allowed=allowed)

    def check_cap(self, devices: Sequence[str], solver: str) -> None:
        """Every emitted plan is under the cap (a solver path that ignored it is an error, never a silent plan)."""
        if not self.allows(devices):
            raise Infeasible(
                f"the {solver} plan costs {self.hourly(devices):.4g} $/h, over --max-cost-per-hour "
                f"{self.max_cost_per_hour:g}: a solver ignored the cap; use --solver hybrid"
            )

    def pool_hourly(self, classes: Sequence[DeviceClass], pool: Pool) -> float:
        """$/hour of an ILP pool: its devices of each class × the class's price (a class is priced alike)."""
        pairs = zip(classes, pool, strict=True)
        return sum((whole * c.per_host + part) * self.prices[c.devices[0][0]] for c, (whole, part) in pairs)

    def over_cap_message(self) -> str:
        """Why nothing was planned under the cap, with the cheapest fitting plan's price when one was seen."""
        cap = f"--max-cost-per-hour {self.max_cost_per_hour:g}"
        if math.isfinite(self.cheapest_over_cap):
            return (
                f"no plan under {cap} $/h: the cheapest plan found that fits costs {self.cheapest_over_cap:.4g} $/h; "
                "raise the cap or add cheaper devices"
            )
        return f"no plan under {cap} $/h was found (and none over it fitted either)"


def make_objective(profile: ClusterProfile, kind: str, max_cost_per_hour: float | None) -> Objective:
    """The objective of `hetrl plan --objective KIND --max-cost-per-hour X`; a price the objective needs but the
    profile lacks is one line naming the devices and the fix (exit 2)."""
    if kind not in OBJECTIVES:
        raise BadInput(f"unknown objective {kind!r}; choose one of: {', '.join(OBJECTIVES)}")
    if max_cost_per_hour is not None and not (math.isfinite(max_cost_per_hour) and max_cost_per_hour > 0):
        raise BadInput(f"--max-cost-per-hour must be a positive number of dollars, got {max_cost_per_hour}")
    objective = Objective(kind, max_cost_per_hour)  # type: ignore[arg-type]
    if objective.plain:
        objective.prices = known_prices(profile)
        return objective
    missing = [d.id for d in profile.devices if d.price_per_gpu_hour is None]
    if missing:
        why = "--objective cost" if kind == "cost" else "--max-cost-per-hour"
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise BadInput(
            f"profile {profile.name!r}: {why} needs a price for every device, and {shown} have none: set "
            "'price_per_gpu_hour' on their node group in cluster.yaml and re-run 'hetrl profile --catalog' (or "
            "on those devices in the profile JSON); docs/catalog.md"
        )
    objective.prices = {d.id: d.price_per_gpu_hour or 0.0 for d in profile.devices}
    return objective


def known_prices(profile: ClusterProfile) -> dict[str, float]:
    return {d.id: d.price_per_gpu_hour for d in profile.devices if d.price_per_gpu_hour is not None}


def tokens_per_iteration(workload: Workload) -> float:
    """Tokens one iteration produces and trains on: the generated (response) tokens, plus the tokens actor_train
    passes over (every sequence's prompt and response, once per PPO epoch). What $/1M tokens divides by."""
    sequences = workload.samples_per_step
    response = workload.response_length.mean_fraction * workload.max_response_tokens
    trained = sequences * (workload.max_prompt_tokens + response) * workload.ppo_epochs
    return sequences * response + trained


def plan_price(
    prices: dict[str, float], devices: Iterable[str], iteration_s: float, workload: Workload, objective: Objective
) -> PlanPrice | None:
    """The plan's prices: None where a device it uses has no price (nothing is guessed)."""
    from hetrl_cli.artifacts.plan import PlanPrice

    used = sorted(set(devices))
    if not used or any(d not in prices for d in used):
        return None
    hourly = sum(prices[d] for d in used)
    per_iteration = hourly * iteration_s / SECONDS_PER_HOUR
    tokens = tokens_per_iteration(workload)
    return PlanPrice(
        usd_per_hour=hourly,
        usd_per_iteration=per_iteration,
        usd_per_million_tokens=per_iteration / tokens * 1e6,
        tokens_per_iteration=tokens,
        max_usd_per_hour=objective.max_cost_per_hour,
        devices=len(used),
    )


def priced(plan: Plan, objective: Objective) -> Plan:
    """`plan` with the objective it was made under and its prices (None where a used device has none)."""
    devices = [d for g in plan.groups for d in g.devices]
    price = plan_price(objective.prices, devices, plan.cost.iteration_s, plan.workload, objective)
    return plan.model_copy(update={"objective": objective.kind, "price": price})


def repriced(new: Plan, old: Plan, profile: ClusterProfile) -> Plan:
    """A re-scored plan (`hetrl simulate`) keeps the objective and cap it was made under, priced with `profile`'s
    prices (None where a used device has none)."""
    cap = old.price.max_usd_per_hour if old.price is not None else None
    return priced(new, Objective(old.objective, cap, known_prices(profile)))
