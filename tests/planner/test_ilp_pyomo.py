"""The ILP's leaves through pyomo (`--mip-solver`) and as files (`--write-model`) reach the default path's
optimum: the same rows, another solver (CBC, which `make setup` installs), or a file read back."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.errors import BadInput
from hetrl_cli.planner.api import make_plan
from hetrl_cli.planner.ilp import IlpModel, build_space, subspace
from hetrl_cli.planner.ilp_pyomo import available_mip_solvers, solve_with_pyomo
from hetrl_cli.planner.tables import Tables

from .conftest import TINY, cluster, workload

MIP_GAP = 1e-4
"""HiGHS's default relative MIP gap: the default path's optimum is proven to within it."""
SOLVER = "cbc"
CASES = [("2x2", "grpo", "sync"), ("2x2", "ppo", "async"), ("1p2", "grpo", "async"), ("1p2", "ppo", "sync")]


@pytest.fixture(scope="module", autouse=True)
def cbc_installed() -> None:
    """CBC is part of the project's setup (Makefile APT_PACKAGES): missing, the setup is broken, not the test."""
    assert shutil.which(SOLVER), "cbc is not on PATH; run `make setup` (as root it installs coinor-cbc)"
    assert SOLVER in available_mip_solvers()


@pytest.mark.parametrize(("tiny", "algorithm", "mode"), CASES)
def test_cbc_reaches_the_default_optimum(tiny, algorithm, mode):
    profile, w = cluster(f"tiny-{tiny}", TINY[tiny]), workload(algorithm, mode)
    default = make_plan(profile, w, solver="ilp", budget_s=30)
    other = make_plan(profile, w, solver="ilp", budget_s=60, mip_solver=SOLVER)
    assert other.solver.status == "optimal"
    assert "leaves solved by cbc through pyomo" in other.solver.note
    assert "≠" not in other.solver.note  # CBC's objective is what evaluate() says of its plan
    assert other.cost.iteration_s == pytest.approx(default.cost.iteration_s, rel=MIP_GAP)


@pytest.mark.parametrize("tiny", sorted(TINY))
def test_every_leaf_through_pyomo_equals_the_direct_leaf(tiny):
    """Every grouping's leaf (PPO async: 52 leaves, both lanes' rows), not only the winning one."""
    profile, w = cluster(f"tiny-{tiny}", TINY[tiny]), workload("ppo", "async")
    tables = Tables(CostModel(profile, w), profile, w)
    space = build_space(tables, "fine")
    for grouping in space.groupings:
        model = IlpModel(tables, subspace(space, grouping))
        direct, other = model.solve(30), solve_with_pyomo(model, SOLVER, 30)
        assert other.status == direct.status, grouping
        if direct.objective is not None:
            assert other.objective == pytest.approx(direct.objective, rel=MIP_GAP), grouping


def test_a_cutoff_leaf_is_infeasible_through_pyomo():
    """T's upper bound below the leaf's optimum (the search's cutoff) leaves no solution: CBC must say so."""
    profile, w = cluster("tiny-2x2", TINY["2x2"]), workload("grpo", "sync")
    tables = Tables(CostModel(profile, w), profile, w)
    space = build_space(tables, "fine")
    leaf = subspace(space, space.groupings[0])
    best = IlpModel(tables, leaf).solve(30).objective
    assert solve_with_pyomo(IlpModel(tables, leaf, cutoff=best * 0.99), SOLVER, 30).status == "infeasible"


def _cbc_objective(path: Path) -> float:
    """Solve a model file with the cbc program itself (not through pyomo)."""
    run = subprocess.run(["cbc", str(path), "solve"], capture_output=True, text=True, timeout=120, check=True)
    assert "Result - Optimal solution found" in run.stdout, run.stdout[-2000:]
    return float(re.search(r"Objective value:\s+(\S+)", run.stdout).group(1))


def test_written_models_read_back_to_the_plan_optimum(hetrl, tmp_path):
    """`--write-model`: every leaf as MPS and LP; read back by HiGHS and by the cbc program, the least leaf
    optimum is the plan's. CBC reads the LP as a MILP (its integer sections named so CBC knows them)."""
    import highspy

    save_artifact(cluster("tiny-1p2", TINY["1p2"]), tmp_path / "tiny.json")
    (tmp_path / "w.yaml").write_text(
        "algorithm: ppo\nmode: sync\nactor: {arch: qwen3-0.6b}\ncritic: {arch: qwen3-0.6b}\n"
    )
    (tmp_path / "leaves").mkdir()
    (tmp_path / "leaves" / "leaf-999.mps").write_text("an earlier run's leaf\n")
    (tmp_path / "leaves" / "notes.txt").write_text("the user's own file\n")
    args = ("plan", "tiny.json", "-w", "w.yaml", "--solver", "ilp", "--budget", "30s", "-o", "-")
    run = hetrl(*args, "--mip-solver", SOLVER, "--write-model", "leaves", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)  # neither CBC nor the writers print on stdout
    manifest = json.loads((tmp_path / "leaves" / "leaves.json").read_text())
    names = sorted(p.name for p in (tmp_path / "leaves").iterdir())
    listed = sorted(f for leaf in manifest["leaves"] for f in leaf["files"])
    assert names == sorted([*listed, "leaves.json", "notes.txt"])  # the stale leaf went, no temporary file stayed
    assert len(manifest["leaves"]) + len(manifest["skipped"]) == 52  # every PPO grouping, solvable or not
    optima = {}
    for name in listed:
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        assert h.readModel(str(tmp_path / "leaves" / name)) == highspy.HighsStatus.kOk, name
        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
            optima[name] = h.getInfo().objective_function_value
    best = min(optima.values())
    assert best == pytest.approx(plan["solver"]["objective"], rel=MIP_GAP)
    assert best == pytest.approx(plan["cost"]["iteration_s"], rel=MIP_GAP)
    winner = min(optima, key=optima.get).removesuffix(".mps").removesuffix(".lp")
    for suffix in (".mps", ".lp"):
        assert _cbc_objective(tmp_path / "leaves" / f"{winner}{suffix}") == pytest.approx(best, rel=MIP_GAP)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--solver", "ilp", "--mip-solver", "no-such-solver"), "is not a MILP solver pyomo drives; pyomo finds: "),
        (("--solver", "ilp", "--mip-solver", "ipopt"), "is not a MILP solver pyomo drives"),
        (("--solver", "hybrid", "--mip-solver", "cbc"), "apply to the ILP, not --solver hybrid; use --solver ilp"),
        (("--solver", "ilp", "--write-model", "plan-file"), "not a folder; name a folder for the leaf models"),
    ],
)
def test_bad_mip_options_are_one_line_and_exit_2(hetrl, tmp_path, extra, expected):
    save_artifact(cluster("tiny-2x2", TINY["2x2"]), tmp_path / "tiny.json")
    (tmp_path / "plan-file").write_text("")
    run = hetrl("plan", "tiny.json", "-o", "out.json", *extra, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert expected in run.stderr
    if "pyomo finds" in expected:
        assert "cbc" in run.stderr  # names what is installed here
    assert not (tmp_path / "out.json").exists()


def test_an_absent_solver_names_what_is_here():
    """A MILP solver pyomo knows but this machine lacks (no Xpress here) is refused before any work."""
    if "xpress" in available_mip_solvers():
        pytest.skip("xpress is installed here")
    with pytest.raises(BadInput, match=r"'xpress' is not installed here; pyomo finds: .*cbc"):
        make_plan(cluster("t", TINY["2x2"]), workload("grpo", "sync"), solver="ilp", budget_s=10, mip_solver="xpress")
