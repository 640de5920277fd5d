"""The exact planner: one MILP over every task grouping × every pool per group, solved by HiGHS.

Space (docs/planner.md "What the ILP is exact over"): groupings = every set partition of the device tasks;
each group gets one pool of the chosen granularity (space.py); on a pool each task runs the fastest layout
of `space.layouts` that fits next to its group mates (tables.py). Costs are the cost model's numbers for
those exact placements. Constraint families, as docs/planner.md labels them:
  (a) one grouping            (b) one pool per group of the chosen grouping
  (c) device-class capacity   (d) at most two partial sub-hosts per class (so pair costs are exact)
  (e) phase maxima            (f) weight sync between groups (linearised per pool row)
  (g) transfers between groups (same linearisation)   (h) iteration: sync sum, or the async max
  (i) the used devices' $/hour under --max-cost-per-hour (planner/cost.py; --objective cost: cost_ilp.py)
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from hetrl_cli.artifacts.rl import PHASES, SYNCED, sync_roles
from hetrl_cli.costmodel.compose import (
    BOUNDARIES,
    SPANS,
    WEIGHT_SYNC,
    Lane,
    iteration_s,
    lanes,
    overlaps,
    scales,
    span,
)
from hetrl_cli.planner.search import Budget, Subset
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

TABLES_SHARE = 0.6
"""Share of the ILP's budget within which its tables are built (the MILPs get the rest)."""
MIN_SOLVE_S = 0.2
"""A MILP is started only with more than this many seconds left."""
INCUMBENT_SLACK = 1e-6
"""An incumbent's cutoff is raised by this share: a plan of the space exactly as good is still found (the ILP's
own plan is kept where the hybrid ties it)."""


@dataclass
class IlpSpace:
    """Everything the MILP reads: pools, groupings, feasible (subset, pool) options and pair tables."""

    granularity: Granularity
    pools: list[Pool]
    groupings: list[tuple[Subset, ...]]
    subsets: list[Subset]
    options: dict[tuple[int, int], GroupOption]
    """(subset index, pool index) → the group option on the pool's canonical devices (feasible only)."""
    pair_costs: dict[tuple[str, float], dict[tuple[int, int], float]] = field(default_factory=dict)
    """(kind, bytes) → {(src pool, dst pool): seconds} for capacity-compatible pool pairs; kind is a weight
    sync's role ('actor', 'critic'; bytes 0) or 'transfer'."""
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


def build_space(tables: Tables, granularity: Granularity, budget: Budget | None = None) -> IlpSpace:
    """Enumerate pools and groupings and fill every table the MILP reads (cost-model calls happen here); past
    the `budget`'s deadline the larger pools are left out (`IlpSpace.complete`)."""
    classes = tables.classes
    pools = enumerate_pools(classes, granularity)
    all_groupings = groupings(tables.tasks)
    subsets = sorted({g for gs in all_groupings for g in gs}, key=lambda s: (len(s), s))
    space = IlpSpace(granularity, pools, all_groupings, subsets, {})
    canonical = [allocate(classes, [p])[0] for p in pools]
    # Small pools first: under a deadline the space stays a clean "pools up to size n" prefix.
    order = sorted(range(len(pools)), key=lambda i: (sum(len(canonical[i]) for _ in [0]), i))
    for p in order:
        if budget is not None and budget.remaining_s() < 0:
            space.complete = False
            break
        for s, subset in enumerate(subsets):
            option = tables.group_option(subset, canonical[p])
            if option is not None:
                space.options[(s, p)] = option
                if "actor_train" in subset and "generation" in subset:
                    space.same_sync[(s, p)] = tables.same_group_weight_sync(canonical[p], option.placements)
    _fill_pairs(tables, space)
    return space


def _compatible(classes, a: Pool, b: Pool) -> bool:
    """Whether two pools fit a class's capacity together."""
    return all((wa + wb) * c.per_host + pa + pb <= c.size for c, (wa, pa), (wb, pb) in zip(classes, a, b, strict=True))


