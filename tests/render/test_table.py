"""`show` as rich tables: every section for every fixture, widths respected, stale flag, big clusters."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.render.digest import seconds
from hetrl_cli.render.plan import show_plan
from hetrl_cli.render.timeline import time_format

SECTIONS = ("workload", "Groups", "Tasks", "Predicted time per task", "Device map", "Iteration timeline", "Peak memory")


def render(plan: Plan, width: int = 100, **options) -> str:
    buf = io.StringIO()
    show_plan(plan, console=Console(file=buf, width=width, highlight=False), **options)
    return buf.getvalue()


@pytest.mark.parametrize("name", ["ppo_plan", "baseline_plan", "grpo_plan"])
@pytest.mark.parametrize("with_profile", [False, True])
def test_every_section_is_present(request: pytest.FixtureRequest, name: str, with_profile: bool) -> None:
    plan = request.getfixturevalue(name)
    profile = request.getfixturevalue("cluster") if with_profile else None
    text = render(plan, profile=profile)
    for title in (*SECTIONS, "Bottleneck:", plan.name):
        assert title in text, title
    fmt = time_format(plan.cost.iteration_s)
    rows = [line for line in text.splitlines() if line.count("│") == 2]
    assert len(rows) == len(plan.cost.timeline)  # one chart row per entry
    for entry, row in zip(sorted(plan.cost.timeline, key=lambda e: (e.start_s, e.end_s)), rows, strict=True):
        assert row.startswith(entry.name[:10])
        assert row.endswith(f"{seconds(entry.end_s - entry.start_s)} at {fmt.format(entry.start_s)} s"), row


def test_summary_groups_and_tasks_content(ppo_plan: Plan, cluster: ClusterProfile) -> None:
    text = render(ppo_plan, width=160, profile=cluster)
    for expected in (
        "PPO sync · actor qwen3-8b, critic qwen3-8b",
        "15.8 s · 64.8 samples/s · 33.2k tokens/s",
        "ilp · optimal · objective 15.8 · bound 15.8 · gap 0.00% · solved in 4.2 s · 3,120 evaluations",
        "4×A100 (a100-0), 4×L4 (l4-0)",
        "0.31/0.31/0.19/0.19",
        "20/16",
        "A A A A B B B ·",
        "us-west-2",
        "decode on the 4 L4s sets the pace",
    ):
        assert expected in text, expected


@pytest.mark.parametrize("width", [80, 160])
def test_lines_fit_the_width_and_bars_scale_with_it(ppo_plan: Plan, cluster: ClusterProfile, width: int) -> None:
    text = render(ppo_plan, width=width, profile=cluster)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    generation = next(line for line in text.splitlines() if line.startswith("generation ") and "│" in line)
    # generation is 6 s of a 15.8 s axis: ~38% of the bar cells.
    cells = generation.split("│")[1]
    assert abs(cells.count("█") / len(cells) - 6.0 / 15.8) < 0.03


def test_capacity_columns_only_with_a_profile(ppo_plan: Plan, cluster: ClusterProfile) -> None:
    def memory_header(text: str) -> str:
        return next(line for line in text.splitlines() if "host (fullest device)" in line)

    assert memory_header(render(ppo_plan)).split() == ["host", "(fullest", "device)", "devs", "peak"]
    with_profile = render(ppo_plan, profile=cluster)
    assert memory_header(with_profile).split()[-2:] == ["capacity", "used"]
    assert "84%" in with_profile  # a100-1: 72e9 bytes of 80 GiB


def test_stale_banner_iff_fingerprints_differ(ppo_plan: Plan, cluster: ClusterProfile) -> None:
    assert "STALE" not in render(ppo_plan, profile=cluster)
    assert "STALE" not in render(ppo_plan)
    other = cluster.model_copy(update={"devices": cluster.devices[:-1]}).with_fingerprint()
    text = render(ppo_plan, width=160, profile=other)
    assert text.lstrip().splitlines()[1].lstrip("┃ ").startswith("STALE PLAN lab-ilp")
    assert "1 device(s) the plan uses are gone: l4-0/3" in text


def test_default_console_is_stdout_without_colour_when_piped(ppo_plan: Plan, capsys: pytest.CaptureFixture) -> None:
    show_plan(ppo_plan)
    out, err = capsys.readouterr()
    assert "Iteration timeline" in out and "\x1b[" not in out
    assert err == ""


def test_no_timeline_says_so(grpo_plan: Plan) -> None:
    bare = grpo_plan.model_copy(update={"cost": grpo_plan.cost.model_copy(update={"timeline": []})})
    text = render(bare)
    assert "no timeline in this plan" in text
    assert "generation (group A, colocated) takes 5.2 s" in text  # bottleneck falls back to task times


def test_1024_devices_stay_fast_and_fit_a_screen(uniform_plan) -> None:
    plan, profile = uniform_plan(128)
    start = time.perf_counter()
    text = render(plan, width=120, profile=profile)
    assert time.perf_counter() - start < 2.0
    assert len(text.splitlines()) < 100
    assert "a100-[0-63] (64 hosts)" in text
    assert "512×A100 (a100-[0-63])" in text
    assert "… 116 more hosts, the emptiest at" in text


def test_64_devices(uniform_plan) -> None:
    plan, profile = uniform_plan(8)
    text = render(plan, profile=profile)
    assert "32×A100 (a100-[0-3])" in text
    assert "16×0.0625" in text


def test_ascii_chart_fallback(ppo_plan: Plan) -> None:
    from hetrl_cli.render.digest import digest_plan
    from hetrl_cli.render.timeline import gantt_lines, plain_chart, timeline_bars

    bars = timeline_bars(ppo_plan, digest_plan(ppo_plan).letters)
    lines, label_w, bar_w = gantt_lines(bars, 15.8, 80, ascii_only=True)
    chart = plain_chart(lines, label_w, bar_w, 15.8, ascii_only=True)
    assert all(line.isascii() for line in chart)
    assert len(chart) == len(bars) + 3 and chart[0].startswith("generation")


def test_entry_of_an_unknown_group_is_drawn_without_a_letter(ppo_plan: Plan) -> None:
    entries = [*ppo_plan.cost.timeline[:-1], ppo_plan.cost.timeline[-1].model_copy(update={"group": "train->rollout"})]
    plan = ppo_plan.model_copy(update={"cost": ppo_plan.cost.model_copy(update={"timeline": entries})})
    sync = next(line for line in render(plan).splitlines() if line.startswith("weight_sync"))
    assert sync.split()[1] == "-" and sync.endswith("800 ms at 15.0 s")


def test_long_timeline_labels_are_cut_into_different_strings() -> None:
    from hetrl_cli.render.timeline import shorten_unique

    labels = ["transfer:generation+reference->actor_train", "transfer:generation+reference->critic_train",
              "generation", "transfer:generation+reference->actor_train:experience-0",
              "transfer:generation+reference->actor_train:experience-1"]  # fmt: skip
    short = shorten_unique(labels, 20)
    assert all(len(s) <= 20 for s in short)
    assert len(set(short)) == len(labels)
    assert short[2] == "generation"
    assert short[0] == "transfer:…ctor_train" and short[1] == "transfer:…itic_train"
