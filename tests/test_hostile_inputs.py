"""A corpus of malformed and hostile inputs: each gives one line (what, where, how to fix), exit 2, no
traceback and no file written. Profiles, plans and workloads come from anyone (DESIGN.md, 'Untrusted input')."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "profiles" / "paper-single-region.json"


def _profile(change: Callable[[dict], None]) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        data = json.loads(PROFILE.read_text())
        change(data)
        (tmp / "in.json").write_text(json.dumps(data))
        return ["plan", str(tmp / "in.json"), "--solver", "verl", "-o", str(tmp / "out" / "plan.json")]

    return make


def _plan(change: Callable[[dict], None]) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        data = json.loads((tmp.parent / "plan.json").read_text())
        change(data)
        (tmp / "in.json").write_text(json.dumps(data))
        return ["show", str(tmp / "in.json"), "--format", "json"]

    return make


def _plan_text(text: Callable[[str], str]) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        (tmp / "in.json").write_text(text((tmp.parent / "plan.json").read_text()))
        return ["show", str(tmp / "in.json")]

    return make


def _workload(yaml_text: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        (tmp / "w.yaml").write_text(yaml_text)
        out = str(tmp / "out" / "plan.json")
        return ["plan", str(PROFILE), "--workload", str(tmp / "w.yaml"), "--solver", "verl", "-o", out]

    return make


def _workload_with_model(config: object) -> Callable[[Path], list[str]]:
    """A workload whose actor is `{path: m}`, m/config.json holding `config` (next to the workload file)."""

    def make(tmp: Path) -> list[str]:
        (tmp / "m").mkdir()
        (tmp / "m" / "config.json").write_text(json.dumps(config))
        return _workload("actor: {path: m}\n")(tmp)

    return make


def _set(path: str, value: object) -> Callable[[dict], None]:
    """Set a dotted path (list indices as numbers) in a JSON document."""

    def change(data: dict) -> None:
        *parents, last = path.split(".")
        node: object = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]  # type: ignore[index]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value  # type: ignore[index]

    return change


def _big_int(text: str) -> str:
    data = json.loads(text)
    return json.dumps(data).replace(f'"iteration_s": {data["cost"]["iteration_s"]}', '"iteration_s": ' + "9" * 5000)


def _hosts(text: str) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        (tmp / "hosts.txt").write_text(text)
        return ["profile", str(tmp / "hosts.txt"), "-o", str(tmp / "out" / "profile.json")]

    return make


CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "hosts.txt: a 1 MB host name": (_hosts("h" * 2**20 + "\n"), "at most 1000"),
    "hosts.txt: slots with 5,000 digits": (_hosts("gpu-1 slots=" + "9" * 5000 + "\n"), "at most 1000"),
    "hosts.txt: a shell command as host": (_hosts("$(touch /tmp/pwned) slots=1\n"), "bad host"),
    "plan: a 5,000-digit integer": (_plan_text(_big_int), "too many digits"),
    "plan: nested 100,000 deep": (_plan_text(lambda _: "[" * 100_000 + "]" * 100_000), "nested too deeply"),
    "plan: infinite iteration time": (_plan(_set("cost.iteration_s", float("inf"))), "finite number"),
    "plan: NaN batch share": (_plan(_set("tasks.0.replicas.0.batch_share", float("nan"))), "finite number"),
    "plan: a name that leaves plans/": (_plan(_set("name", "../../etc/evil")), "leave its folder"),
    "plan: a device id with shell characters": (_plan(_set("groups.0.devices.0", "a;rm -rf ~/0")), "bad host"),
    "plan: true for micro_batch": (_plan(_set("workload.micro_batch", True)), "valid integer"),
    "plan: a number as text": (_plan(_set("workload.micro_batch", "8")), "valid integer"),
    "plan: empty": (_plan_text(lambda _: ""), "no input"),
    "plan: 100,000 timeline bars": (
        _plan(lambda d: d["cost"].update(timeline=d["cost"]["timeline"][:1] * 100_000)),
        "at most 1000 items",
    ),
    "plan: larger than 16 MiB": (_plan_text(lambda t: t + " " * (17 * 2**20)), "more than an artifact"),
    "profile: NaN TFLOP/s": (_profile(_set("devices.0.peak_tflops.bf16", float("nan"))), "finite number"),
    "profile: negative TFLOP/s": (_profile(_set("devices.0.peak_tflops.bf16", -5.0)), "greater than or equal"),
    "profile: a 1 MB host name": (_profile(_set("hosts.0.name", "h" * 2**20)), "too long"),
    "profile: a host name with a space": (_profile(_set("hosts.0.address", "a100-0 -oProxyCommand=x")), "bad host"),
    "profile: a name that leaves profiles/": (_profile(_set("name", "../x")), "leave its folder"),
    "profile: true for memory_bytes": (_profile(_set("devices.0.memory_bytes", True)), "valid integer"),
    "workload: lr .inf": (_workload("rl: {lr: .inf}\n"), "inf or NaN"),
    "workload: micro_batch true": (_workload("micro_batch: true\n"), "valid integer"),
    "workload: nested 10,000 deep": (_workload("a: " + "[" * 10_000 + "]" * 10_000 + "\n"), "nested too deeply"),
    "workload: empty": (_workload(""), "no input"),
    "workload: a model with neither arch nor path": (_workload("actor: {}\n"), "needs config_path"),
    "workload: a model the runtime cannot execute": (
        _workload_with_model({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12}),
        "model_type 'gpt2', which the runtime cannot execute",
    ),
    "workload: a config.json that is a list": (_workload_with_model([1, 2]), "not a JSON object"),
    "workload: a model path that does not exist": (_workload("actor: {path: nowhere}\n"), "cannot read the HF config"),
    "plan: an unknown MILP solver": (
        lambda tmp: ["plan", str(PROFILE), "--solver", "ilp", "--mip-solver", "x;id", "-o", str(tmp / "o.json")],
        "not a MILP solver",
    ),
    "plan: --write-model names a file": (
        lambda tmp: ["plan", str(PROFILE), "--solver", "ilp", "--write-model", str(PROFILE), "-o", str(tmp / "o")],
        "not a folder",
    ),
    "output: a directory": (lambda tmp: ["plan", str(PROFILE), "--solver", "verl", "-o", str(tmp)], "is a directory"),
    "output: under /proc": (
        lambda tmp: ["plan", str(PROFILE), "--solver", "verl", "-o", "/proc/hetrl-test/plan.json"],
        "cannot write here",
    ),
}


@pytest.fixture(scope="module")
def shipped_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real plan (the verl baseline on the shipped single-region profile) that the plan cases corrupt."""
    from conftest import run_hetrl

    root = tmp_path_factory.mktemp("hostile")
    result = run_hetrl("plan", PROFILE, "--solver", "verl", "-o", root / "plan.json")
    assert result.returncode == 0, result.stderr
    return root


@pytest.mark.skipif(sys.platform != "linux", reason="uses /proc as an unwritable place")
@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input_is_one_line_exit_2_and_writes_nothing(case: str, shipped_plan: Path, hetrl) -> None:
    make, words = CASES[case]
    tmp = shipped_plan / case.replace(" ", "_").replace("/", "_").replace(":", "")
    tmp.mkdir()
    args = make(tmp)
    before = sorted(p.relative_to(tmp) for p in tmp.rglob("*"))
    result = hetrl(*args, stdin="")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("hetrl: error: "), result.stderr[-2000:]
    assert words in lines[0]
    assert len(lines[0]) < 600  # nothing huge is echoed back
    assert "Traceback" not in result.stderr
    assert sorted(p.relative_to(tmp) for p in tmp.rglob("*")) == before


def test_a_forged_profile_fingerprint_is_recomputed_on_load(tmp_path: Path, hetrl) -> None:
    data = json.loads(PROFILE.read_text())
    true = data["fingerprint"]
    data["fingerprint"] = "sha256:forged0000000000"
    (tmp_path / "p.json").write_text(json.dumps(data))
    result = hetrl("plan", tmp_path / "p.json", "--solver", "verl", "-o", "-")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["profile_fingerprint"] == true
