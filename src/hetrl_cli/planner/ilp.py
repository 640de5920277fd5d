"""The exact planner: one MILP over every task grouping × every pool per group, solved by HiGHS.

Space (docs/planner.md "What the ILP is exact over"): groupings = every set partition of the device tasks;
each group gets one pool of the chosen granularity (space.py); on a pool each task runs the fastest layout
of `space.layouts` that fits next to its group mates (tables.py). Costs are the cost model's numbers for
those exact placements. Constraint families, as docs/planner.md labels them:
  (a) one grouping            (b) one pool per group of the chosen grouping
  (c) device-class capacity   (d) at most two partial sub-hosts per class (so pair costs are exact)
  (e) phase maxima            (f) weight sync between groups (linearised per pool row)
  (g) transfers between groups (same linearisation)   (h) iteration: sync sum, or the async max
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hetrl_cli.artifacts.workload import TaskName
from hetrl_cli.costmodel.types import PHASES
from hetrl_cli.planner.space import (
    GRANULARITIES,
    Granularity,
    Pool,
    allocate,
    count_pools,
    enumerate_pools,
    groupings,
)
from hetrl_cli.planner.tables import PHASE_OF, GroupOption, PairSpec, Tables

Subset = tuple[TaskName, ...]


@dataclass
class IlpSpace:
    """Everything the MILP reads: pools, groupings, feasible (subset, pool) options and pair tables."""

    granularity: Granularity
    pools: list[Pool]
    groupings: list[tuple[Subset, ...]]
    subsets: list[Subset]
    options: dict[tuple[int, int], GroupOption]
    """(subset index, pool index) → the group option on the pool's canonical devices (feasible only)."""
    pair_costs: dict[tuple[bool, float], dict[tuple[int, int], float]] = field(default_factory=dict)
    """(weight sync?, bytes) → {(src pool, dst pool): seconds} for capacity-compatible pool pairs."""
    same_sync: dict[tuple[int, int], float] = field(default_factory=dict)
    """(subset, pool) → weight sync seconds when actor_train and generation share the subset."""
    produced: dict[int, float] = field(default_factory=dict)
    """Subset → bytes its inference tasks hand to the training groups (boundary 1)."""
    complete: bool = True
    """False when building ran out of budget (the space actually solved is then smaller)."""

    def feasible_pools(self, s: int) -> list[int]:
        return [p for (ss, p) in self.options if ss == s]


def choose_granularity(tables: Tables, max_pools: int) -> Granularity | None:
    """The finest granularity whose pool count stays under `max_pools` (None: even whole hosts exceed it)."""
    best = None
    for g in GRANULARITIES:
        if count_pools(tables.classes, g) <= max_pools:
            best = g
    return best


def build_space(tables: Tables, granularity: Granularity, deadline: float | None = None) -> IlpSpace:
    """Enumerate pools and groupings and fill every table the MILP reads (cost-model calls happen here)."""
    classes = tables.classes
    pools = enumerate_pools(classes, granularity)
    all_groupings = groupings(tables.tasks)
    subsets = sorted({g for gs in all_groupings for g in gs}, key=lambda s: (len(s), s))
    space = IlpSpace(granularity, pools, all_groupings, subsets, {})
    canonical = [allocate(classes, [p])[0] for p in pools]
    # Small pools first: under a deadline the space stays a clean "pools up to size n" prefix.
    order = sorted(range(len(pools)), key=lambda i: (sum(len(canonical[i]) for _ in [0]), i))
    for p in order:
        if deadline is not None and time.monotonic() > deadline:
            space.complete = False
            break
        for s, subset in enumerate(subsets):
            option = tables.group_option(subset, canonical[p])
            if option is not None:
                space.options[(s, p)] = option
                if "actor_train" in subset and "generation" in subset:
                    space.same_sync[(s, p)] = tables.same_group_weight_sync(canonical[p])
    _fill_pairs(tables, space)
    return space


def _compatible(classes, a: Pool, b: Pool) -> bool:
    """Whether two pools fit a class's capacity together."""
    return all((wa + wb) * c.per_host + pa + pb <= c.size for c, (wa, pa), (wb, pb) in zip(classes, a, b, strict=True))


