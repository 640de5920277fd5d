"""Seeded mutation fuzzing of every untrusted input: the shipped profiles, cluster.yaml files, workloads,
hosts.txt files, a plan and a calibration, each mutated at every field (wrong types, missing and unknown keys,
absurd numbers, hostile strings) and as text (truncated, binary, non-UTF-8, YAML bombs, deep nesting).

Every variant must be either accepted or refused as one line naming the file (BadInput, exit 2): no
traceback, no exception class name, no file left behind, no shell reached, no SSH tried. Accepted variants go
on through the next stage (plan, show, simulate, run's checks), which must then succeed, refuse as one line or
say infeasible (exit 3); what it writes must load again. Lists are mutated at their first and last element
(the elements share a schema). The fast set is deterministic (one file of each kind, a seeded sample of the
plan's variants and of the CLI runs); the slow sweep takes every shipped file and more CLI runs.
HETRL_FUZZ_CLI_RUNS=0 runs every variant through the CLI (minutes).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SEED = 20261205
PROFILES = sorted((REPO / "profiles").glob("*.json"))
CLUSTERS = sorted((REPO / "profiles").glob("*.yaml"))
WORKLOADS = [REPO / "examples" / "tiny-grpo.yaml", REPO / "examples" / "emulate-ppo.yaml"]
HOSTS_FILES = [REPO / "examples" / "hosts.example.txt", REPO / "examples" / "localhost.txt"]
EMULATE_SPECS = [REPO / "examples" / "emulate-3host.yaml"]
SMALL_CLUSTER = {
    "name": "fuzz-small",
    "node_groups": [
        {"gpu": "A100 80GB", "gpus_per_node": 2, "nodes": 1, "region": "r1"},
        {"gpu": "L4", "gpus_per_node": 2, "nodes": 1, "region": "r2"},
    ],
    "network": {
        "intra_region": {"bandwidth": "100Gbps", "latency": "0.1ms"},
        "inter_region": {"default": {"bandwidth": "1Gbps", "latency": "20ms"}},
    },
}
"""Plans on the shipped 64-GPU profiles take 0.2 s; on this one a few ms, so accepted workload and
calibration variants can each be planned."""

LEAKED_NAMES = re.compile(
    r"Traceback|\b(Key|Type|Attribute|Index|Zero ?Division|Overflow|Recursion|Unicode\w*|Assertion|Runtime|"
    r"Lookup|Name|NotImplemented|JSONDecode|Validation|Constructor|Scanner|Parser|Composer)Error\b|"
    r"pydantic_core|errors\.pydantic\.dev|object has no attribute|NoneType|not subscriptable"
)
MAX_LINE = 2000


# ---------------------------------------------------------------------------------------------------------
# Mutations


@dataclass(frozen=True)
class Variant:
    """One malformed input: a label saying what was done where, and the file's bytes."""

    label: str
    data: bytes


def _hostile_strings(canary: Path) -> list[str]:
    return [
        "",
        " ",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"x; touch {canary}",
        "a|b&c>d<e",
        "line\nbreak",
        "nul\x00bell\x07esc\x1b[31m",
        "\u202eüñí名-🙂",
        "../../etc/passwd",
        "-oProxyCommand=id",
        "1e300",
        "-5",
        "x" * 5000,
    ]


WRONG_TYPES: list[object] = ["text", 7, 2.5, [], {}, None, True, [1, "a"], {"x": 1}]
NUMBERS: list[object] = [0, -1, -0.5, 1e-300, 1e308, -1e308, 2**63, -(2**63), 2**64 + 1, 10**400]
SPECIAL_FLOATS = [math.nan, math.inf, -math.inf]


