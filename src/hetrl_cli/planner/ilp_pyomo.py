"""The ILP's leaf MILPs for other solvers: through pyomo (`hetrl plan --solver ilp --mip-solver NAME`) or as
MPS and LP files (`--write-model DIR`).

Both read the model the direct path builds (`IlpModel.lp`: column bounds and integrality, rows as
`lower ≤ Σ coef·col ≤ upper`, objective min T), so neither restates a constraint and the paths cannot
drift. The direct HiGHS path stays the default: building the leaves through pyomo costs more than HiGHS
takes to solve them (docs/planner.md, "Other MILP solvers"). The files are written by HiGHS's own writers
from the same arrays (pyomo's writers would first need the pyomo model).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hetrl_cli.errors import BadInput, Unwritable
from hetrl_cli.planner.ilp import IlpModel, IlpResult, IlpSpace, lower_bound, subspace

MIP_SOLVERS = (
    "appsi_highs",
    "highs",
    "cbc",
    "appsi_cbc",
    "glpk",
    "scip",
    "gurobi",
    "gurobi_direct",
    "appsi_gurobi",
    "cplex",
    "cplex_direct",
    "appsi_cplex",
    "xpress",
    "xpress_direct",
    "mosek",
    "mosek_direct",
    "cuopt",
)
"""pyomo solver names that solve MILPs (pyomo knows others: NLP solvers and decomposition wrappers, which
would ignore or mishandle the binaries)."""
INSTALL_HINT = "e.g. `apt-get install coinor-cbc` (or `make setup`), or a commercial solver's Python package"
MODEL_FORMATS = ("mps", "lp")
"""Each leaf is written in both: free MPS by HiGHS (any MILP solver) and CPLEX LP by `lp_text` (readable; HiGHS's
own LP writer heads its integer sections `bin`/`gen`, which CBC's reader takes for column names and then
silently solves the relaxation)."""
LP_TERMS_PER_LINE = 6
"""LP readers limit line length (CPLEX: 560 characters); long rows continue on the next line."""
MANIFEST = "leaves.json"
LEAF_NAME = re.compile(r"^leaf-\d{3,}\.(mps|lp)$")


@dataclass(frozen=True)
class LeafOptions:
    """How `make_plan`'s ILP treats its leaves: `mip_solver` (a pyomo solver name; None = HiGHS directly) and
    `model_dir` (write every leaf there as MPS and LP; None = write nothing)."""

    mip_solver: str | None = None
    model_dir: Path | None = None

    def check(self, solver: str) -> None:
        """Refuse bad options before any work: they need the ILP, an installed solver, a writable folder."""
        if self.mip_solver is None and self.model_dir is None:
            return
        if solver != "ilp":
            raise BadInput(f"--mip-solver and --write-model apply to the ILP, not --solver {solver}; use --solver ilp")
        if self.mip_solver is not None:
            check_mip_solver(self.mip_solver)
        if self.model_dir is not None:
            check_model_dir(self.model_dir)

    def leaf_solver(self) -> Callable[[IlpModel, float], IlpResult] | None:
        return None if self.mip_solver is None else pyomo_leaf_solver(self.mip_solver)

    def finish(self, tables, space: IlpSpace | None) -> str:
        """Write the leaves if asked; what to add to the solver's note."""
        note = "" if self.mip_solver is None else f"; leaves solved by {self.mip_solver} through pyomo"
        if self.model_dir is None:
            return note
        if space is None:
            return f"{note}; no leaf models written (the ILP space was not built)"
        files = write_leaves(tables, space, self.model_dir)
        return f"{note}; {len(files) // len(MODEL_FORMATS)} leaf models written to {self.model_dir}"


# --- solving through pyomo --------------------------------------------------------------------------


def available_mip_solvers() -> list[str]:
    """The MILP solvers of MIP_SOLVERS that pyomo finds on this machine (binary on PATH, Python package)."""
    import logging

    import pyomo.environ  # noqa: F401  (registers the solver plugins with SolverFactory)
    from pyomo.opt import SolverFactory

    found = []
    quiet = logging.getLogger("pyomo")
    level, quiet.level = quiet.level, logging.CRITICAL  # a missing solver logs warnings as it is probed
    try:
        for name in MIP_SOLVERS:
            try:
                if SolverFactory(name).available(exception_flag=False):
                    found.append(name)
            except Exception:  # a solver plugin whose library is broken or unlicensed is not available
                continue
    finally:
        quiet.level = level
    return found


def check_mip_solver(name: str) -> None:
    """Raise BadInput (one line naming what is available here) unless pyomo can drive `name` for a MILP."""
    found = available_mip_solvers()
    if name in found:
        return
    what = "is not a MILP solver pyomo drives" if name not in MIP_SOLVERS else "is not installed here"
    have = ", ".join(found) if found else f"none; install one ({INSTALL_HINT})"
    shown = name if len(name) <= 40 else f"{name[:40]}…"
    raise BadInput(f"--mip-solver {shown!r} {what}; pyomo finds: {have} (or leave --mip-solver out for HiGHS)")