def _fill_pairs(tables: Tables, space: IlpSpace) -> None:
    """Pair tables by (kind, bytes): weight sync train → generation, rollouts generation → others, and
    experience producer → trainer; each over the capacity-compatible pairs of feasible pools."""
    index = {s: i for i, s in enumerate(space.subsets)}
    roles = _roles(space)
    rollout = experience = None
    for grouping in space.groupings:
        for spec in tables.pair_specs(grouping):
            if spec.weight_sync:
                continue
            if spec.boundary == 0:
                rollout = spec.nbytes
            else:
                space.produced[index[grouping[spec.src]]] = spec.nbytes
                experience = experience or set()
                experience.add(spec.nbytes)
    wanted: list[tuple[bool, float, set[int], set[int]]] = [(True, 0.0, roles["train_apart"], roles["gen_apart"])]
    if rollout is not None:
        wanted.append((False, rollout, roles["gen"], roles["not_gen"]))
    for nbytes in sorted(experience or ()):
        producers = {p for (s, p) in space.options if space.produced.get(s) == nbytes}
        wanted.append((False, nbytes, producers, roles["trainer"]))
    for weight_sync, nbytes, src_pools, dst_pools in wanted:
        spec = PairSpec("pair", 0, 0, nbytes, weight_sync)
        table = space.pair_costs.setdefault((weight_sync, nbytes), {})
        for p1 in sorted(src_pools):
            for p2 in sorted(dst_pools):
                a, b = space.pools[p1], space.pools[p2]
                if (p1, p2) in table or not _compatible(tables.classes, a, b):
                    continue
                da, db = allocate(tables.classes, [a, b])
                table[(p1, p2)] = tables.pair_cost(spec, da, db)


def _roles(space: IlpSpace) -> dict[str, set[int]]:
    """Pools that some subset of each role can take (for the pair tables)."""
    roles: dict[str, set[int]] = {k: set() for k in ("train_apart", "gen_apart", "gen", "not_gen", "trainer")}
    for s, p in space.options:
        subset = space.subsets[s]
        gen, train = "generation" in subset, "actor_train" in subset
        if train and not gen:
            roles["train_apart"].add(p)
        if gen and not train:
            roles["gen_apart"].add(p)
        roles["gen" if gen else "not_gen"].add(p)
        if any(PHASE_OF[t] == 2 for t in subset):
            roles["trainer"].add(p)
    return roles


# --- the MILP -------------------------------------------------------------------------------------


@dataclass
class IlpResult:
    status: str
    """optimal, feasible, nosolution, infeasible."""
    objective: float | None
    bound: float | None
    seconds: float
    grouping: tuple[Subset, ...] | None = None
    pools: list[Pool] | None = None
    options: list[GroupOption] | None = None
    n_binaries: int = 0
    n_constraints: int = 0