def _fill_pairs(tables: Tables, space: IlpSpace) -> None:
    """Pair tables by (kind, bytes): weight syncs actor_train → generation and critic_train → critic_inference,
    rollouts generation → others, and experience producer → trainer; each over the capacity-compatible pairs
    of feasible pools."""
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
    wanted: list[tuple[str, float, set[int], set[int]]] = [
        (role, 0.0, roles[f"{role}_train_apart"], roles[f"{role}_infer_apart"]) for role in SYNCED
    ]
    if rollout is not None:
        wanted.append(("transfer", rollout, roles["gen"], roles["not_gen"]))
    for nbytes in sorted(experience or ()):
        producers = {p for (s, p) in space.options if space.produced.get(s) == nbytes}
        wanted.append(("transfer", nbytes, producers, roles["trainer"]))
    for kind, nbytes, src_pools, dst_pools in wanted:
        if not src_pools or not dst_pools:
            continue
        spec = PairSpec("pair", 0, 0, nbytes, role=None if kind == "transfer" else kind)
        table = space.pair_costs.setdefault((kind, nbytes), {})
        for p1 in sorted(src_pools):
            for p2 in sorted(dst_pools):
                a, b = space.pools[p1], space.pools[p2]
                if (p1, p2) in table or not _compatible(tables.classes, a, b):
                    continue
                da, db = allocate(tables.classes, [a, b])
                table[(p1, p2)] = tables.pair_cost(spec, da, db)


def _roles(space: IlpSpace) -> dict[str, set[int]]:
    """Pools that some subset of each role can take (for the pair tables)."""
    roles: dict[str, set[int]] = {k: set() for k in ("gen", "not_gen", "trainer")}
    for role in SYNCED:
        roles[f"{role}_train_apart"], roles[f"{role}_infer_apart"] = set(), set()
    for s, p in space.options:
        subset = space.subsets[s]
        for role, (train_task, infer_task) in SYNCED.items():
            train, infer = train_task in subset, infer_task in subset
            if train and not infer:
                roles[f"{role}_train_apart"].add(p)
            if infer and not train:
                roles[f"{role}_infer_apart"].add(p)
        gen = "generation" in subset
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