def _paths(node: object, prefix: tuple = (), every_element: bool = False) -> Iterator[tuple]:
    """Every path into a JSON document; of a list only its first and last element unless `every_element`
    (the elements share a schema)."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key), every_element)
    elif isinstance(node, list):
        picks = range(len(node)) if every_element else sorted({0, len(node) - 1} if node else set())
        for index in picks:
            yield from _paths(node[index], (*prefix, index), every_element)


def _get(doc: object, path: tuple) -> object:
    for part in path:
        doc = doc[part]  # type: ignore[index]
    return doc


def _replaced(doc: object, path: tuple, value: object, delete: bool = False) -> object:
    """A deep copy of `doc` with the node at `path` replaced (or deleted)."""
    copy = json.loads(json.dumps(doc))
    parent = _get(copy, path[:-1])
    if delete:
        del parent[path[-1]]  # type: ignore[union-attr]
    else:
        parent[path[-1]] = value  # type: ignore[index]
    return copy


def _alternatives(value: object, canary: Path) -> list[object]:
    """What to put where `value` was: every other JSON type, absurd numbers, hostile strings, and for
    containers an empty one, a duplicated element and an unknown key."""
    out = [w for w in WRONG_TYPES if type(w) is not type(value)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out += NUMBERS + SPECIAL_FLOATS
    if isinstance(value, str):
        out += _hostile_strings(canary)
    if isinstance(value, list) and value:
        out += [[], [value[0], *value], [value[0]] * 3]
    if isinstance(value, dict):
        out += [{}, {**value, "unknown_field": 1}, {**value, "": None}]
    return out


def tree_variants(doc: object, canary: Path, every_element: bool = False) -> Iterator[tuple[str, object]]:
    """(label, mutated document) for every path and alternative, plus every dict key deleted."""
    for path in _paths(doc, every_element=every_element):
        if not path:
            continue
        where = ".".join(map(str, path))
        value = _get(doc, path)
        for alt in _alternatives(value, canary):
            yield f"{where} = {_short(alt)}", _replaced(doc, path, alt)
        if isinstance(_get(doc, path[:-1]), dict):
            yield f"{where} deleted", _replaced(doc, path, None, delete=True)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) < 40 else text[:37] + "..."


def text_variants(raw: bytes, rng: random.Random) -> list[Variant]:
    """Whole-file damage: truncation, garbage, bad encodings, nesting bombs, empty input."""
    cuts = sorted({1, len(raw) // 3, len(raw) // 2, len(raw) - 2, *(rng.randrange(1, len(raw)) for _ in range(4))})
    out = [Variant(f"truncated at byte {n}", raw[:n]) for n in cuts]
    out += [
        Variant("empty", b""),
        Variant("whitespace", b" \n\t\n"),
        Variant("binary garbage", bytes(rng.randrange(256) for _ in range(2048))),
        Variant("non-UTF-8 byte in the middle", raw[: len(raw) // 2] + b"\xff\xfe\xc3" + raw[len(raw) // 2 :]),
        Variant("latin-1 text", raw.decode().replace("e", "é").encode("latin-1", "replace")),
        Variant("UTF-16", raw.decode().encode("utf-16")),
        Variant("a byte-order mark", b"\xef\xbb\xbf" + raw),
        Variant("NUL bytes", raw.replace(b"\n", b"\x00\n", 3)),
        Variant("deep list nesting", b"[" * 200_000 + b"]" * 200_000),
        Variant("deep mapping nesting", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        Variant("a bare number", b"1e999"),
        Variant("a bare string", b'"cluster-profile"'),
        Variant("null", b"null"),
        Variant("a list", b"[1, 2, 3]"),
    ]
    return out


def yaml_text_variants(raw: bytes, canary: Path) -> list[Variant]:
    """YAML-only attacks: billion laughs (must be refused fast, never expanded), tags, duplicate keys."""
    laughs = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for i in range(1, 10):
        laughs += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
    text = raw.decode()
    first_key = text.split("\n")[[ln[:1].isalpha() for ln in text.split("\n")].index(True)].split(":")[0]
    return [
        Variant("billion laughs", laughs.encode()),
        Variant("billion laughs under a known key", (text + "\nnotes: *a9\n" + laughs).encode()),
        Variant(
            "billion laughs in a field", (laughs + text.replace(f"{first_key}:", f"{first_key}: *a9\nx0:", 1)).encode()
        ),
        Variant("python object tag", f"!!python/object/apply:os.system ['touch {canary}']\n".encode()),
        Variant("a python tag in a field", (text + "\nextra: !!python/name:os.system\n").encode()),
        Variant("duplicate key", (text + f"\n{first_key}: again\n").encode()),
        Variant("tabs for indentation", text.replace("  ", "\t").encode()),
        Variant("deep flow nesting", b"a: " + b"[" * 20_000 + b"]" * 20_000 + b"\n"),
        Variant("deep block nesting", "".join(f"{' ' * i}k{i}:\n" for i in range(3000)).encode()),
        Variant("a merge key bomb", b"a: &a {x: 1}\nb: {<<: *a, <<: *a}\n"),
        Variant("a document stream", text.encode() + b"\n---\n" + text.encode()),
        Variant("a 10,000-digit integer", f"{first_key}: {'9' * 10_000}\n".encode()),
        Variant(".nan and .inf", (text + "\nseed: .nan\n").encode()),
    ]


def json_doc_variants(doc: object, canary: Path, rng: random.Random, every_element: bool = False) -> list[Variant]:
    raw = json.dumps(doc, indent=2).encode()
    out = [
        Variant(label, json.dumps(d, allow_nan=True).encode()) for label, d in tree_variants(doc, canary, every_element)
    ]
    out += text_variants(raw, rng)
    if isinstance(doc, dict) and "schema_version" in doc:
        for version in (0, -1, 2, 99, "1", 1.0, None, 2**63):
            out.append(Variant(f"schema_version {version!r}", json.dumps({**doc, "schema_version": version}).encode()))
        out.append(Variant("another kind", json.dumps({**doc, "kind": "run-summary"}).encode()))
    return out


def yaml_doc_variants(doc: object, canary: Path, rng: random.Random, every_element: bool = False) -> list[Variant]:
    raw = yaml.safe_dump(doc, sort_keys=False).encode()
    out = []
    for label, mutated in tree_variants(doc, canary, every_element):
        try:
            out.append(Variant(label, yaml.safe_dump(mutated, sort_keys=False, allow_unicode=True).encode()))
        except (ValueError, yaml.YAMLError):  # NaN and inf are written as .nan/.inf by PyYAML, never refused
            continue
    return out + text_variants(raw, rng) + yaml_text_variants(raw, canary)


def hosts_variants(raw: bytes, canary: Path, rng: random.Random) -> list[Variant]:
    """Line-level damage to a hosts.txt: every token of every host line swapped for a hostile one, bad keys
    and values, duplicated lines."""
    lines = raw.decode().splitlines()
    hosts = [i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#")]
    values = ["", "0", "-1", "abc", "1e308", str(2**63), "9" * 5000, "²", "٣", "1,1", "0,-1", "a b", "x;id"]
    values += _hostile_strings(canary)
    targets = ["user@", "@host", "host:0", "host:65536", "host:²", "[::1", "[::1]:x", "::1:22", "-oProxyCommand=x"]
    targets += [s for s in _hostile_strings(canary) if s.strip()]
    out = []
    for i in hosts:
        target, *options = lines[i].split("#")[0].split()
        for bad in targets:
            out.append(Variant(f"line {i + 1} target {_short(bad)}", _join(lines, i, " ".join([bad, *options]))))
        for key in ("slots", "gpus", "region", "python", "identity", "price", "port", "bogus"):
            for value in values:
                out.append(Variant(f"line {i + 1} {key}={_short(value)}", _join(lines, i, f"{target} {key}={value}")))
        out.append(Variant(f"line {i + 1} twice", _join(lines, i, lines[i] + "\n" + lines[i])))
        out.append(Variant(f"line {i + 1} key twice", _join(lines, i, f"{target} slots=1 slots=2")))
    return out + text_variants(raw, rng)


def _join(lines: list[str], index: int, replacement: str) -> bytes:
    return "\n".join([*lines[:index], replacement, *lines[index + 1 :]]).encode()


def sample(variants: list[Variant], count: int | None, rng: random.Random) -> list[Variant]:
    """A seeded sample (all when `count` is None)."""
    if count is None or len(variants) <= count:
        return variants
    return rng.sample(variants, count)


# ---------------------------------------------------------------------------------------------------------
# Running an input through the library and the CLI


class Reached(Exception):
    """An SSH connection or a worker launch was attempted: bad input must be refused before either."""


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    crash: str = ""


def run_cli(args: list[str], stdin: str = "") -> Outcome:
    """`hetrl ARGS` in this process, through the real entry point (its one-line error handling included);
    any exception that escapes main is a crash."""
    from hetrl_cli import cli

    out, err = io.StringIO(), io.StringIO()
    argv, stdin_before = sys.argv, sys.stdin
    sys.argv, sys.stdin = ["hetrl", *args], io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:
        import traceback

        return Outcome(-1, out.getvalue(), err.getvalue(), "".join(traceback.format_exception(exc))[-3000:])
    finally:
        sys.argv, sys.stdin = argv, stdin_before
    return Outcome(code, out.getvalue(), err.getvalue())


def check_refusal(label: str, outcome: Outcome, names: str, codes: tuple[int, ...] = (2,)) -> str | None:
    """None when `outcome` is a proper refusal: an allowed code, one `hetrl: error:` line naming `names`."""
    if outcome.crash:
        return f"{label}: crashed\n{outcome.crash}"
    lines = [ln for ln in outcome.stderr.splitlines() if ln.strip()]
    problems = []
    if outcome.code not in codes:
        problems.append(f"exit {outcome.code}, expected {codes}")
    if len(lines) != 1 or not lines[0].startswith("hetrl: error: "):
        problems.append(f"{len(lines)} stderr lines")
    elif names and names not in lines[0]:
        problems.append(f"does not name {names}")
    if lines and len(lines[0]) > MAX_LINE:
        problems.append(f"a line of {len(lines[0])} characters")
    if LEAKED_NAMES.search(outcome.stderr):
        problems.append("leaks a Python exception name")
    return f"{label}: {'; '.join(problems)}: {outcome.stderr[-600:]!r}" if problems else None


def check_library(label: str, where: str, call: Callable[[], object]) -> tuple[str | None, object]:
    """Run a library loader: (problem or None, the loaded object or None when refused)."""
    from hetrl_cli.errors import BadInput

    started = time.perf_counter()
    try:
        loaded = call()
    except BadInput as exc:
        message = str(exc)
        problems = []
        if "\n" in message.strip():
            problems.append("more than one line")
        if where not in message:
            problems.append(f"does not name {where}")
        if len(message) > MAX_LINE:
            problems.append(f"{len(message)} characters")
        if LEAKED_NAMES.search(message):
            problems.append("leaks a Python exception name")
        problem = f"{label}: {'; '.join(problems)}: {message[:600]!r}" if problems else None
        return _slow(label, started) or problem, None
    except Exception as exc:
        import traceback

        return f"{label}: crashed\n{''.join(traceback.format_exception(exc))[-3000:]}", None
    return _slow(label, started), loaded


def _slow(label: str, started: float) -> str | None:
    took = time.perf_counter() - started
    return f"{label}: took {took:.1f} s (a refusal must be quick)" if took > 5 else None


def leftovers(folder: Path, keep: set[str]) -> list[str]:
    """Files in `folder` other than `keep`: an output written despite the error, or a temp file."""
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def report(kind: str, total: int, problems: list[str]) -> None:
    """Fail listing one example of each distinct problem (a crash's last line, else the problem's words)."""
    if not problems:
        return
    examples: dict[str, tuple[int, str]] = {}
    for problem in problems:
        head, _, rest = problem.partition("\n")
        key = rest.strip().splitlines()[-1] if rest.strip() else re.sub(r"^.*?\): |'.*", "", head)[:60]
        count, first = examples.get(key, (0, problem))
        examples[key] = (count + 1, first)
    shown = "\n\n".join(f"[{count}x] {first}" for count, first in examples.values())
    pytest.fail(f"{len(problems)} of {total} {kind} variants misbehave:\n\n{shown}", pytrace=False)


# ---------------------------------------------------------------------------------------------------------
# The sweep: library first, then a seeded sample of the variants through the CLI

FAST_CLI_RUNS = int(os.environ.get("HETRL_FUZZ_CLI_RUNS", "25")) or None
"""CLI runs per artifact kind in the fast set (accepted and refused each); the slow sweep runs more."""
FAST_PLAN_VARIANTS = 2500
"""A plan of 64 devices has some 7,300 variants (4 ms each to load); the fast set loads a seeded sample of them,
the slow sweep all."""


@dataclass
class Sweep:
    """How one kind of input is loaded and what the CLI does with it, refused or accepted."""

    filename: str
    load: Callable[[Path], object]
    refused_args: Callable[[Path, Path], list[list[str]]]
    """CLI argument lists for a refused file (the file, the output folder): each must exit 2, naming it."""
    accepted_args: Callable[[Path, Path], list[list[str]]] | None = None
    """CLI argument lists for an accepted file: each must succeed, refuse (2) or be infeasible (3)."""
    reload: Callable[[Path], object] | None = None
    """Loads what an accepted run wrote to the output folder (it must load again)."""


def sweep(name: str, spec: Sweep, variants: list[Variant], root: Path, cli_runs: int | None, seed: int) -> None:
    """Every variant through the library; a seeded sample of the refused and of the accepted ones (all of them
    when `cli_runs` is None) through the CLI. Fails with the first problems found, each labelled."""
    rng = random.Random(seed)
    folder = root / f"{name}-{seed}"
    folder.mkdir()
    path, out = folder / spec.filename, folder / "out"
    problems: list[str] = []
    refused: list[Variant] = []
    accepted: list[Variant] = []
    load = spec.load
    for variant in variants:
        path.write_bytes(variant.data)
        problem, loaded = check_library(f"{name} [{variant.label}] (library)", str(path), lambda: load(path))
        if problem:
            problems.append(problem)
        (accepted if loaded is not None else refused).append(variant)
    for variant in sample(refused, cli_runs, rng):
        path.write_bytes(variant.data)
        for args in spec.refused_args(path, out):
            out.mkdir(exist_ok=True)
            label = f"{name} [{variant.label}] (hetrl {args[0]})"
            problems.append(check_refusal(label, run_cli(args), str(path)) or "")
            if stray := leftovers(out, set()):
                problems.append(f"{label}: left {stray} behind")
    if spec.accepted_args is not None:
        for variant in sample(accepted, cli_runs, rng):
            path.write_bytes(variant.data)
            for args in spec.accepted_args(path, out):
                out.mkdir(exist_ok=True)
                problems.append(_check_accepted(f"{name} [{variant.label}] (hetrl {args[0]})", args, out, spec))
                for leftover in out.iterdir():
                    leftover.unlink()
    report(name, len(variants), [p for p in problems if p])


def _check_accepted(label: str, args: list[str], out: Path, spec: Sweep) -> str | None:
    outcome = run_cli(args)
    if outcome.crash or outcome.code != 0:
        return check_refusal(label, outcome, "", codes=(2, 3))
    if "Traceback" in outcome.stderr:
        return f"{label}: a traceback on success: {outcome.stderr[-600:]!r}"
    temp = [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    if temp:
        return f"{label}: left {temp} behind"
    for written in out.glob("*.json"):
        if spec.reload is not None:
            problem, loaded = check_library(f"{label}: reloading", str(written), partial(spec.reload, written))
            if problem or loaded is None:
                return problem or f"{label}: wrote {written.name}, which does not load again"
    return None


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the canary path hostile strings would create, a small profile, a plan made from a
    shipped profile and a calibration for the small profile."""
    from hetrl_cli.artifacts.calibration import Calibration, DeviceFactors, LinkFactors
    from hetrl_cli.artifacts.io import save_artifact
    from hetrl_cli.profiling.catalog import profile_from_cluster

    root = tmp_path_factory.mktemp("fuzz")
    small = profile_from_cluster(SMALL_CLUSTER, created_at="2026-01-01T00:00:00Z")
    save_artifact(small, root / "small.json")
    done = run_cli(["plan", str(PROFILES[-1]), "--solver", "verl", "-o", str(root / "plan.json")])
    assert done.code == 0, done.stderr
    calibration = Calibration(
        profile_name=small.name,
        profile_fingerprint=small.fingerprint or small.compute_fingerprint(),
        created_at="2026-01-01T00:00:00Z",
        method="fuzz seed",
        runs=["r1"],
        device_class={"A100 80GB": DeviceFactors(compute=0.8, memory=0.9, optimizer=1.0)},
        link_class={"lan": LinkFactors(bandwidth=0.5, latency=2.0)},
        task_overhead_s={"generation": 0.5, "actor_train": 0.1},
        overhead_factor={"generation": 1.5},
    )
    save_artifact(calibration, root / "calibration.json")
    (root / "hosts.txt").write_text("".join(f"{h}\n" for h in _plan_hosts(root / "plan.json")))
    return root