class IlpModel:
    """The MILP of docs/planner.md; one method per constraint family, named as the docs label them."""

    def __init__(self, tables: Tables, space: IlpSpace, cutoff: float | None = None) -> None:
        import pyomo.environ as pyo

        self.pyo = pyo
        self.tables, self.space = tables, space
        self.cutoff = cutoff
        self.m = m = pyo.ConcreteModel()
        self.sidx = {s: i for i, s in enumerate(space.subsets)}
        m.G = pyo.Set(initialize=range(len(space.groupings)))
        m.X = pyo.Set(initialize=sorted(space.options), dimen=2)
        m.y = pyo.Var(m.G, domain=pyo.Binary)
        m.x = pyo.Var(m.X, domain=pyo.Binary)
        m.z = pyo.Var(range(len(PHASES)), domain=pyo.NonNegativeReals)
        m.omega = pyo.Var(domain=pyo.NonNegativeReals)
        m.T = pyo.Var(domain=pyo.NonNegativeReals)
        self.by_subset: dict[int, list[int]] = {}
        for s, p in space.options:
            self.by_subset.setdefault(s, []).append(p)
        self.a_one_grouping()
        self.b_one_pool_per_group()
        self.c_capacity()
        self.d_two_parts()
        self.e_phase_max()
        self.f_weight_sync()
        self.g_transfers()
        self.h_iteration()

    def _sum(self, terms):
        return self.pyo.quicksum(terms) if terms else 0.0

    def a_one_grouping(self) -> None:
        """(a) Σ_G y_G = 1."""
        m = self.m
        m.a = self.pyo.Constraint(expr=self._sum(m.y[g] for g in m.G) == 1)

    def b_one_pool_per_group(self) -> None:
        """(b) for every subset S: Σ_P x[S,P] = Σ_{G ∋ S} y_G (selected subsets = the chosen grouping's groups)."""
        m, sp = self.m, self.space
        m.b = self.pyo.ConstraintList()
        for s, subset in enumerate(sp.subsets):
            containing = [g for g, gs in enumerate(sp.groupings) if subset in gs]
            if not containing and not self.by_subset.get(s):
                continue
            lhs = self._sum(m.x[s, p] for p in self.by_subset.get(s, []))
            m.b.add(lhs == self._sum(m.y[g] for g in containing))

    def c_capacity(self) -> None:
        """(c) for every device class k: Σ_{S,P} (whole_k·D_k + part_k)·x[S,P] ≤ |k|."""
        m, sp = self.m, self.space
        m.c = self.pyo.ConstraintList()
        for k, c in enumerate(self.tables.classes):
            terms = []
            for s, p in sp.options:
                whole, part = sp.pools[p][k]
                if whole or part:
                    terms.append((whole * c.per_host + part) * m.x[s, p])
            if terms:
                m.c.add(self._sum(terms) <= c.size)

    def d_two_parts(self) -> None:
        """(d) for every class k: at most two groups take a partial sub-host (two parts ≤ D/2 share one)."""
        m, sp = self.m, self.space
        m.d = self.pyo.ConstraintList()
        for k in range(len(self.tables.classes)):
            terms = [m.x[s, p] for s, p in sp.options if sp.pools[p][k][1]]
            if len(terms) > 2:
                m.d.add(self._sum(terms) <= 2)

    def e_phase_max(self) -> None:
        """(e) for every phase i and subset S with tasks in i: z_i ≥ Σ_P t_i(S,P)·x[S,P]."""
        m, sp = self.m, self.space
        m.e = self.pyo.ConstraintList()
        for i in range(len(PHASES)):
            for s, subset in enumerate(sp.subsets):
                if not any(PHASE_OF[t] == i for t in subset):
                    continue
                terms = [sp.options[(s, p)].phase_s[i] * m.x[s, p] for p in self.by_subset.get(s, [])]
                if terms:
                    m.e.add(m.z[i] >= self._sum(terms))
            if self.tables.floor[i] > 0:  # the rule-based reward runs on the driver, on no device
                m.e.add(m.z[i] >= self.tables.floor[i])

    def _indicator(self, keep) -> dict[int, object]:
        """Pool → Σ x[S, pool] over the subsets S that `keep` accepts (how many chosen groups take it)."""
        out: dict[int, list] = {}
        for s, p in self.space.options:
            if keep(self.space.subsets[s]):
                out.setdefault(p, []).append(self.m.x[s, p])
        return {p: self._sum(terms) for p, terms in out.items()}

    def f_weight_sync(self) -> None:
        """(f) ω ≥ weight sync. Apart: a transportation linearisation W[P1,P2] ≥ 0 with row sums = u_train[P1]
        and column sums = u_gen[P2] (exact on binaries, tight in the LP) and ω ≥ Σ c·W; shared group:
        ω ≥ Σ_P ws(P)·x[S,P]."""
        m, sp, pyo = self.m, self.space, self.pyo
        m.f = pyo.ConstraintList()
        u_train = self._indicator(lambda s: "actor_train" in s and "generation" not in s)
        u_gen = self._indicator(lambda s: "generation" in s and "actor_train" not in s)
        table = sp.pair_costs.get((True, 0.0), {})
        pairs = [pq for pq in table if pq[0] in u_train and pq[1] in u_gen]
        m.W = pyo.Var(pairs, domain=pyo.NonNegativeReals, bounds=(0, 1))
        rows: dict[int, list] = {}
        cols: dict[int, list] = {}
        for p1, p2 in pairs:
            rows.setdefault(p1, []).append(m.W[p1, p2])
            cols.setdefault(p2, []).append(m.W[p1, p2])
        for p1, expr in u_train.items():
            m.f.add(self._sum(rows.get(p1, [])) == expr)
        for p2, expr in u_gen.items():
            m.f.add(self._sum(cols.get(p2, [])) == expr)
        if pairs:
            m.f.add(m.omega >= self._sum(table[pq] * m.W[pq] for pq in pairs))
        by_subset: dict[int, list] = {}
        for (s, p), seconds in sp.same_sync.items():
            by_subset.setdefault(s, []).append(seconds * m.x[s, p])
        for terms in by_subset.values():
            m.f.add(m.omega >= self._sum(terms))

    def g_transfers(self) -> None:
        """(g) Boundary 0: τ0 ≥ Σ_P2 c(P1,P2)·v[P2] − M·(1 − u_gen[P1]) per generation pool P1, v = pools of the
        other groups (all receive the rollouts). Boundary 1, per producer subset S and its pool P1:
        τ1_S ≥ Σ_P2 c(P1,P2)·t[P2] − [S trains]·c(P1,P1)·x[S,P1] − M·(1 − x[S,P1]), t = trainer pools (a
        group does not send to itself). Big-M rows: the transfers are small, so their weak relaxation costs
        little bound."""
        m, sp, pyo = self.m, self.space, self.pyo
        m.g = pyo.ConstraintList()
        n_groups = len(self.tables.tasks)
        rollout = next((k for k in sp.pair_costs if not k[0] and k[1] not in sp.produced.values()), None)
        m.tau0 = pyo.Var(domain=pyo.NonNegativeReals)
        if rollout is not None:
            table = sp.pair_costs[rollout]
            u_gen = self._indicator(lambda s: "generation" in s)
            v = self._indicator(lambda s: "generation" not in s)
            for p1, gate in u_gen.items():
                entries = [(p2, table[(p1, p2)]) for p2 in v if (p1, p2) in table and table[(p1, p2)] > 0]
                if entries:
                    big = (n_groups - 1) * max(c for _, c in entries)
                    rhs = self._sum(c * v[p2] for p2, c in entries)
                    m.g.add(m.tau0 >= rhs - big * (1 - gate))
        producers = sorted(sp.produced)
        m.tau1 = pyo.Var(producers, domain=pyo.NonNegativeReals)
        trainers = self._indicator(lambda s: any(PHASE_OF[t] == 2 for t in s))
        for s in producers:
            table = sp.pair_costs.get((False, sp.produced[s]), {})
            trains = any(PHASE_OF[t] == 2 for t in sp.subsets[s])
            for p1 in self.by_subset.get(s, []):
                entries = [(p2, table[(p1, p2)]) for p2 in trainers if (p1, p2) in table and table[(p1, p2)] > 0]
                if not entries:
                    continue
                big = 2 * max(c for _, c in entries)
                rhs = self._sum(c * trainers[p2] for p2, c in entries)
                if trains and (p1, p1) in table:
                    rhs = rhs - table[(p1, p1)] * m.x[s, p1]
                m.g.add(m.tau1[s] >= rhs - big * (1 - m.x[s, p1]))

    def _boundary(self, b: int):
        """Seconds of phase boundary b: the sum of its hand-overs (they funnel through the controller)."""
        return self.m.tau0 if b == 0 else self._sum(self.m.tau1[s] for s in self.m.tau1)

    def h_iteration(self) -> None:
        """(h) T ≥ Σ z + ω + Σ τ (sync); async with generation alone: T ≥ max(z_0 + ω, B_0 + z_1 + B_1 + z_2)
        with B_b = Σ τ over boundary b."""
        m = self.m
        pyo = self.pyo
        transfers = self._boundary(0) + self._boundary(1)
        sync = self._sum(m.z[i] for i in range(len(PHASES))) + m.omega + transfers
        m.h = pyo.ConstraintList()
        alone = ("generation",)
        if self.tables.workload.mode == "async" and alone in self.sidx:
            s = self.sidx[alone]
            y_alone = self._sum(m.x[s, p] for p in self.by_subset.get(s, []))
            big = self._upper_bound()
            m.h.add(m.z[0] + m.omega - big * (1 - y_alone) <= m.T)
            m.h.add(self._sum(m.z[i] for i in range(1, len(PHASES))) + transfers - big * (1 - y_alone) <= m.T)
            m.h.add(sync - big * y_alone <= m.T)
        else:
            m.h.add(sync <= m.T)
        m.objective = pyo.Objective(expr=m.T, sense=pyo.minimize)
        if self.cutoff is not None:  # only plans better than the incumbent are of interest
            m.h.add(self.cutoff * (1 - 1e-7) >= m.T)

    def _upper_bound(self) -> float:
        sp = self.space
        phase = sum(
            max([self.tables.floor[i], *(o.phase_s[i] for o in sp.options.values())]) for i in range(len(PHASES))
        )
        pairs = len(self.tables.tasks) * sum(max(t.values(), default=0.0) for t in sp.pair_costs.values())
        same = max(sp.same_sync.values(), default=0.0)
        return phase + pairs + same + 1.0

    def solve(self, time_limit_s: float, threads: int = 1) -> IlpResult:
        from pyomo.contrib.solver.common.factory import SolverFactory

        pyo, m, sp = self.pyo, self.m, self.space
        opt = SolverFactory("highs")
        start = time.monotonic()
        res = opt.solve(
            m,
            time_limit=max(0.5, time_limit_s),
            threads=threads,
            raise_exception_on_nonoptimal_result=False,
            load_solutions=False,
        )
        seconds = time.monotonic() - start
        term, sol = res.termination_condition.name, res.solution_status.name
        n_bin = len(m.x) + len(m.y)
        n_con = sum(len(c) for c in m.component_objects(pyo.Constraint, active=True))
        bound = _finite(res.objective_bound)
        if sol == "noSolution":
            status = "infeasible" if term == "provenInfeasible" else "nosolution"
            return IlpResult(status, None, bound, seconds, n_binaries=n_bin, n_constraints=n_con)
        res.solution_loader.load_vars()
        objective = _finite(res.incumbent_objective)
        status = "optimal" if term == "convergenceCriteriaSatisfied" and sol == "optimal" else "feasible"
        g = next(g for g in m.G if pyo.value(m.y[g]) > 0.5)
        grouping = sp.groupings[g]
        chosen = {s: p for (s, p) in m.X if pyo.value(m.x[s, p]) > 0.5}
        pools = [sp.pools[chosen[self.sidx[subset]]] for subset in grouping]
        options = [sp.options[(self.sidx[subset], chosen[self.sidx[subset]])] for subset in grouping]
        if status == "optimal" and bound is None:
            bound = objective
        return IlpResult(status, objective, bound, seconds, grouping, pools, options, n_bin, n_con)