class _Lp:
    """A MILP as plain arrays (columns with bounds and integrality, rows as sparse coefficient maps), handed
    to HiGHS in one call. Rows are `lower ≤ Σ coef·col ≤ upper`; an expression is a {column: coef} dict."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def var(self, lower: float = 0.0, upper: float = math.inf, integer: bool = False) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.lower) - 1

    def row(self, expr: dict[int, float], lower: float = -math.inf, upper: float = math.inf) -> None:
        self.rows.append((expr, lower, upper))

    def csr(self) -> tuple[list[int], list[int], list[float]]:
        """The rows' nonzero coefficients in compressed sparse row form: (row starts, columns, values); every
        solver path (HiGHS here, pyomo in ilp_pyomo.py, the MPS/LP files) reads the model through this."""
        starts: list[int] = []
        index: list[int] = []
        value: list[float] = []
        for expr, _, _ in self.rows:
            starts.append(len(index))
            for col, coef in expr.items():
                if coef != 0.0:
                    index.append(col)
                    value.append(coef)
        return starts, index, value


def _expr(*parts: tuple[float, dict[int, float] | int]) -> dict[int, float]:
    """Σ scale·part, a part being a column or an expression; coefficients of one column add up."""
    out: dict[int, float] = {}
    for scale, part in parts:
        items = part.items() if isinstance(part, dict) else ((part, 1.0),)
        for col, coef in items:
            out[col] = out.get(col, 0.0) + scale * coef
    return out


def _sum(cols) -> dict[int, float]:
    return _expr(*((1.0, c) for c in cols))


class IlpModel:
    """The MILP of docs/planner.md; one method per constraint family, named as the docs label them.

    Rows go straight into arrays for HiGHS (`highspy`): building the same model through pyomo took about
    three times as long as HiGHS took to solve it (PPO, 203 groupings: ~30 s of model building)."""

    def __init__(self, tables: Tables, space: IlpSpace, cutoff: float | None = None) -> None:
        self.tables, self.space = tables, space
        self.cutoff = cutoff
        self.lp = lp = _Lp()
        self.sidx = {s: i for i, s in enumerate(space.subsets)}
        self.y = {g: lp.var(0.0, 1.0, integer=True) for g in range(len(space.groupings))}
        self.x = {k: lp.var(0.0, 1.0, integer=True) for k in sorted(space.options)}
        self.z = [lp.var() for _ in PHASES]
        self.omega = lp.var()
        self.T = lp.var(upper=cutoff * (1 - 1e-7) if cutoff is not None else math.inf)
        """Only plans better than the incumbent are of interest (the cutoff is T's upper bound)."""
        self.tau0 = lp.var()
        self.tau1: dict[int, int] = {}
        self.by_subset: dict[int, list[int]] = {}
        for s, p in self.x:
            self.by_subset.setdefault(s, []).append(p)
        self.a_one_grouping()
        self.b_one_pool_per_group()
        self.c_capacity()
        self.d_two_parts()
        self.e_phase_max()
        self.f_weight_sync()
        self.g_transfers()
        self.h_iteration()
        self.i_cost_cap()

    def a_one_grouping(self) -> None:
        """(a) Σ_G y_G = 1."""
        self.lp.row(_sum(self.y.values()), 1.0, 1.0)

    def b_one_pool_per_group(self) -> None:
        """(b) for every subset S: Σ_P x[S,P] = Σ_{G ∋ S} y_G (selected subsets = the chosen grouping's groups)."""
        sp = self.space
        for s, subset in enumerate(sp.subsets):
            containing = [g for g, gs in enumerate(sp.groupings) if subset in gs]
            if not containing and not self.by_subset.get(s):
                continue
            picked = _sum(self.x[s, p] for p in self.by_subset.get(s, []))
            self.lp.row(_expr((1.0, picked), (-1.0, _sum(self.y[g] for g in containing))), 0.0, 0.0)

    def c_capacity(self) -> None:
        """(c) for every device class k: Σ_{S,P} (whole_k·D_k + part_k)·x[S,P] ≤ |k|."""
        sp = self.space
        for k, c in enumerate(self.tables.classes):
            terms = {}
            for (_, p), col in self.x.items():
                whole, part = sp.pools[p][k]
                if whole or part:
                    terms[col] = float(whole * c.per_host + part)
            if terms:
                self.lp.row(terms, upper=c.size)

    def d_two_parts(self) -> None:
        """(d) for every class k: at most two groups take a partial sub-host (two parts ≤ D/2 share one)."""
        sp = self.space
        for k in range(len(self.tables.classes)):
            cols = [col for (_, p), col in self.x.items() if sp.pools[p][k][1]]
            if len(cols) > 2:
                self.lp.row(_sum(cols), upper=2.0)

    def e_phase_max(self) -> None:
        """(e) for every phase i and subset S with tasks in i: z_i ≥ Σ_P t_i(S,P)·x[S,P]."""
        sp = self.space
        for i in range(len(PHASES)):
            for s, subset in enumerate(sp.subsets):
                if not any(PHASE_OF[t] == i for t in subset) or not self.by_subset.get(s):
                    continue
                terms = _expr(*((sp.options[(s, p)].phase_s[i], self.x[s, p]) for p in self.by_subset[s]))
                self.lp.row(_expr((1.0, self.z[i]), (-1.0, terms)), lower=0.0)
            if self.tables.floor[i] > 0:  # the rule-based reward runs on the driver, on no device
                self.lp.row({self.z[i]: 1.0}, lower=self.tables.floor[i])

    def _indicator(self, keep) -> dict[int, dict[int, float]]:
        """Pool → Σ x[S, pool] over the subsets S that `keep` accepts (how many chosen groups take it)."""
        out: dict[int, list[int]] = {}
        for (s, p), col in self.x.items():
            if keep(self.space.subsets[s]):
                out.setdefault(p, []).append(col)
        return {p: _sum(cols) for p, cols in out.items()}

    def f_weight_sync(self) -> None:
        """(f) ω ≥ ω_actor + ω_critic, each ≥ its weight sync. Apart: a transportation linearisation W[P1,P2] ≥ 0
        with row sums = u_train[P1] and column sums = u_infer[P2] (exact on binaries, tight in the LP) and
        ω_role ≥ Σ c·W; actor_train and generation in one group: ω_actor ≥ Σ_P ws(P)·x[S,P]; the critic's
        tasks in one group: ω also ≥ each option's in-group critic sync (GroupOption.critic_sync_s, 0 where
        inference runs on the trained weights) times its x[S,P]."""
        sp, lp = self.space, self.lp
        parts = {}
        for role, (train_task, infer_task) in SYNCED.items():
            if train_task in self.tables.tasks and infer_task in self.tables.tasks:
                parts[role] = self._sync_rows(role, train_task, infer_task)
        in_group = [(-o.critic_sync_s, self.x[k]) for k, o in sp.options.items() if o.critic_sync_s > 0]
        lp.row(_expr((1.0, self.omega), *((-1.0, v) for v in parts.values()), *in_group), lower=0.0)
        actor = parts.get("actor", self.omega)  # the colocated sync adds to the critic's like the apart one
        by_subset: dict[int, list[tuple[float, int]]] = {}
        for (s, p), seconds in sp.same_sync.items():
            by_subset.setdefault(s, []).append((seconds, self.x[s, p]))
        for terms in by_subset.values():
            lp.row(_expr((1.0, actor), *((-c, col) for c, col in terms)), lower=0.0)

    def _sync_rows(self, role: str, train_task: str, infer_task: str) -> int:
        """ω_role and its transportation rows for the groups where `train_task` and `infer_task` are apart."""
        sp, lp = self.space, self.lp
        omega = lp.var()
        u_train = self._indicator(lambda s: train_task in s and infer_task not in s)
        u_gen = self._indicator(lambda s: infer_task in s and train_task not in s)
        table = sp.pair_costs.get((role, 0.0), {})
        W = {pq: lp.var(0.0, 1.0) for pq in table if pq[0] in u_train and pq[1] in u_gen}
        rows: dict[int, list[int]] = {}
        cols: dict[int, list[int]] = {}
        for (p1, p2), col in W.items():
            rows.setdefault(p1, []).append(col)
            cols.setdefault(p2, []).append(col)
        for p1, expr in u_train.items():
            lp.row(_expr((1.0, _sum(rows.get(p1, []))), (-1.0, expr)), 0.0, 0.0)
        for p2, expr in u_gen.items():
            lp.row(_expr((1.0, _sum(cols.get(p2, []))), (-1.0, expr)), 0.0, 0.0)
        if W:
            lp.row(_expr((1.0, omega), *((-table[pq], col) for pq, col in W.items())), lower=0.0)
        return omega

    def g_transfers(self) -> None:
        """(g) Boundary 0: τ0 ≥ Σ_P2 c(P1,P2)·v[P2] − M·(1 − u_gen[P1]) per generation pool P1, v = pools of the
        other groups (all receive the rollouts). Boundary 1, per producer subset S and its pool P1:
        τ1_S ≥ Σ_P2 c(P1,P2)·t[P2] − [S trains]·c(P1,P1)·x[S,P1] − M·(1 − x[S,P1]), t = trainer pools (a
        group does not send to itself). Big-M rows: the transfers are small, so their weak relaxation costs
        little bound. Each row is written as τ − rhs − M·gate ≥ −M."""
        sp, lp = self.space, self.lp
        n_groups = len(self.tables.tasks)
        rollout = next((k for k in sp.pair_costs if k[0] == "transfer" and k[1] not in sp.produced.values()), None)
        if rollout is not None:
            table = sp.pair_costs[rollout]
            u_gen = self._indicator(lambda s: "generation" in s)
            v = self._indicator(lambda s: "generation" not in s)
            for p1, gate in u_gen.items():
                entries = [(p2, table[(p1, p2)]) for p2 in v if (p1, p2) in table and table[(p1, p2)] > 0]
                if entries:
                    big = (n_groups - 1) * max(c for _, c in entries)
                    rhs = _expr(*((c, v[p2]) for p2, c in entries))
                    lp.row(_expr((1.0, self.tau0), (-1.0, rhs), (-big, gate)), lower=-big)
        self.tau1 = {s: lp.var() for s in sorted(sp.produced)}
        trainers = self._indicator(lambda s: any(PHASE_OF[t] == 2 for t in s))
        for s, tau in self.tau1.items():
            table = sp.pair_costs.get(("transfer", sp.produced[s]), {})
            trains = any(PHASE_OF[t] == 2 for t in sp.subsets[s])
            for p1 in self.by_subset.get(s, []):
                entries = [(p2, table[(p1, p2)]) for p2 in trainers if (p1, p2) in table and table[(p1, p2)] > 0]
                if not entries:
                    continue
                big = 2 * max(c for _, c in entries)
                rhs = _expr(*((c, trainers[p2]) for p2, c in entries))
                if trains and (p1, p1) in table:
                    rhs = _expr((1.0, rhs), (-table[(p1, p1)], self.x[s, p1]))
                lp.row(_expr((1.0, tau), (-1.0, rhs), (-big, self.x[s, p1])), lower=-big)

    def h_iteration(self) -> None:
        """(h) One row T ≥ Σ terms per lane of the composition (costmodel/compose.py), with span:k = z_k,
        boundary:1 = τ0, boundary:2 = Σ τ1, weight_sync = ω. An async workload whose space has the
        `(generation,)` group switches with Y = its x: the async lanes T ≥ lane − M(1−Y), the sync lane
        T ≥ lane − M·Y."""
        lp = self.lp
        alone = ("generation",)
        if overlaps(self.tables.workload.mode, self.sidx):
            s = self.sidx[alone]
            y_alone = _sum(self.x[s, p] for p in self.by_subset.get(s, []))
            big = self._upper_bound()
            for lane, scale in zip(lanes(True), scales(True), strict=True):  # T ≥ scale·lane
                lp.row(_expr((scale, self._lane(lane)), (big, y_alone), (-1.0, self.T)), upper=big)
            for lane in lanes(False):
                lp.row(_expr((1.0, self._lane(lane)), (-big, y_alone), (-1.0, self.T)), upper=0.0)
        else:
            for lane in lanes(False):
                lp.row(_expr((1.0, self._lane(lane)), (-1.0, self.T)), upper=0.0)

    def i_cost_cap(self) -> None:
        """(i) Σ_{S,P} price(P)·x[S,P] ≤ --max-cost-per-hour: the devices the groups take, at $/hour
        (planner/cost.py; idle devices are not rented)."""
        objective = self.tables.objective
        if objective.max_cost_per_hour is None:
            return
        pools, classes = self.space.pools, self.tables.classes
        terms = {col: objective.pool_hourly(classes, pools[p]) for (_, p), col in self.x.items()}
        self.lp.row(terms, upper=objective.max_cost_per_hour)

    def _lane(self, lane: Lane) -> dict[int, float]:
        """Σ of a lane's terms as columns, in column order (so each row is, entry for entry, the one written
        out by hand before the lanes were shared)."""
        term = {
            **{name: {z: 1.0} for name, z in zip(SPANS, self.z, strict=True)},
            BOUNDARIES[0]: {self.tau0: 1.0},
            BOUNDARIES[1]: _sum(self.tau1.values()),
            WEIGHT_SYNC: {self.omega: 1.0},
        }
        expr = _expr(*((1.0, term[name]) for part in lane for name in part))
        return dict(sorted(expr.items()))

    def _upper_bound(self) -> float:
        sp = self.space
        phase = sum(span((o.phase_s[i] for o in sp.options.values()), self.tables.floor[i]) for i in range(len(PHASES)))
        pairs = len(self.tables.tasks) * sum(max(t.values(), default=0.0) for t in sp.pair_costs.values())
        same = max(sp.same_sync.values(), default=0.0)
        return phase + pairs + same + 1.0

    def highs(self, time_limit_s: float | None = None, threads: int = 1):
        """A silent `highspy.Highs` holding this MILP (minimise T), ready to run or to write as MPS/LP."""
        import highspy
        import numpy as np

        lp = self.lp
        h = _quiet_highs(highspy)
        if time_limit_s is not None:
            h.setOptionValue("time_limit", max(0.5, time_limit_s))
        h.setOptionValue("threads", threads)
        n = len(lp.lower)
        inf = highspy.kHighsInf
        h.addVars(n, np.array([_inf(v, inf) for v in lp.lower]), np.array([_inf(v, inf) for v in lp.upper]))
        h.changeColCost(self.T, 1.0)
        ints = np.array([i for i in range(n) if lp.integer[i]], dtype=np.int32)
        h.changeColsIntegrality(len(ints), ints, np.array([highspy.HighsVarType.kInteger] * len(ints)))
        starts, index, value = lp.csr()
        h.addRows(
            len(lp.rows),
            np.array([_inf(r[1], inf) for r in lp.rows]),
            np.array([_inf(r[2], inf) for r in lp.rows]),
            len(index),
            np.array(starts, dtype=np.int32),
            np.array(index, dtype=np.int32),
            np.array(value),
        )
        return h

    def solve(self, time_limit_s: float, threads: int = 1) -> IlpResult:
        """Minimise T with HiGHS (one thread, default 1e-4 relative MIP gap) within the time limit."""
        import highspy

        h = self.highs(time_limit_s, threads)
        start = time.monotonic()
        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kSolveError:  # seen once in 48 settings: retry unpresolved
            h.setOptionValue("presolve", "off")
            h.setOptionValue("time_limit", max(0.5, time_limit_s - (time.monotonic() - start)))
            h.run()
        seconds = time.monotonic() - start
        status, info = h.getModelStatus(), h.getInfo()
        bound = _finite(info.mip_dual_bound)
        if info.primal_solution_status != 2:  # 2 = kSolutionStatusFeasible: no incumbent
            # T ≥ 0 is minimised, so "unbounded or infeasible" (presolve's verdict) can only mean infeasible
            proven = (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible)
            return self.result("infeasible" if status in proven else "nosolution", None, None, bound, seconds)
        optimal = status == highspy.HighsModelStatus.kOptimal
        objective = _finite(info.objective_function_value)
        return self.result("optimal" if optimal else "feasible", h.getSolution().col_value, objective, bound, seconds)

    def result(self, status: str, values, objective: float | None, bound: float | None, seconds: float) -> IlpResult:
        """An `IlpResult` from any solver's answer: `values` by column index (None without an incumbent);
        `status` is optimal, feasible, infeasible or nosolution."""
        sp = self.space
        n_bin, n_con = len(self.x) + len(self.y), len(self.lp.rows)
        if values is None:
            return IlpResult(status, None, bound, seconds, n_binaries=n_bin, n_constraints=n_con)
        g = next(g for g, col in self.y.items() if values[col] > 0.5)
        grouping = sp.groupings[g]
        chosen = {s: p for (s, p), col in self.x.items() if values[col] > 0.5}
        pools = [sp.pools[chosen[self.sidx[subset]]] for subset in grouping]
        options = [sp.options[(self.sidx[subset], chosen[self.sidx[subset]])] for subset in grouping]
        if status == "optimal" and bound is None:
            bound = objective
        return IlpResult(status, objective, bound, seconds, grouping, pools, options, n_bin, n_con)


def _inf(value: float, highs_inf: float) -> float:
    return highs_inf if value == math.inf else -highs_inf if value == -math.inf else value


def _quiet_highs(highspy):
    """A silent `highspy.Highs()`: the first one in a process prints a banner to file descriptor 1 before any
    option can be set, which would corrupt JSON on stdout (`hetrl plan -o -`); fd 1 is pointed at /dev/null
    while it is made."""
    import os
    import sys

    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
    h.setOptionValue("output_flag", False)
    return h


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
        critic_sync_s=option.critic_sync_s,
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
    cheapest weight syncs of the tables; inf when some group has no feasible pool."""
    index = {s: i for i, s in enumerate(space.subsets)}
    per_group = []
    for subset in grouping:
        opts = [space.options[(index[subset], p)] for p in space.feasible_pools(index[subset])]
        if not opts:
            return math.inf
        per_group.append([min(o.phase_s[i] for o in opts) for i in range(len(PHASES))])
    spans = [
        span((t[i] for t, g in zip(per_group, grouping, strict=True) if any(PHASE_OF[x] == i for x in g)), floor)
        for i, floor in enumerate(tables.floor)
    ]
    ws = 0.0
    for role, apart in sync_roles({t: g for g in grouping for t in g}):
        if apart:
            ws += min(space.pair_costs.get((role, 0.0), {}).values(), default=0.0)
        else:  # the actor's local reshard inside the generation group
            s = index[next(g for g in grouping if "generation" in g)]
            ws += min((v for (ss, _), v in space.same_sync.items() if ss == s), default=0.0)
    return iteration_s(spans, (0.0, 0.0), ws, overlaps(tables.workload.mode, grouping))


def _note(space: IlpSpace, gran: Granularity, n_bin: int) -> str:
    note = (
        f"exact over {gran}-granularity pools ({len(space.pools)} pools, {len(space.groupings)} groupings, "
        f"{len(space.options)} feasible group options; largest leaf MILP {n_bin} binaries)"
    )
    if not space.complete:
        note += "; table building hit its share of the budget, so only the smaller pools were scored"
    return note


def solve_ilp(
    tables: Tables,
    budget: Budget,
    *,
    max_pools: int = 150,
    granularity: Granularity | None = None,
    progress: Callable[[str], None] | None = None,
    leaf_solver: Callable[[IlpModel, float], IlpResult] | None = None,
    incumbent: float | None = None,
) -> tuple[IlpResult, IlpSpace | None, str]:
    """Build the space at the finest affordable granularity, then branch over L1: one MILP per grouping in
    increasing lower bound, each cut off at the incumbent, skipped when its bound cannot beat it. The
    reported bound is the minimum over groupings of what is proven (MILP bound, cheap bound, or +inf). The
    tables get TABLES_SHARE of what is left of the `budget`, the MILPs the rest. `leaf_solver(model, seconds)`
    solves each leaf instead of HiGHS directly (ilp_pyomo.py: any solver pyomo drives). `incumbent` (seconds of
    a plan found before, the hybrid's) is the first cutoff, raised by INCUMBENT_SLACK so a plan as good is still
    found here; when none in the space is as good, the result has no options and its status and bound say
    what was proven about the incumbent (optimal: nothing in the space beats it). Where even whole hosts give
    more than `max_pools` pools: status `toolarge` (lazy.solve_exact runs the lazy ILP there)."""
    budget = budget.from_now()
    gran = granularity or choose_granularity(tables, max_pools)
    if gran is None:
        n = count_pools(tables.classes, "host")
        return IlpResult("toolarge", None, None, 0.0), None, f"ILP space too large ({n} whole-host pools)"
    if progress:
        progress(f"ILP: tables at {gran} granularity")
    space = build_space(tables, gran, budget.first(TABLES_SHARE))
    best, n_bin = search_space(tables, space, budget, progress=progress, leaf_solver=leaf_solver, incumbent=incumbent)
    return best, space, _note(space, gran, n_bin)


def search_space(
    tables: Tables,
    space: IlpSpace,
    budget: Budget,
    *,
    progress: Callable[[str], None] | None = None,
    leaf_solver: Callable[[IlpModel, float], IlpResult] | None = None,
    incumbent: float | None = None,
) -> tuple[IlpResult, int]:
    """The branch over L1 of `solve_ilp` on a built space: (its result, the largest leaf's binaries)."""
    bounds = {g: lower_bound(tables, space, g) for g in space.groupings}
    order = sorted(space.groupings, key=lambda g: (bounds[g], space.groupings.index(g)))
    best: IlpResult | None = None
    start_cut = math.inf if incumbent is None else incumbent * (1 + INCUMBENT_SLACK)

    def cut() -> float:
        return min(start_cut, best.objective if best is not None and best.objective is not None else math.inf)

    proven: dict[tuple, float] = {}
    solve_s, n_bin, n_con, exhausted = 0.0, 0, 0, False
    for grouping in order:
        if math.isinf(bounds[grouping]):
            proven[grouping] = math.inf
            continue
        if bounds[grouping] >= cut() * (1 - 1e-9):
            proven[grouping] = bounds[grouping]
            continue
        remaining = budget.remaining_s()
        if remaining <= MIN_SOLVE_S:
            exhausted = True
            break
        if progress:
            progress(f"ILP: grouping {' | '.join('+'.join(g) for g in grouping)}")
        result = solved_leaf(tables, grouping, cut()) if leaf_solver is None else None  # auto's probe's leaf
        if result is None:
            model = IlpModel(tables, subspace(space, grouping), cutoff=None if math.isinf(cut()) else cut())
            result = model.solve(remaining) if leaf_solver is None else leaf_solver(model, remaining)
        solve_s += result.seconds
        n_bin, n_con = max(n_bin, result.n_binaries), max(n_con, result.n_constraints)
        if result.status == "infeasible":  # nothing in this grouping beats the cutoff (or fits at all)
            proven[grouping] = cut()
        elif result.status == "optimal":
            proven[grouping] = result.objective
        else:
            proven[grouping] = max(bounds[grouping], result.bound or 0.0)
        if result.objective is not None and (best is None or result.objective < best.objective):
            best = result
    open_bounds = [bounds[g] for g in space.groupings if g not in proven]
    bound = min([*proven.values(), *open_bounds], default=math.inf)
    if best is None and incumbent is not None:  # nothing in the space beats the incumbent
        status = "optimal" if not open_bounds and space.complete else "feasible"
        return IlpResult(status, None, min(bound, incumbent), solve_s), n_bin
    if best is None:
        status = "nosolution" if exhausted or open_bounds else "infeasible"
        return IlpResult(status, None, None, solve_s), n_bin
    best.bound = min(bound, best.objective)
    proven_all = not open_bounds and all(
        proven[g] >= best.objective * (1 - 1e-9) or g == best.grouping for g in space.groupings
    )
    best.status = "optimal" if proven_all and space.complete else "feasible"
    best.seconds = solve_s
    return best, n_bin


def estimate_s(
    tables: Tables, granularity: Granularity, incumbent_s: float | None = None, limit_s: float = 60.0
) -> float:
    """auto's estimate of the exact solver's CPU seconds on `tables` as they are (the hybrid's start has filled
    some of them): the group options and pair tables still missing, timed on a stratified sample, and the leaf
    MILPs: with the start's plan (`incumbent_s`) as cutoff, the two largest leaves solved (within `limit_s`
    each; the exact solver reuses them) and all priced from the slower, else from their columns
    (planner/estimate.py; the hybrid's start is budgeted apart). CPU seconds, not wall: other processes' load
    does not move it (timing wall seconds, one setting was estimated at 2.6-9.5 s within one day on the shared
    box); on an idle machine they are the ILP's wall seconds (one thread)."""
    return estimate_parts(tables, granularity, incumbent_s, limit_s).total_s


def estimate_parts(tables: Tables, granularity: Granularity, incumbent_s: float | None = None, limit_s: float = 60.0):
    """`estimate_s` by its parts (`estimate.Estimate`)."""
    from hetrl_cli.planner.estimate import LEAVES_PER_LARGEST, estimate, leaves_from_largest

    parts = estimate(tables, granularity)
    if incumbent_s is None or parts.tables_s >= LEAVES_PER_LARGEST * limit_s:  # the tables alone overrun auto's share
        return parts
    finest = max(groupings(tables.tasks), key=len)  # every task apart: the slowest leaf of u10, u14, u18
    probes = [probe_leaf(tables, granularity, g, incumbent_s, limit_s) for g in dict.fromkeys([finest, parts.largest])]
    return leaves_from_largest(parts, max(p.seconds for p in probes))


@dataclass
class Probe:
    """A leaf MILP solved for auto's estimate as the exact solver would solve it: its grouping, cutoff, CPU
    seconds (its group options and pair tables apart: the tables' part of the estimate counts them), result."""

    grouping: tuple[Subset, ...]
    cutoff: float
    seconds: float
    """Model building and HiGHS, in process CPU seconds."""
    result: IlpResult


_PROBED: weakref.WeakKeyDictionary[Tables, dict[tuple[Subset, ...], Probe]] = weakref.WeakKeyDictionary()
"""The probes' proven leaves per tables, by grouping, until the exact solver takes them (`solved_leaf`)."""


def probe_leaf(
    tables: Tables, granularity: Granularity, grouping: tuple[Subset, ...], incumbent_s: float, limit_s: float
) -> Probe:
    """Solve `grouping`'s leaf MILP with the start's `incumbent_s` as cutoff, as `search_space` would (its
    group options on every pool, its pair tables, the same MILP), within `limit_s`; a proven result is kept
    for the exact solver."""
    pools = enumerate_pools(tables.classes, granularity)
    all_groupings = groupings(tables.tasks)
    subsets = sorted({g for gs in all_groupings for g in gs}, key=lambda s: (len(s), s))
    space = IlpSpace(granularity, pools, [grouping], subsets, {})
    index = {s: i for i, s in enumerate(subsets)}
    for p, pool in enumerate(pools):  # as build_space, for this grouping's subsets only
        devices = allocate(tables.classes, [pool])[0]
        for subset in grouping:
            option = tables.group_option(subset, devices)
            if option is not None:
                space.options[(index[subset], p)] = option
                if "actor_train" in subset and "generation" in subset:
                    space.same_sync[(index[subset], p)] = tables.same_group_weight_sync(devices, option.placements)
    _fill_pairs(tables, space)
    start = time.process_time()
    cutoff = incumbent_s * (1 + INCUMBENT_SLACK)
    result = IlpModel(tables, space, cutoff=cutoff).solve(limit_s)
    probe = Probe(grouping, cutoff, time.process_time() - start, result)
    if result.status in ("optimal", "infeasible"):  # proven: the exact solver may take it as it is
        _PROBED.setdefault(tables, {})[grouping] = probe
    return probe


def solved_leaf(tables: Tables, grouping: tuple[Subset, ...], cutoff: float) -> IlpResult | None:
    """The probe's leaf result for `grouping` under `cutoff` (`search_space` asks before it builds a leaf),
    once; None where none was kept or the cutoff is above the probe's (cutoffs only fall, so a leaf proven
    under the probe's holds under a lower one: a plan under it stays optimal, else nothing beats it)."""
    probe = _PROBED.get(tables, {}).get(grouping)
    if probe is None or cutoff > probe.cutoff:
        return None
    del _PROBED[tables][grouping]
    result = probe.result
    if result.status == "optimal" and result.objective is not None and result.objective < cutoff * (1 - 1e-7):
        return result
    return IlpResult(
        "infeasible", None, None, result.seconds, n_binaries=result.n_binaries, n_constraints=result.n_constraints
    )