def _plan_hosts(plan_file: Path) -> list[str]:
    plan = json.loads(plan_file.read_text())
    return sorted({d.rpartition("/")[0] for g in plan["groups"] for d in g["devices"]})


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any SSH connection or local worker launch raises Reached (which a test reports as a crash)."""
    import hetrl_cli.remote.ssh as ssh
    import hetrl_cli.runtime.local as local

    def refuse(*_args: object, **_kw: object) -> None:
        raise Reached("bad input reached an SSH connection or a worker launch")

    monkeypatch.setattr(ssh, "connect", refuse)
    monkeypatch.setattr(local, "launch_local", refuse)


@pytest.fixture
def canary(workspace: Path) -> Iterator[Path]:
    """The file a hostile string's shell command would create: it must never exist."""
    path = workspace / "pwned"
    yield path
    assert not path.exists(), "a hostile string from an input reached a shell"


def _load(cls_name: str) -> Callable[[Path], object]:
    def load(path: Path) -> object:
        from hetrl_cli.artifacts import calibration, plan, profile
        from hetrl_cli.artifacts.io import load_artifact

        cls = {"profile": profile.ClusterProfile, "plan": plan.Plan, "calibration": calibration.Calibration}
        return load_artifact(path, cls[cls_name])

    return load


def _load_workload(path: Path) -> object:
    from hetrl_cli.artifacts.workload import load_workload

    return load_workload(path)