def _finite(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if abs(value) < 1e300 else None


def realise(tables: Tables, grouping: tuple[Subset, ...], pools: list[Pool], options: list[GroupOption]):
    """Concrete devices for the chosen pools (joint allocation) and each option moved onto them."""
    devices = allocate(tables.classes, pools)
    return [relabel(o, dict(zip(o.devices, d, strict=True))) for o, d in zip(options, devices, strict=True)]


def relabel(option: GroupOption, mapping: dict[str, str]) -> GroupOption:
    """The same option on interchangeable devices (`mapping`: old id → new id)."""
    from hetrl_cli.costmodel.types import TaskPlacement

    def move(p: TaskPlacement) -> TaskPlacement:
        reps = tuple(tuple(tuple(mapping[d] for d in stage) for stage in rep) for rep in p.replicas)
        return TaskPlacement(p.task, reps, p.batch_shares, p.layer_splits, p.offload)

    return GroupOption(
        tasks=option.tasks,
        devices=tuple(mapping[d] for d in option.devices),
        layouts=option.layouts,
        placements=tuple(move(p) for p in option.placements),
        task_s=option.task_s,
        phase_s=option.phase_s,
    )


def brute_force(tables: Tables, space: IlpSpace) -> tuple[float, tuple[Subset, ...], list[GroupOption]] | None:
    """The optimum over the same space by enumeration (tests, tiny instances only)."""
    import itertools

    index = {s: i for i, s in enumerate(space.subsets)}
    best = None
    for grouping in space.groupings:
        choices = [space.feasible_pools(index[s]) for s in grouping]
        for combo in itertools.product(*choices):
            pools = [space.pools[p] for p in combo]
            if not _fits(tables, pools):
                continue
            options = [space.options[(index[s], p)] for s, p in zip(grouping, combo, strict=True)]
            real = realise(tables, grouping, pools, options)
            value = tables.score(grouping, real)
            if best is None or value < best[0] - 1e-12:
                best = (value, grouping, real)
    return best


def _fits(tables: Tables, pools: list[Pool]) -> bool:
    for k, c in enumerate(tables.classes):
        if sum(p[k][0] * c.per_host + p[k][1] for p in pools) > c.size:
            return False
        if sum(1 for p in pools if p[k][1]) > 2:
            return False
    return True


def subspace(space: IlpSpace, grouping: tuple[Subset, ...]) -> IlpSpace:
    """The space restricted to one grouping (L1 fixed): the MILP of each leaf of the grouping search."""
    keep = {i for i, s in enumerate(space.subsets) if s in grouping}
    return IlpSpace(
        granularity=space.granularity,
        pools=space.pools,
        groupings=[grouping],
        subsets=space.subsets,
        options={k: v for k, v in space.options.items() if k[0] in keep},
        pair_costs=space.pair_costs,
        same_sync={k: v for k, v in space.same_sync.items() if k[0] in keep},
        produced={s: b for s, b in space.produced.items() if s in keep},
        complete=space.complete,
    )


def lower_bound(tables: Tables, space: IlpSpace, grouping: tuple[Subset, ...]) -> float:
    """A cheap bound for one grouping: each group on its fastest pool per phase, capacity ignored, the
    cheapest weight sync of the table; inf when some group has no feasible pool."""
    index = {s: i for i, s in enumerate(space.subsets)}
    per_group = []
    for subset in grouping:
        opts = [space.options[(index[subset], p)] for p in space.feasible_pools(index[subset])]
        if not opts:
            return math.inf
        per_group.append([min(o.phase_s[i] for o in opts) for i in range(len(PHASES))])
    spans = [
        max(
            [
                tables.floor[i],
                *(t[i] for t, g in zip(per_group, grouping, strict=True) if any(PHASE_OF[x] == i for x in g)),
            ]
        )
        for i in range(len(PHASES))
    ]
    together = any("generation" in g and "actor_train" in g for g in grouping)
    if together:
        s = index[next(g for g in grouping if "generation" in g)]
        ws = min((v for (ss, _), v in space.same_sync.items() if ss == s), default=0.0)
    else:
        ws = min(space.pair_costs.get((True, 0.0), {}).values(), default=0.0)
    if tables.workload.mode == "async" and ("generation",) in grouping:
        return max(spans[0] + ws, spans[1] + spans[2])
    return sum(spans) + ws


def solve_ilp(
    tables: Tables,
    budget_s: float,
    *,
    max_pools: int = 150,
    granularity: Granularity | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[IlpResult, IlpSpace | None, str]:
    """Build the space at the finest affordable granularity, then branch over L1: one MILP per grouping in
    increasing lower bound, each cut off at the incumbent, skipped when its bound cannot beat it. The
    reported bound is the minimum over groupings of what is proven (MILP bound, cheap bound, or +inf)."""
    start = time.monotonic()
    gran = granularity or choose_granularity(tables, max_pools)
    if gran is None:
        n = count_pools(tables.classes, "host")
        return IlpResult("toolarge", None, None, 0.0), None, f"ILP space too large ({n} whole-host pools)"
    if progress:
        progress(f"ILP: tables at {gran} granularity")
    space = build_space(tables, gran, deadline=start + 0.6 * budget_s)
    bounds = {g: lower_bound(tables, space, g) for g in space.groupings}
    order = sorted(space.groupings, key=lambda g: (bounds[g], space.groupings.index(g)))
    best: IlpResult | None = None
    proven: dict[tuple, float] = {}
    solve_s, n_bin, n_con, exhausted = 0.0, 0, 0, False
    for grouping in order:
        if math.isinf(bounds[grouping]):
            proven[grouping] = math.inf
            continue
        if best is not None and bounds[grouping] >= best.objective * (1 - 1e-9):
            proven[grouping] = bounds[grouping]
            continue
        remaining = budget_s - (time.monotonic() - start)
        if remaining <= 0.2:
            exhausted = True
            break
        if progress:
            progress(f"ILP: grouping {' | '.join('+'.join(g) for g in grouping)}")
        model = IlpModel(tables, subspace(space, grouping), cutoff=best.objective if best else None)
        result = model.solve(remaining)
        solve_s += result.seconds
        n_bin, n_con = max(n_bin, result.n_binaries), max(n_con, result.n_constraints)
        if result.status == "infeasible":  # nothing in this grouping beats the cutoff (or fits at all)
            proven[grouping] = best.objective if best else math.inf
        elif result.status == "optimal":
            proven[grouping] = result.objective
        else:
            proven[grouping] = max(bounds[grouping], result.bound or 0.0)
        if result.objective is not None and (best is None or result.objective < best.objective):
            best = result
    open_bounds = [bounds[g] for g in space.groupings if g not in proven]
    bound = min([*proven.values(), *open_bounds], default=math.inf)
    note = (
        f"exact over {gran}-granularity pools ({len(space.pools)} pools, {len(space.groupings)} groupings, "
        f"{len(space.options)} feasible group options; largest leaf MILP {n_bin} binaries)"
    )
    if not space.complete:
        note += "; table building hit its share of the budget, so only the smaller pools were scored"
    if best is None:
        status = "nosolution" if exhausted or open_bounds else "infeasible"
        return IlpResult(status, None, None, solve_s), space, note
    best.bound = min(bound, best.objective)
    proven_all = not open_bounds and all(
        proven[g] >= best.objective * (1 - 1e-9) or g == best.grouping for g in space.groupings
    )
    best.status = "optimal" if proven_all and space.complete else "feasible"
    best.seconds = solve_s
    return best, space, note
