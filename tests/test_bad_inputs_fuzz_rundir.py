"""Seeded mutation fuzzing of what hetrl reads back from a run directory, and of `--links` and `--ssh-config`
files: the rest of tests/test_bad_inputs_fuzz.py's sweep (its mutations, checks and fixtures are reused here).

A run directory (plan.json, metrics.jsonl, summary.json, launch.json, checkpoints/latest and a checkpoint's
sealed meta.json and index.json, rank-00000.safetensors) is mutated one file at a time: its JSON at every field,
its text (truncated, binary, empty, deep nesting, duplicated keys), and as a file (missing, a folder, a FIFO, a
link to /dev/zero, /dev/urandom, /etc/passwd, outside the directory, nowhere). A checkpoint's JSON is sealed (a
sha256 of its text), so mutations are resealed as a forger would. Each variant goes through the library readers
(show's, validate's, calibrate's; `run --resume`'s checkpoint check) and, for a seeded sample, through the real
`main()` as `show RUN`, `show RUN --json`, `validate RUN --json`, `calibrate RUN` and `export RUN --hf DIR`:
each must succeed (what it wrote loads again) or refuse in one line naming the run directory (exit 2), within
5 s, leaving nothing behind. `--links` and `--ssh-config` variants go through their loaders, and the refused
ones through `hetrl profile` before any SSH. The slow set takes every variant and more CLI runs.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from test_bad_inputs_fuzz import (
    SEED,
    WORKLOADS,
    Outcome,
    check_library,
    check_refusal,
    json_doc_variants,
    report,
    run_cli,
    sample,
    text_variants,
    yaml_doc_variants,
    yaml_text_variants,
)
from test_bad_inputs_fuzz import canary as canary
from test_bad_inputs_fuzz import no_ssh as no_ssh
from test_bad_inputs_fuzz import workspace as workspace

FAST_LIBRARY_VARIANTS = 150
"""Run-directory variants per file (of some 270 to 3,200) that the fast set reads through the library."""
FAST_RUN_VARIANTS = int(os.environ.get("HETRL_FUZZ_RUN_VARIANTS", "10"))
"""Of those, how many the fast set also takes through the CLI (4 commands each), beside the wrong kinds of file."""
SLOW_RUN_VARIANTS = 150
GIB = 2**30


@dataclass(frozen=True)
class RunVariant:
    """One damaged run directory: what was done to which file, and how to do it to a fresh copy."""

    label: str
    apply: Callable[[Path], None]
    always: bool = False
    """In the fast set whatever the sample (a file of the wrong kind: the hangs and crashes of whole files)."""


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        target = root / name
        if target.is_symlink() or target.is_file():
            target.unlink()
        target.write_bytes(data)

    return apply


def file_variants(name: str, variants: list, outside: Path) -> list[RunVariant]:
    """`variants` (Variant: label and bytes) written as `name`, and `name` as the wrong kind of file."""
    out = [RunVariant(f"{name} [{v.label}]", _write(name, v.data)) for v in variants]
    return out + structural_variants(name, outside)


def structural_variants(name: str, outside: Path) -> list[RunVariant]:
    """`name` missing, a folder, a FIFO, or a link to /dev/zero, /dev/urandom, a file outside the run, nowhere."""

    def replace(make: Callable[[Path], None]) -> Callable[[Path], None]:
        def apply(root: Path) -> None:
            target = root / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            make(target)

        return apply

    return [
        RunVariant(f"{name} missing", replace(lambda t: None), True),
        RunVariant(f"{name} a folder", replace(lambda t: t.mkdir()), True),
        RunVariant(f"{name} a FIFO", replace(lambda t: os.mkfifo(t)), True),
        RunVariant(f"{name} -> /dev/zero", replace(lambda t: t.symlink_to("/dev/zero")), True),
        RunVariant(f"{name} -> /dev/urandom", replace(lambda t: t.symlink_to("/dev/urandom")), True),
        RunVariant(f"{name} -> /etc/passwd", replace(lambda t: t.symlink_to("/etc/passwd")), True),
        RunVariant(f"{name} -> outside the run", replace(lambda t: t.symlink_to(outside)), True),
        RunVariant(f"{name} -> nowhere", replace(lambda t: t.symlink_to(t.parent / "no-such-file")), True),
    ]


# ---------------------------------------------------------------------------------------------------------
# A run directory as `hetrl run` leaves it (metrics shaped like the worker's), and its variants


def metrics_line(plan: dict, step: int) -> dict:
    tasks = [t["task"] for t in plan["tasks"]]
    devices = sorted({d for g in plan["groups"] for d in g["devices"]})
    warm = 1.0 if step == 1 else 0.0
    return {
        "step": step,
        "time": f"2026-01-03T09:00:{step:02d}Z",
        "reward_mean": 0.1 * step,
        "kl_ref_k3": 0.001 * step,
        "response_length_mean": 100.0 + step,
        "response_tokens": 1000 * step,
        "seconds": {**{t: 0.5 + warm + 0.01 * step for t in tasks}, "rollout_transfer": 0.25},
        "weight_sync_s": 0.2,
        "step_s": 3.0 + warm,
        "tokens_per_s": 300.0,
        "peak_memory_bytes": {d: {"generation": 2 * GIB + step, "actor_train": 3 * GIB} for d in devices},
        "memory_measure": {d: "cuda_max_allocated" for d in devices},
    }


@pytest.fixture(scope="module")
def template(workspace: Path) -> Path:
    """runs/fuzz: plan.json (the verl plan of the tiny workload on the small profile), 4 metrics lines,
    summary.json, launch.json and a done marker."""
    from hetrl_cli.artifacts.io import load_artifact, save_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.runtime.rundir import LaunchManifest, RunDir, summarize

    root = workspace / "run-template" / "fuzz"
    root.mkdir(parents=True)
    made = run_cli(["plan", str(workspace / "small.json"), "-w", str(WORKLOADS[0]), "--solver", "verl",
                    "-o", str(root / "plan.json")])  # fmt: skip
    assert made.code == 0, made.stderr
    run = RunDir(root)
    plan_doc = json.loads(run.plan.read_text())
    for step in range(1, 5):
        run.append_metrics(metrics_line(plan_doc, step))
    plan = load_artifact(run.plan, Plan)
    devices = sorted({d for g in plan_doc["groups"] for d in g["devices"]})
    manifest = LaunchManifest(run_id="fuzz", devices=devices, steps=4, checkpoint_every=0, engine="hf",
                              collective_timeout_s=60.0)  # fmt: skip
    run.manifest.write_text(manifest.model_dump_json(indent=1))
    summary = summarize(plan, "fuzz", run.read_metrics(), "completed", "2026-01-03T09:00:00Z")
    save_artifact(summary, run.summary)
    run.logs.mkdir()
    run.log(0, "done").write_text("")
    return root


def metrics_variants(template: Path, rng: random.Random, canary: Path, huge: bool) -> list[RunVariant]:
    """Whole-file damage, every field of the first and the last line, lines that disagree, and (`huge`) runs of
    20,000 steps or 30,000 devices (seconds each to read: the slow set)."""
    from test_bad_inputs_fuzz import tree_variants

    raw = (template / "metrics.jsonl").read_bytes()
    lines = raw.decode().splitlines()
    out = [RunVariant(f"metrics.jsonl [{v.label}]", _write("metrics.jsonl", v.data)) for v in text_variants(raw, rng)]
    for index in (0, len(lines) - 1):
        record = json.loads(lines[index])
        for label, mutated in tree_variants(record, canary):
            text = "\n".join([*lines[:index], json.dumps(mutated, allow_nan=True), *lines[index + 1 :]]) + "\n"
            out.append(RunVariant(f"metrics.jsonl line {index + 1} [{label}]", _write("metrics.jsonl", text.encode())))
    first = lines[0]
    odd = {
        "a duplicated key": first.replace('"step": 1', '"step": 1, "step": "one"', 1),
        "every line twice": "\n".join(lines + lines),
        "steps backwards": "\n".join(reversed(lines)),
        "steps far apart": "\n".join(ln.replace('"step": ', '"step": 9000000', 1) for ln in lines),
        "the largest step": first.replace('"step": 1', f'"step": {2**53}', 1),
        "a task of 10,000 characters": first.replace('"rollout_transfer"', '"' + "t" * 10_000 + '"'),
        "a unicode task": first.replace('"rollout_transfer"', '"\\u202e\\u0000名🙂\\n"'),
        "a line nested 100,000 deep": '{"step": 2, "seconds": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "a 400-digit number": first.replace('"response_tokens": 1000', '"response_tokens": 1' + "0" * 400, 1),
    }
    if huge:
        odd["30,000 devices"] = json.dumps({**json.loads(first), "peak_memory_bytes": {
            f"h{i}/0": {"generation": i} for i in range(30_000)}})  # fmt: skip
        odd["20,000 steps"] = "\n".join(lines[0].replace('"step": 1', f'"step": {s}', 1) for s in range(1, 20_001))
        odd["a line of 8 MiB"] = first[:-1] + ', "pad": "' + "x" * (8 << 20) + '"}'
    out += [RunVariant(f"metrics.jsonl [{k}]", _write("metrics.jsonl", (v + "\n").encode())) for k, v in odd.items()]
    return out + structural_variants("metrics.jsonl", template.parent / "outside.json")


def json_file_variants(template: Path, name: str, rng: random.Random, canary: Path) -> list[RunVariant]:
    doc = json.loads((template / name).read_text())
    return file_variants(name, json_doc_variants(doc, canary, rng), template.parent / "outside.json")


def run_dir_variants(
    template: Path, rng: random.Random, canary: Path, huge: bool = False
) -> dict[str, list[RunVariant]]:
    (template.parent / "outside.json").write_text(json.dumps({"kind": "plan", "schema_version": 1}))
    return {
        "metrics": metrics_variants(template, rng, canary, huge),
        "summary": json_file_variants(template, "summary.json", rng, canary),
        "launch": json_file_variants(template, "launch.json", rng, canary),
        "plan": json_file_variants(template, "plan.json", rng, canary),
    }


# ---------------------------------------------------------------------------------------------------------
# Reading a damaged run directory through the library and the CLI


def read_run_dir(root: Path) -> object:
    """What show, validate and calibrate read of a run directory, through the library."""
    from hetrl_cli.calibration.inputs import run_engine
    from hetrl_cli.calibration.validate import validate_run
    from hetrl_cli.render.run import load_run_view, run_summary_json

    view = load_run_view(root)
    run_summary_json(view)
    run_engine(root)
    return validate_run(root, write=False)


def run_commands(root: Path, out: Path, workspace: Path) -> list[list[str]]:
    return [
        ["show", str(root)],
        ["show", str(root), "--json"],
        ["validate", str(root), "--json"],
        ["calibrate", str(root), "--profile", str(workspace / "small.json"), "-o", str(out / "cal.json")],
    ]


def check_command(label: str, args: list[str], root: Path, out: Path) -> str | None:
    """A command on a damaged run directory: success (what it wrote loads again), or a quick one-line refusal
    naming the run directory that leaves nothing behind."""
    from hetrl_cli.artifacts.calibration import Calibration
    from hetrl_cli.artifacts.io import load_artifact

    started = time.perf_counter()
    outcome: Outcome = run_cli(args)
    took = time.perf_counter() - started
    if took > 5:
        return f"{label}: took {took:.1f} s"
    temp = [p.name for p in [*out.iterdir(), *root.iterdir()] if p.name.endswith(".tmp")]
    if temp:
        return f"{label}: left {temp} behind"
    if outcome.code == 0 and not outcome.crash:
        if args[0] == "calibrate":
            problem, loaded = check_library(f"{label}: reloading", str(out), lambda: load_artifact(out / "cal.json",
                                                                                             Calibration))  # fmt: skip
            return problem or (None if loaded is not None else f"{label}: wrote a calibration that does not load")
        return None
    problem = check_refusal(label, outcome, str(root))
    if problem and args[0] == "calibrate":  # runs of several profiles: named by their run ids, as the fit knows them
        problem = check_refusal(label, outcome, f"run {root.name}")
    if problem is None and any(out.iterdir()):
        return f"{label}: refused but left {sorted(p.name for p in out.iterdir())} behind"
    return problem


def sweep_run_dir(
    name: str, variants: list[RunVariant], template: Path, workspace: Path, cli_runs: int | None, seed: int
) -> None:
    """Every variant through the library; the wrong kinds of file and a seeded sample of the rest through the
    CLI (every variant when `cli_runs` is None)."""
    rng = random.Random(seed)
    folder = workspace / f"runs-{name}-{seed}"
    folder.mkdir()
    problems: list[str] = []
    chosen = {id(v) for v in sample([v for v in variants if not v.always], cli_runs, rng)}
    chosen |= {id(v) for v in variants if v.always}
    for number, variant in enumerate(variants):
        root = folder / f"r{number}" / "fuzz"
        shutil.copytree(template, root, symlinks=True)
        variant.apply(root)
        problem, _ = check_library(f"{variant.label} (library)", str(root), lambda r=root: read_run_dir(r))
        problems.append(problem or "")
        if id(variant) in chosen:
            out = root.parent / "out"
            for args in run_commands(root, out, workspace):
                out.mkdir(exist_ok=True)
                problems.append(check_command(f"{variant.label} (hetrl {args[0]})", args, root, out) or "")
                shutil.rmtree(out)
        shutil.rmtree(root.parent)
    report(f"run directory {name}", len(variants), [p for p in problems if p])


@pytest.fixture(scope="module")
def variants(template: Path, workspace: Path) -> dict[str, list[RunVariant]]:
    return run_dir_variants(template, random.Random(SEED), workspace / "pwned")


RUN_FILES = ["metrics", "summary", "launch", "plan"]


@pytest.mark.parametrize("name", RUN_FILES)
def test_run_dir_variants_are_shown_or_refused_in_one_line(
    name: str, variants: dict, template: Path, workspace: Path, canary: Path, no_ssh: None
) -> None:
    """The wrong kinds of file and a seeded sample of the rest (FAST_LIBRARY_VARIANTS through the library,
    FAST_RUN_VARIANTS of those through the CLI)."""
    every = variants[name]
    chosen = [v for v in every if v.always]
    chosen += sample([v for v in every if not v.always], FAST_LIBRARY_VARIANTS, random.Random(SEED))
    sweep_run_dir(name, chosen, template, workspace, FAST_RUN_VARIANTS, SEED)


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_FILES)
def test_slow_sweep_of_run_dir_variants(name: str, template: Path, workspace: Path, canary: Path, no_ssh: None) -> None:
    """Every variant (huge runs included) through the library, SLOW_RUN_VARIANTS through the CLI."""
    every = run_dir_variants(template, random.Random(SEED + 1), workspace / "pwned", huge=True)[name]
    sweep_run_dir(name, every, template, workspace, SLOW_RUN_VARIANTS, SEED + 1)


# ---------------------------------------------------------------------------------------------------------
# `hetrl profile --links FILE`: the links YAML (the library for every variant, the CLI for refused ones)

LINK_HOSTS = "node-a region=r1\nnode-b region=r1\nnode-c region=r2\n"
LINKS = {
    "links": [
        {"a": "node-a", "b": "node-b", "bandwidth": "10Gbps", "latency": "0.1ms", "kind": "lan"},
        {"a": "region:r1", "b": "region:r2", "bandwidth": "1Gbps", "latency": "20ms"},
    ]
}


def load_links(path: Path, hosts: Path) -> object:
    """The links file read against the hosts, and applied to measured links."""
    from hetrl_cli.artifacts.hosts import load_hosts
    from hetrl_cli.artifacts.profile import Link
    from hetrl_cli.profiling.links import apply_overrides, load_link_overrides

    entries = load_hosts(hosts)
    overrides = load_link_overrides(path, entries)
    measured = [Link(a="node-a", b="node-b", bandwidth_Bps=1e9, latency_s=1e-4, kind="lan")]
    return apply_overrides(measured, overrides, entries, lambda a, b: "wan")


def links_variants(canary: Path, rng: random.Random, huge: bool) -> list:
    """Every field, the text, YAML attacks, and entries of the wrong shape; `huge` adds the ones that take
    seconds (5,000 entries; 200,000 levels of flow nesting, beside the fast set's 3,000 and 50,000)."""
    raw = yaml.safe_dump(LINKS, sort_keys=False).encode()
    extra = [
        (b"links:\n  - {a: node-a, b: node-b, bandwidth: 1Gbps, latency: 1ms, 7: x}\n", "a number as a key"),
        (b"links:\n  - {a: node-a, b: node-b, bandwidth: 1Gbps, latency: 1ms, [1]: x}\n", "a list as a key"),
        (b"links:\n  - {a: node-a, b: node-b, bandwidth: 1Gbps, __line__: x}\n", "a __line__ key"),
        (b"links:\n  - {a: node-a, b: node-b, latency: 1ms, latency: 2ms}\n", "a key twice"),
        (b"links:\n  - {a: node-a, b: node-b, bandwidth: .inf}\n", "infinite bandwidth"),
        (b"links:\n  - {a: node-a, b: node-b, bandwidth: 1e308Gbps}\n", "1e308 Gbps"),
        (b"links:\n  - {a: node-a, b: node-b, latency: 1e308}\n", "latency 1e308"),
        (b"links:\n  - {a: node-a, b: node-b, latency: .nan}\n", "latency NaN"),
        (b"links:\n  - {a: [node-a], b: node-b, latency: 1ms}\n", "a list as an end"),
        (b"links:\n  - {a: node-a, b: node-b, kind: [lan]}\n", "a list as kind"),
        (b"links:\n  - {a: node-a, b: node-b, latency: 1ms, kind: {x: 1}}\n", "a mapping as kind"),
        (b'links:\n  - a: node-a\n    b: node-b\n    bandwidth: "line\\nbreak"\n', "a line break in a value"),
    ]
    if huge:  # seconds each: the slow set
        entries = "".join(f"  - {{a: node-a, b: node-b, latency: {i}us}}\n" for i in range(5_000))
        extra.append(("links:\n" + entries, "5,000 entries"))
    from test_bad_inputs_fuzz import Variant

    out = [*yaml_doc_variants(LINKS, canary, rng), *yaml_text_variants(raw, canary)]
    out += [Variant(label, data if isinstance(data, bytes) else data.encode()) for data, label in extra]
    return [v for v in out if huge or v.label not in ("deep list nesting", "deep flow nesting")]


def sweep_links(workspace: Path, cli_runs: int | None, seed: int, canary: Path, huge: bool) -> None:
    from test_bad_inputs_fuzz import leftovers

    rng = random.Random(seed)
    folder = workspace / f"links-{seed}"
    folder.mkdir()
    hosts, path, out = folder / "hosts.txt", folder / "links.yaml", folder / "out"
    hosts.write_text(LINK_HOSTS)
    problems: list[str] = []
    refused = []
    variants = links_variants(canary, random.Random(seed), huge)
    for variant in variants:
        path.write_bytes(variant.data)
        problem, loaded = check_library(
            f"links [{variant.label}] (library)", str(path), lambda: load_links(path, hosts)
        )
        problems.append(problem or "")
        if loaded is None:
            refused.append(variant)
    for make in structural_variants("links.yaml", workspace / "small.json"):
        make.apply(folder)
        problem, loaded = check_library(f"links [{make.label}] (library)", str(path), lambda: load_links(path, hosts))
        problems.append(problem or "")
        if loaded is not None and "missing" in make.label:
            problems.append(f"links [{make.label}]: a missing links file was accepted")
    path.unlink(missing_ok=True)
    for variant in sample(refused, cli_runs, rng):
        path.write_bytes(variant.data)
        out.mkdir(exist_ok=True)
        args = ["profile", str(hosts), "--links", str(path), "--no-ssh-config", "-o", str(out / "p.json")]
        label = f"links [{variant.label}] (hetrl profile)"
        problems.append(check_refusal(label, run_cli(args), str(path)) or "")
        if stray := leftovers(out, set()):
            problems.append(f"{label}: left {stray} behind")
    report("links.yaml", len(variants), [p for p in problems if p])


def test_links_variants_are_refused_in_one_line_before_any_ssh(workspace: Path, canary: Path, no_ssh: None) -> None:
    sweep_links(workspace, 25, SEED, canary, huge=False)


@pytest.mark.slow
def test_slow_sweep_of_links_variants(workspace: Path, canary: Path, no_ssh: None) -> None:
    sweep_links(workspace, None, SEED + 1, canary, huge=True)


# ---------------------------------------------------------------------------------------------------------
# A run's checkpoint, as `hetrl export RUN` and `hetrl run PLAN --resume RUN` read it. Its meta.json and
# index.json are sealed (sha256 of their canonical text) and meta.json holds index.json's digest: a mutation is
# resealed and re-linked as a forger would, so it reaches the readers behind the seal.

STEP_DIR = "checkpoints/step-000004"


@pytest.fixture(scope="module")
def checkpointed(template: Path) -> Path:
    """The run template with the tiny actor's weights as one complete sharded checkpoint of step 4 (as a
    one-rank run writes it) and the tiny model's build in models/."""
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.runtime.checkpoint import Piece, RankPart, _seal, training_identity, write_part
    from hetrl_cli.runtime.rundir import RunDir
    from hetrl_cli.runtime.tinymodel import load_causal_lm, resolve_model_dir

    root = template.parent.parent / "ckpt-template" / "fuzz"
    shutil.copytree(template, root)
    run = RunDir(root)
    workload = load_artifact(run.plan, Plan).workload
    spec = workload.model_for("actor")
    assert spec is not None
    model = load_causal_lm(resolve_model_dir(spec.path, spec.arch, run.models, workload.seed))
    pieces = [
        Piece(f"actor/model/{n}", p.detach(), tuple(p.shape), (0,) * p.dim()) for n, p in model.named_parameters()
    ]
    report_ = write_part(run.staging(4), 0, RankPart(pieces=pieces))
    assert _seal(run, run.staging(4), 4, [report_], {"training": training_identity(workload)}) is None
    shutil.move(run.models, root.parent / "models")  # shared by the copies (export only reads it)
    run.models.symlink_to(root.parent / "models")
    done = run_cli(["export", str(root), "--hf", str(root.parent / "hf")])
    assert done.code == 0 and not done.crash, done.crash or done.stderr
    shutil.rmtree(root.parent / "hf")
    return root


def _resealed(name: str, body: object, relink: bool) -> Callable[[Path], None]:
    """Write `body` as the sealed `name` of the checkpoint; `relink`: record its digest in a resealed meta.json."""
    from hetrl_cli.runtime.checkpoint import _sha256
    from hetrl_cli.runtime.rundir import read_sealed_json, sealed_json

    def apply(root: Path) -> None:
        folder = root / STEP_DIR
        try:
            text = sealed_json(body) if isinstance(body, dict) else json.dumps(body)
        except ValueError:  # NaN and inf have no canonical JSON: written as they are, unsealed
            text = json.dumps(body, allow_nan=True)
        (folder / name).write_text(text)
        if relink:
            _, meta = read_sealed_json((folder / "meta.json").read_text())
            (folder / "meta.json").write_text(sealed_json({**meta, "index_sha256": _sha256(folder / name)}))

    return apply


def _rank_file(data: bytes) -> Callable[[Path], None]:
    """rank-00000.safetensors replaced by `data`, its size and digest resealed into index.json and meta.json."""
    import hashlib

    from hetrl_cli.runtime.rundir import read_sealed_json

    def apply(root: Path) -> None:
        folder = root / STEP_DIR
        (folder / "rank-00000.safetensors").write_bytes(data)
        _, index = read_sealed_json((folder / "index.json").read_text())
        index["files"]["rank-00000.safetensors"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        _resealed("index.json", index, relink=True)(root)

    return apply


def safetensors_variants(raw: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """A safetensors file damaged: truncated, garbage, and its JSON header lying about sizes and offsets."""
    import struct

    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + size])
    first = next(k for k in header if k != "__metadata__")

    def with_header(change: dict) -> bytes:
        text = json.dumps({**header, first: {**header[first], **change}}).encode()
        return struct.pack("<Q", len(text)) + text + raw[8 + size :]

    return [
        ("empty", b""),
        ("7 bytes", raw[:7]),
        ("truncated in the header", raw[: 8 + size // 2]),
        ("truncated in the data", raw[: 8 + size + 10]),
        ("binary garbage", bytes(rng.randrange(256) for _ in range(4096))),
        ("a header length of 2**63", struct.pack("<Q", 2**63) + raw[8:]),
        ("a header length past the file", struct.pack("<Q", len(raw)) + raw[8:]),
        ("a header that is not JSON", struct.pack("<Q", size) + b"{" * size + raw[8 + size :]),
        ("offsets past the data", with_header({"data_offsets": [0, 2**40]})),
        ("offsets backwards", with_header({"data_offsets": [8, 0]})),
        ("a shape of 2**40", with_header({"shape": [2**20, 2**20]})),
        ("a negative shape", with_header({"shape": [-1]})),
        ("an unknown dtype", with_header({"dtype": "Q99"})),
    ]


def checkpoint_variants(root: Path, rng: random.Random, canary: Path) -> list[RunVariant]:
    from hetrl_cli.runtime.rundir import read_sealed_json
    from test_bad_inputs_fuzz import tree_variants

    folder = root / STEP_DIR
    _, meta = read_sealed_json((folder / "meta.json").read_text())
    _, index = read_sealed_json((folder / "index.json").read_text())
    out = [RunVariant(f"meta.json [{label}]", _resealed("meta.json", body, False)) for label, body in
           tree_variants(meta, canary)]  # fmt: skip
    out += [RunVariant(f"index.json [{label}]", _resealed("index.json", body, True)) for label, body in
            tree_variants(index, canary)]  # fmt: skip
    for name, doc in (("meta.json", meta), ("index.json", index)):
        raw = json.dumps(doc).encode()
        out += [
            RunVariant(f"{name} [{v.label}]", _write(f"{STEP_DIR}/{name}", v.data)) for v in text_variants(raw, rng)
        ]
        out += structural_variants(f"{STEP_DIR}/{name}", root.parent / "outside.json")
    latest = [(f"latest [{text!r}]", text) for text in ("", "step-000004x", "../../plan.json", "step-" + "9" * 500,
                                                        "/etc", "step-000004\nstep-000003", "\x00")]  # fmt: skip
    out += [RunVariant(label, _write("checkpoints/latest", text.encode())) for label, text in latest]
    out += structural_variants("checkpoints/latest", root.parent / "outside.json")
    raw = (folder / "rank-00000.safetensors").read_bytes()
    out += [RunVariant(f"rank file [{label}]", _rank_file(data)) for label, data in safetensors_variants(raw, rng)]
    out += structural_variants(f"{STEP_DIR}/rank-00000.safetensors", root.parent / "outside.json")
    return out


def resume_or_refuse(root: Path) -> object:
    """`run --resume`'s check of the checkpoint, its CheckpointError (exit 1) taken as the one-line refusal."""
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.errors import BadInput
    from hetrl_cli.runtime.checkpoint import CheckpointError, resume_point

    try:
        return resume_point(load_artifact(root / "plan.json", Plan), root)
    except CheckpointError as exc:
        raise BadInput(str(exc)) from None


def sweep_checkpoint(variants: list[RunVariant], root: Path, workspace: Path, cli_runs: int | None, seed: int) -> None:
    """Every variant through `--resume`'s check; a seeded sample of the wrong kinds of file and of the rest
    through `hetrl export` (`cli_runs` of each; None: all)."""
    rng = random.Random(seed)
    folder = workspace / f"ckpt-{seed}"
    folder.mkdir()
    chosen = {id(v) for v in sample([v for v in variants if not v.always], cli_runs, rng)}
    chosen |= {id(v) for v in sample([v for v in variants if v.always], cli_runs, rng)}
    problems: list[str] = []
    for number, variant in enumerate(variants):
        run = folder / f"r{number}" / "fuzz"
        shutil.copytree(root, run, symlinks=True)
        variant.apply(run)
        problem, _ = check_library(f"{variant.label} (--resume check)", str(run), lambda r=run: resume_or_refuse(r))
        problems.append(problem or "")
        if id(variant) in chosen:
            out = run.parent / "out"
            out.mkdir()
            args = ["export", str(run), "--hf", str(out / "hf")]
            label = f"{variant.label} (hetrl export)"
            started = time.perf_counter()
            outcome = run_cli(args)
            if time.perf_counter() - started > 5:
                problems.append(f"{label}: took {time.perf_counter() - started:.1f} s")
            if outcome.code != 0 or outcome.crash:
                problems.append(check_refusal(label, outcome, str(run)) or "")
                if any(out.iterdir()):
                    problems.append(f"{label}: refused but left {sorted(p.name for p in out.iterdir())} behind")
        shutil.rmtree(run.parent)
    report("checkpoint", len(variants), [p for p in problems if p])


FAST_CHECKPOINT_EXPORTS = 6
"""Checkpoint variants the fast set exports through the CLI (about 0.3 s each), and as many wrong kinds of file."""


def test_checkpoint_variants_are_exported_or_refused_in_one_line(
    checkpointed: Path,
    workspace: Path,
    canary: Path,
    no_ssh: None,
) -> None:
    every = checkpoint_variants(checkpointed, random.Random(SEED), canary)
    chosen = [v for v in every if v.always] + sample([v for v in every if not v.always], 100, random.Random(SEED))
    sweep_checkpoint(chosen, checkpointed, workspace, FAST_CHECKPOINT_EXPORTS, SEED)


@pytest.mark.slow
def test_slow_sweep_of_checkpoint_variants(checkpointed: Path, workspace: Path, canary: Path, no_ssh: None) -> None:
    every = checkpoint_variants(checkpointed, random.Random(SEED + 1), canary)
    sweep_checkpoint(every, checkpointed, workspace, 60, SEED + 1)


# ---------------------------------------------------------------------------------------------------------
# `--ssh-config FILE` (profile, run): the library for every variant, `hetrl profile` for the refused ones

SSH_CONFIG = """Host node-a
  HostName 127.0.0.1
  User alice
  Port 2222
  IdentityFile ~/.ssh/id_fuzz
Host node-b
  ProxyJump node-a
Host *
  ServerAliveInterval 30
"""


def ssh_config_variants(canary: Path, rng: random.Random) -> list:
    """Each option's value swapped for hostile strings and absurd numbers, Include and Match tricks, the text."""
    from test_bad_inputs_fuzz import Variant, _hostile_strings

    lines = SSH_CONFIG.splitlines()
    values = [*_hostile_strings(canary), "0", "65536", "-1", "²", "1e308", "99999999999999999999", "%h%h%h%h", "%"]
    out = []
    for i, line in enumerate(lines):
        keyword = line.split()[0]
        for value in values:
            text = "\n".join([*lines[:i], f"{'  ' if line.startswith(' ') else ''}{keyword} {value}", *lines[i + 1 :]])
            out.append(Variant(f"line {i + 1} {keyword} {value[:30]!r}", (text + "\n").encode()))
    tricks = {
        "Include /dev/zero": "Include /dev/zero\n",
        "Include itself": "Include {self}\n",
        "Include a glob of everything": "Include /etc/*\n",
        "Match exec": f'Match exec "touch {canary}"\n  User x\n',
        "ProxyCommand": f"Host node-a\n  ProxyCommand touch {canary}\n",
        "a ProxyJump loop": "Host node-a\n  ProxyJump node-b\nHost node-b\n  ProxyJump node-a\n",
        "a ProxyJump chain of 100": "".join(f"Host h{i}\n  ProxyJump h{i + 1}\n" for i in range(100)).replace(
            "h0", "node-a"
        ),
        "a HostName of 5,000 characters": "Host node-a\n  HostName " + "a" * 5000 + "\n",
        "a Host line of 100,000 patterns": "Host " + " ".join(f"n{i}" for i in range(100_000)) + "\n  User x\n",
    }
    out += [Variant(label, (text + SSH_CONFIG).encode()) for label, text in tricks.items()]
    return out + text_variants(SSH_CONFIG.encode(), rng)


def resolve_hosts(path: Path, hosts: Path) -> object:
    from hetrl_cli.artifacts.hosts import load_hosts
    from hetrl_cli.remote.sshconfig import SshConfig

    config = SshConfig.load(path)
    return [config.resolve(entry) for entry in load_hosts(hosts)]


def sweep_ssh_config(workspace: Path, cli_runs: int | None, seed: int, canary: Path) -> None:
    from test_bad_inputs_fuzz import leftovers

    rng = random.Random(seed)
    folder = workspace / f"ssh-config-{seed}"
    folder.mkdir()
    hosts, path, out = folder / "hosts.txt", folder / "config", folder / "out"
    hosts.write_text(LINK_HOSTS)
    problems: list[str] = []
    refused = []
    variants = ssh_config_variants(canary, random.Random(seed))
    for variant in variants:
        path.write_bytes(variant.data.replace(b"{self}", str(path).encode()))
        problem, loaded = check_library(f"ssh config [{variant.label}] (library)", "ssh config",
                                        lambda: resolve_hosts(path, hosts))  # fmt: skip
        problems.append(problem or "")
        if loaded is None:
            refused.append(variant)
    for make in structural_variants("config", workspace / "small.json"):
        make.apply(folder)
        problem, _ = check_library(
            f"ssh config [{make.label}] (library)", "ssh config", lambda: resolve_hosts(path, hosts)
        )
        problems.append(problem or "")
    path.unlink(missing_ok=True)
    for variant in sample(refused, cli_runs, rng):
        path.write_bytes(variant.data.replace(b"{self}", str(path).encode()))
        out.mkdir(exist_ok=True)
        args = ["profile", str(hosts), "--ssh-config", str(path), "-o", str(out / "p.json")]
        label = f"ssh config [{variant.label}] (hetrl profile)"
        problems.append(check_refusal(label, run_cli(args), "ssh config") or "")  # or an Include of it
        if stray := leftovers(out, set()):
            problems.append(f"{label}: left {stray} behind")
    report("ssh config", len(variants), [p for p in problems if p])


def test_ssh_config_variants_are_refused_in_one_line_before_any_ssh(
    workspace: Path,
    canary: Path,
    no_ssh: None,
) -> None:
    sweep_ssh_config(workspace, 20, SEED, canary)


@pytest.mark.slow
def test_slow_sweep_of_ssh_config_variants(workspace: Path, canary: Path, no_ssh: None) -> None:
    sweep_ssh_config(workspace, None, SEED + 1, canary)


REGRESSIONS = (
    "index.json [files.rank-00000.safetensors = 'text']",
    "index.json [files.rank-00000.safetensors = []]",
    "meta.json [binary garbage]",
    "latest ['step-999",
    "index.json [tensors.actor/model/model.norm.weight.pieces.0 = 7]",
    "index.json [tensors.actor/model/model.norm.weight.shape = 2.5]",
)
"""Checkpoint variants the slow sweep found crashing (labels' beginnings), kept in the fast set."""


def test_checkpoint_variants_the_slow_sweep_found_stay_refused_in_one_line(
    checkpointed: Path,
    workspace: Path,
    canary: Path,
    no_ssh: None,
) -> None:
    every = checkpoint_variants(checkpointed, random.Random(SEED), canary)
    chosen = [v for v in every if v.label.startswith(REGRESSIONS)]
    assert len(chosen) >= len(REGRESSIONS)
    sweep_checkpoint(chosen, checkpointed, workspace, None, SEED + 7)


def _task_twice(doc: dict) -> None:
    doc["groups"][0]["tasks"] = [doc["groups"][0]["tasks"][0], *doc["groups"][0]["tasks"]]


def _unknown_arch(doc: dict) -> None:
    doc["workload"]["actor"]["arch"] = "x; touch pwned"


@pytest.mark.parametrize("edit", [_task_twice, _unknown_arch], ids=["a task listed twice", "an unknown actor arch"])
def test_run_plans_the_slow_sweep_found_are_refused_in_one_line(
    edit: Callable[[dict], None],
    template: Path,
    workspace: Path,
    no_ssh: None,
) -> None:
    """Found by the slow sweep: `calibrate` said the run's plan 'does not fit' (exit 3), or that its model is
    unknown, without naming the run."""
    doc = json.loads((template / "plan.json").read_text())
    edit(doc)
    variant = RunVariant(f"plan.json [{edit.__name__}]", _write("plan.json", json.dumps(doc).encode()))
    sweep_run_dir(f"plan{edit.__name__}", [variant], template, workspace, None, SEED)