def _load_cluster(path: Path) -> object:
    from hetrl_cli.profiling.catalog import profile_from_cluster_file

    return profile_from_cluster_file(path)


def _load_hosts(path: Path) -> object:
    from hetrl_cli.artifacts.hosts import load_hosts

    return load_hosts(path)


def profile_sweep(workspace: Path) -> Sweep:
    return Sweep(
        "profile.json",
        _load("profile"),
        lambda p, out: [["plan", str(p), "--solver", "verl", "-o", str(out / "plan.json")]],
        lambda p, out: [["plan", str(p), "--solver", "verl", "-o", str(out / "plan.json")]],
        _load("plan"),
    )


def plan_sweep(workspace: Path) -> Sweep:
    profile = str(PROFILES[-1])
    return Sweep(
        "plan.json",
        _load("plan"),
        lambda p, out: [
            ["show", str(p)],
            ["simulate", str(p), "--profile", profile, "-o", str(out / "re.json")],
            ["run", str(p), "--hosts", str(workspace / "hosts.txt"), "--run-dir", str(out / "run"), "--plain"],
            ["validate", str(p), "--run-dir", str(out / "run")],
        ],
        lambda p, out: [
            ["show", str(p)],
            ["show", str(p), "--format", "markdown", "--profile", profile, "--svg", str(out / "t.svg")],
            ["simulate", str(p), "--profile", profile, "-o", str(out / "re.json")],
        ],
        _load("plan"),
    )