def pyomo_leaf_solver(name: str) -> Callable[[IlpModel, float], IlpResult]:
    """`solve_ilp`'s leaf_solver: each leaf MILP built in pyomo from its rows and solved by `name`."""

    def solve(model: IlpModel, time_limit_s: float) -> IlpResult:
        return solve_with_pyomo(model, name, time_limit_s)

    return solve


def to_pyomo(model: IlpModel):
    """The leaf as a pyomo ConcreteModel: `v[i]` is column i, `rows[r]` is row r, `objective` is min T."""
    import pyomo.environ as pyo
    from pyomo.core.expr.numeric_expr import LinearExpression

    lp = model.lp
    starts, index, value = lp.csr()
    ends = [*starts[1:], len(index)]
    m = pyo.ConcreteModel(name="hetrl_ilp_leaf")
    m.v = pyo.Var(
        range(len(lp.lower)),
        within=lambda _m, i: pyo.Integers if lp.integer[i] else pyo.Reals,
        bounds=lambda _m, i: (_finite_or_none(lp.lower[i]), _finite_or_none(lp.upper[i])),
    )

    def row(m, r: int):
        lower, upper = lp.rows[r][1], lp.rows[r][2]
        a, b = starts[r], ends[r]
        if a == b:  # no column left in the row: it holds or it does not
            return pyo.Constraint.Skip if lower <= 0.0 <= upper else pyo.Constraint.Infeasible
        expr = LinearExpression(constant=0.0, linear_coefs=value[a:b], linear_vars=[m.v[c] for c in index[a:b]])
        if lower == upper:
            return expr == lower
        return (_finite_or_none(lower), expr, _finite_or_none(upper))

    m.rows = pyo.Constraint(range(len(lp.rows)), rule=row)
    m.objective = pyo.Objective(expr=m.v[model.T], sense=pyo.minimize)
    return m


def solve_with_pyomo(model: IlpModel, name: str, time_limit_s: float) -> IlpResult:
    """Build the leaf in pyomo and solve it with solver `name` within the time limit (the solver's own default
    MIP gap: CBC, GLPK and SCIP solve to optimality, Gurobi and CPLEX stop at 1e-4 like HiGHS)."""
    from pyomo.opt import SolverFactory, TerminationCondition

    start = time.monotonic()
    pm = to_pyomo(model)
    results = SolverFactory(name).solve(pm, load_solutions=False, timelimit=max(1.0, time_limit_s))
    seconds = time.monotonic() - start
    condition = results.solver.termination_condition
    bound = _finite_bound(results)
    if condition in (TerminationCondition.infeasible, TerminationCondition.infeasibleOrUnbounded):
        return model.result("infeasible", None, None, bound, seconds)  # T ≥ 0 is minimised: never unbounded
    if len(results.solution) == 0:
        return model.result("nosolution", None, None, bound, seconds)
    pm.solutions.load_from(results)
    values = [pm.v[i].value for i in range(len(model.lp.lower))]
    if values[model.T] is None:
        return model.result("nosolution", None, None, bound, seconds)
    status = "optimal" if condition == TerminationCondition.optimal else "feasible"
    return model.result(status, values, float(values[model.T]), bound, seconds)


def _finite_or_none(value: float) -> float | None:
    return None if math.isinf(value) else value


def _finite_bound(results) -> float | None:
    """The solver's proven lower bound on T, where it reports one."""
    try:
        value = results.problem.lower_bound
    except AttributeError:
        return None
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# --- MPS/LP files -----------------------------------------------------------------------------------


def check_model_dir(directory: Path) -> None:
    """Refuse `--write-model DIR` before any work: DIR must be a folder or a path one can create."""
    if directory.exists() and not directory.is_dir():
        raise Unwritable(f"--write-model {directory}: not a folder; name a folder for the leaf models")
    folder = directory
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise Unwritable(f"--write-model {directory}: cannot write here ({folder} is not a writable folder)")


def column_names(model: IlpModel) -> list[str]:
    """Readable column names for the files: y<g>, x<subset>_<pool>, z<phase>, omega, T, tau0, tau1_<subset>;
    the rest (transportation W and per-role ω) c<index>."""
    names = [f"c{i}" for i in range(len(model.lp.lower))]
    named = {**{col: f"y{g}" for g, col in model.y.items()}, **{col: f"x{s}_{p}" for (s, p), col in model.x.items()}}
    named |= {col: f"z{i}" for i, col in enumerate(model.z)}
    named |= {model.omega: "omega", model.T: "T", model.tau0: "tau0"}
    named |= {col: f"tau1_{s}" for s, col in model.tau1.items()}
    for col, name in named.items():
        names[col] = name
    return names