def workload_sweep(workspace: Path) -> Sweep:
    def args(p: Path, out: Path) -> list[list[str]]:
        return [["plan", str(workspace / "small.json"), "-w", str(p), "--solver", "verl", "-o", str(out / "p.json")]]

    return Sweep("workload.yaml", _load_workload, args, args, _load("plan"))


def cluster_sweep(workspace: Path) -> Sweep:
    def args(p: Path, out: Path) -> list[list[str]]:
        return [["profile", "--catalog", str(p), "-o", str(out / "profile.json")]]

    return Sweep("cluster.yaml", _load_cluster, args, args, _load("profile"))


def hosts_sweep(workspace: Path) -> Sweep:
    return Sweep(
        "hosts.txt",
        _load_hosts,
        lambda p, out: [
            ["profile", str(p), "-o", str(out / "profile.json")],
            ["run", str(workspace / "plan.json"), "--hosts", str(p), "--run-dir", str(out / "run"), "--plain"],
        ],
    )


def calibration_sweep(workspace: Path) -> Sweep:
    def args(p: Path, out: Path) -> list[list[str]]:
        small = str(workspace / "small.json")
        tiny = str(WORKLOADS[0])
        return [["plan", small, "-w", tiny, "--calibration", str(p), "--solver", "verl", "-o", str(out / "p.json")]]

    return Sweep(
        "calibration.json",
        lambda p: _load_calibration(p, workspace),
        args,
        args,
        _load("plan"),
    )


def _load_calibration(path: Path, workspace: Path) -> object:
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.calibration.inputs import load_calibration

    small = load_artifact(workspace / "small.json", ClusterProfile)
    return load_calibration(str(path), small.fingerprint or small.compute_fingerprint())


def fuzz_profile(workspace: Path, canary: Path, source: Path, cli_runs: int | None, seed: int) -> None:
    doc = json.loads(source.read_text())
    variants = json_doc_variants(doc, canary, random.Random(seed))
    sweep(f"profile-{source.stem}", profile_sweep(workspace), variants, workspace, cli_runs, seed)


def fuzz_plan(
    workspace: Path, canary: Path, source: Path, cli_runs: int | None, seed: int, limit: int | None = None
) -> None:
    doc = json.loads(source.read_text())
    variants = sample(json_doc_variants(doc, canary, random.Random(seed)), limit, random.Random(seed))
    sweep(f"plan-{source.stem}", plan_sweep(workspace), variants, workspace, cli_runs, seed)


def fuzz_workload(workspace: Path, canary: Path, source: Path, cli_runs: int | None, seed: int) -> None:
    doc = yaml.safe_load(source.read_text())
    variants = yaml_doc_variants(doc, canary, random.Random(seed))
    sweep(f"workload-{source.stem}", workload_sweep(workspace), variants, workspace, cli_runs, seed)


def fuzz_cluster(workspace: Path, canary: Path, source: Path, cli_runs: int | None, seed: int) -> None:
    doc = yaml.safe_load(source.read_text())
    variants = yaml_doc_variants(doc, canary, random.Random(seed))
    sweep(f"cluster-{source.stem}", cluster_sweep(workspace), variants, workspace, cli_runs, seed)


def fuzz_hosts(workspace: Path, canary: Path, source: Path, cli_runs: int | None, seed: int) -> None:
    variants = hosts_variants(source.read_bytes(), canary, random.Random(seed))
    sweep(f"hosts-{source.stem}", hosts_sweep(workspace), variants, workspace, cli_runs, seed)


def fuzz_calibration(workspace: Path, canary: Path, source: Path, cli_runs: int | None, seed: int) -> None:
    doc = json.loads(source.read_text())
    variants = json_doc_variants(doc, canary, random.Random(seed))
    sweep(f"calibration-{source.stem}", calibration_sweep(workspace), variants, workspace, cli_runs, seed)


def fuzz_emulate_spec(workspace: Path, canary: Path, source: Path, cli_runs: int | None, seed: int) -> None:
    """The library only: `hetrl emulate up` needs root and changes the machine."""
    doc = yaml.safe_load(source.read_text())
    variants = yaml_doc_variants(doc, canary, random.Random(seed))
    sweep(
        f"emulate-{source.stem}",
        Sweep("spec.yaml", _load_emulate_spec, lambda p, out: []),
        variants,
        workspace,
        0,
        seed,
    )


def _load_emulate_spec(path: Path) -> object:
    from hetrl_cli.emulate.spec import load_spec

    return load_spec(path)


# ---------------------------------------------------------------------------------------------------------
# The fast, deterministic set (under a minute together)


def test_profile_variants_are_refused_in_one_line_or_planned(workspace: Path, canary: Path, no_ssh: None) -> None:
    fuzz_profile(workspace, canary, PROFILES[-1], FAST_CLI_RUNS, SEED)


def test_plan_variants_are_refused_in_one_line_before_any_ssh(workspace: Path, canary: Path, no_ssh: None) -> None:
    fuzz_plan(workspace, canary, workspace / "plan.json", FAST_CLI_RUNS, SEED, limit=FAST_PLAN_VARIANTS)