def write_leaves(tables, space: IlpSpace, directory: Path) -> list[Path]:
    """Write every leaf MILP of `space` (one per grouping, without the search's cutoff) as DIR/leaf-NNN.mps and
    .lp, then DIR/leaves.json naming each file's grouping and its cheap lower bound. The plan's objective is
    the least optimum over the files. Each file is written under a temporary name and renamed; files of an
    earlier run named leaf-NNN.mps/.lp that this run did not write are removed."""
    check_model_dir(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    manifest = {"objective": "minimise T (seconds per iteration)", "leaves": [], "skipped": []}
    for g, grouping in enumerate(space.groupings):
        groups = ["+".join(subset) for subset in grouping]
        bound = lower_bound(tables, space, grouping)
        if math.isinf(bound):  # some group fits on no pool: the leaf has no solution
            manifest["skipped"].append({"grouping": groups, "why": "a group fits on no pool"})
            continue
        model = IlpModel(tables, subspace(space, grouping))
        highs, names = model.highs(), column_names(model)
        for col, name in enumerate(names):
            highs.passColName(col, name)
        files = [
            _write_one(highs, directory, f"leaf-{g:03d}.mps"),
            _write_one(
                lp_text(model, names, f"hetrl ILP leaf {g}: {' | '.join(groups)}"), directory, f"leaf-{g:03d}.lp"
            ),
        ]
        written += files
        manifest["leaves"].append({"grouping": groups, "files": [f.name for f in files], "lower_bound_s": bound})
    _remove_stale(directory, {f.name for f in written})
    from hetrl_cli.artifacts.io import write_text_atomic

    write_text_atomic(directory / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return written


def lp_text(model: IlpModel, names: list[str], title: str) -> str:
    """The leaf in CPLEX LP format with the section names every LP reader knows (Binaries, Generals)."""
    lp = model.lp
    starts, index, value = lp.csr()
    ends = [*starts[1:], len(index)]
    lines = [f"\\ {title}", "Minimize", f" obj: + 1 {names[model.T]}", "Subject To"]
    for r, (_expr, lower, upper) in enumerate(lp.rows):
        terms = [
            f"{'-' if c < 0 else '+'} {abs(c)!r} {names[i]}"
            for c, i in zip(value[starts[r] : ends[r]], index[starts[r] : ends[r]], strict=True)
        ]
        if not terms:
            continue  # an empty row holds (the model builder writes none that does not)
        body = "\n   ".join(" ".join(terms[k : k + LP_TERMS_PER_LINE]) for k in range(0, len(terms), LP_TERMS_PER_LINE))
        if lower == upper:
            lines.append(f" r{r}: {body} = {lower!r}")
            continue
        if math.isfinite(lower):
            lines.append(f" r{r}{'_lo' if math.isfinite(upper) else ''}: {body} >= {lower!r}")
        if math.isfinite(upper):
            lines.append(f" r{r}{'_up' if math.isfinite(lower) else ''}: {body} <= {upper!r}")
    lines.append("Bounds")
    lines += [
        _lp_bound(names[i], lo, up)
        for i, (lo, up) in enumerate(zip(lp.lower, lp.upper, strict=True))
        if (lo, up) != (0.0, math.inf)
    ]
    binaries = [
        names[i] for i, integer in enumerate(lp.integer) if integer and (lp.lower[i], lp.upper[i]) == (0.0, 1.0)
    ]
    generals = [
        names[i] for i, integer in enumerate(lp.integer) if integer and (lp.lower[i], lp.upper[i]) != (0.0, 1.0)
    ]
    for header, cols in (("Binaries", binaries), ("Generals", generals)):
        if cols:
            lines += [header, *(f" {name}" for name in cols)]
    return "\n".join([*lines, "End", ""])


def _lp_bound(name: str, lower: float, upper: float) -> str:
    if math.isinf(lower) and math.isinf(upper):
        return f" {name} free"
    low = "-inf" if math.isinf(lower) else repr(lower)
    return f" {low} <= {name}" if math.isinf(upper) else f" {low} <= {name} <= {upper!r}"


def _write_one(source, directory: Path, name: str) -> Path:
    """Write `name` under a temporary name in `directory`, then rename it: `source` is the LP text, or a
    `highspy.Highs` holding the model (it picks the format by the file's extension)."""
    import highspy

    target = directory / name
    if not LEAF_NAME.match(name) or target.resolve().parent != directory.resolve():
        raise Unwritable(f"--write-model: refusing leaf file name {name!r} (it would leave {directory})")
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=target.suffix, dir=directory)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; the files get ordinary modes
    os.close(fd)
    try:
        if isinstance(source, str):
            Path(tmp).write_text(source, encoding="utf-8")
        elif source.writeModel(tmp) == highspy.HighsStatus.kError:
            raise Unwritable(f"--write-model {directory}: HiGHS could not write {name}; choose a writable folder")
        os.replace(tmp, target)
    except OSError as exc:
        raise Unwritable(f"--write-model {directory}: cannot write {name} ({exc.strerror})") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def _remove_stale(directory: Path, keep: set[str]) -> None:
    for path in directory.iterdir():
        if LEAF_NAME.match(path.name) and path.name not in keep and path.is_file():
            path.unlink()