def test_workload_variants_are_refused_in_one_line_or_planned(workspace: Path, canary: Path, no_ssh: None) -> None:
    fuzz_workload(workspace, canary, WORKLOADS[0], FAST_CLI_RUNS, SEED)


def test_cluster_yaml_variants_are_refused_in_one_line_or_profiled(workspace: Path, canary: Path) -> None:
    fuzz_cluster(workspace, canary, CLUSTERS[-1], FAST_CLI_RUNS, SEED)


def test_hosts_variants_are_refused_in_one_line_before_any_ssh(workspace: Path, canary: Path, no_ssh: None) -> None:
    fuzz_hosts(workspace, canary, HOSTS_FILES[0], FAST_CLI_RUNS, SEED)


def test_calibration_variants_are_refused_in_one_line_or_planned(workspace: Path, canary: Path) -> None:
    fuzz_calibration(workspace, canary, workspace / "calibration.json", FAST_CLI_RUNS, SEED)


def test_emulate_spec_variants_are_refused_in_one_line(workspace: Path, canary: Path) -> None:
    fuzz_emulate_spec(workspace, canary, EMULATE_SPECS[0], 0, SEED)


def test_yaml_bombs_are_refused_at_once() -> None:
    """Ten lines of anchors would expand to 9^10 values: refused in well under a second, by every YAML loader."""
    from hetrl_cli.artifacts.workload import load_workload
    from hetrl_cli.emulate.spec import parse_spec_text
    from hetrl_cli.errors import BadInput
    from hetrl_cli.profiling.catalog import _load_yaml

    bomb = yaml_text_variants(WORKLOADS[0].read_bytes(), Path("/nonexistent"))[0].data.decode()
    for load in (lambda: load_workload("-"), lambda: _load_yaml(bomb, "c.yaml"), lambda: parse_spec_text(bomb, "s")):
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(BadInput, match="expand to more than"):
            stdin, sys.stdin = sys.stdin, io.StringIO(bomb)
            try:
                load()
            finally:
                sys.stdin = stdin
        assert time.perf_counter() - started < 1.0


# ---------------------------------------------------------------------------------------------------------
# The slow sweep: every shipped file of each kind, a larger seeded sample through the CLI

SLOW_CLI_RUNS = 100
SLOW_CASES = [
    *((fuzz_profile, p) for p in PROFILES),
    *((fuzz_workload, w) for w in [*WORKLOADS, REPO / "examples" / "emulate-grpo.yaml"]),
    *((fuzz_cluster, c) for c in CLUSTERS),
    *((fuzz_hosts, h) for h in HOSTS_FILES),
    *((fuzz_emulate_spec, e) for e in EMULATE_SPECS),
]


@pytest.mark.slow
@pytest.mark.parametrize("fuzz,source", SLOW_CASES, ids=[f"{f.__name__[5:]}-{p.name}" for f, p in SLOW_CASES])
def test_slow_sweep_of_every_shipped_input(
    workspace: Path, canary: Path, no_ssh: None, fuzz: Callable[..., None], source: Path
) -> None:
    fuzz(workspace, canary, source, SLOW_CLI_RUNS, SEED + 1)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [SEED + 1, SEED + 2])
def test_slow_sweep_of_a_plan_and_a_calibration(workspace: Path, canary: Path, no_ssh: None, seed: int) -> None:
    fuzz_plan(workspace, canary, workspace / "plan.json", SLOW_CLI_RUNS, seed)
    fuzz_calibration(workspace, canary, workspace / "calibration.json", SLOW_CLI_RUNS, seed)


PLAN_OPTIONS: list[tuple[list[str], str]] = [
    (["--budget", "0s"], "--budget"),
    (["--budget", "-1"], "--budget"),
    (["--budget", "abc"], "--budget"),
    (["--budget", ""], "--budget"),
    (["--budget", "nan"], "--budget"),
    (["--budget", "inf"], "--budget"),
    (["--budget", "1e400s"], "--budget"),
    (["--budget", "5x"], "--budget"),
    (["--max-evals", "0"], "--max-evals"),
    (["--max-evals", "-5"], "--max-evals"),
    (["--max-evals", "abc"], "--max-evals"),
    (["--objective", "bogus"], "objective"),
    (["--objective", ""], "objective"),
    (["--max-cost-per-hour", "-1"], "--max-cost-per-hour"),
    (["--max-cost-per-hour", "0"], "--max-cost-per-hour"),
    (["--max-cost-per-hour", "nan"], "--max-cost-per-hour"),
    (["--max-cost-per-hour", "inf"], "--max-cost-per-hour"),
    (["--max-cost-per-hour", "abc"], "--max-cost-per-hour"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**70)], "--seed"),
    (["--seed", "1.5"], "--seed"),
    (["--solver", "bogus;id"], "solver"),
    (["--name", "../escape"], "name"),
    (["--name", "a\nb"], "name"),
    (["--name", ""], "name"),
    (["--name", "x" * 5000], "name"),
    (["--exclude", "no-such-host"], "no-such-host"),
    (["--exclude", "$(id)"], "host"),
    (["--mip-solver", "$(id)", "--solver", "ilp"], "MILP"),
    (["--calibration", "/nonexistent/c.json"], "/nonexistent/c.json"),
    (["-w", "/nonexistent/w.yaml"], "/nonexistent/w.yaml"),
]
"""`hetrl plan` options out of range, each with a word its refusal must contain (an option's name, or what is
wrong). The plans they would make are tiny (the verl baseline), so an option that is wrongly accepted shows as
exit 0 and a plan file left behind."""


@pytest.mark.parametrize(
    "options", [["--budget", "1e9"], ["--max-evals", str(2**70)], ["--seed", str(2**63 - 1)], ["--budget", "1ms"]]
)
def test_large_but_meaningful_plan_options_make_a_plan_that_loads(workspace: Path, options: list[str]) -> None:
    out = workspace / f"ok-options-{abs(hash(tuple(options))) % 10**8}"
    out.mkdir()
    args = ["plan", str(workspace / "small.json"), "-w", str(WORKLOADS[0]), "--solver", "verl", *options]
    outcome = run_cli([*args, "-o", str(out / "plan.json")])
    assert outcome.code == 0 and not outcome.crash, outcome.crash or outcome.stderr
    _load("plan")(out / "plan.json")


@pytest.mark.parametrize("options,words", PLAN_OPTIONS, ids=[" ".join(o)[:40] for o, _ in PLAN_OPTIONS])
def test_absurd_plan_options_are_refused_in_one_line(workspace: Path, options: list[str], words: str) -> None:
    out = workspace / f"options-{abs(hash(tuple(options))) % 10**8}"
    out.mkdir()
    args = ["plan", str(workspace / "small.json"), "-w", str(WORKLOADS[0]), "--solver", "verl", *options]
    outcome = run_cli([*args, "-o", str(out / "plan.json")])
    problem = check_refusal(" ".join(options)[:60], outcome, words)
    assert problem is None, problem
    assert leftovers(out, set()) == []


@pytest.mark.parametrize(
    "options",
    [
        ["--steps", "0"],
        ["--steps", "-3"],
        ["--checkpoint-every", "-1"],
        ["--timeout", "abc"],
        ["--timeout", "0s"],
        ["--collective-timeout", "-5s"],
        ["--ssh-timeout", "nan"],
        ["--engine", "bogus;id"],
        ["--resume", "/nonexistent/run"],
        ["--profile", "/nonexistent/p.json"],
        ["--ssh-config", "/tmp/c", "--no-ssh-config"],
    ],
    ids=lambda o: " ".join(o),
)
def test_absurd_run_options_are_refused_before_any_ssh(workspace: Path, no_ssh: None, options: list[str]) -> None:
    out = workspace / f"run-options-{abs(hash(tuple(options))) % 10**8}"
    out.mkdir()
    hosts = ["--hosts", str(workspace / "hosts.txt")]
    outcome = run_cli(["run", str(workspace / "plan.json"), *hosts, "--run-dir", str(out / "run"), *options])
    problem = check_refusal(" ".join(options), outcome, "")
    assert problem is None, problem
    assert leftovers(out, set()) == []


def test_a_plan_naming_devices_absent_from_its_profile_is_refused_before_any_ssh(workspace: Path, no_ssh: None) -> None:
    """A plan edited to use a host the profile does not have: simulate and run (with that profile) refuse it
    in one line, run before any connection; show flags it against the profile without crashing."""
    doc = json.loads((workspace / "plan.json").read_text())
    ghost = "ghost-0/0"
    moved = doc["groups"][0]["devices"][0]
    doc["groups"][0]["devices"][0] = ghost
    for task in doc["tasks"]:
        for replica in task["replicas"]:
            replica["stages"] = [[ghost if d == moved else d for d in stage] for stage in replica["stages"]]
    folder = workspace / "absent"
    folder.mkdir()
    plan = folder / "plan.json"
    plan.write_text(json.dumps(doc))
    profile = str(PROFILES[-1])
    hosts = folder / "hosts.txt"
    hosts.write_text((workspace / "hosts.txt").read_text() + "ghost-0\n")
    for args in (
        ["simulate", str(plan), "--profile", profile, "-o", str(folder / "out.json")],
        ["run", str(plan), "--profile", profile, "--hosts", str(hosts), "--run-dir", str(folder / "run")],
    ):
        problem = check_refusal(args[0], run_cli(args), "ghost-0")
        assert problem is None, problem
    shown = run_cli(["show", str(plan), "--profile", profile])
    assert shown.code in (0, 2) and not shown.crash, shown.crash or shown.stderr
    assert leftovers(folder, {"plan.json", "hosts.txt"}) == []
