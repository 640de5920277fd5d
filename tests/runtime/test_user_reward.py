"""A workload's `module:function` reward: what is accepted, the one-line errors, and the gate that keeps a plan
file from naming code to run without --allow-user-reward. The end-to-end run is in test_run_watch.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.workload import load_workload
from hetrl_cli.errors import BadInput
from hetrl_cli.runtime.rewards import load_user_reward, reward_scorer

from .plans import D0, GRPO_TASKS, disaggregated, hand_plan, on, tiny_workload

MODULE = """
def exact(prompt, response, answer):
    return 1.0 if response.strip() == answer else 0.0

def two_args(response, answer):
    return 0.0

def wordy(prompt, response, answer):
    return "high"

THRESHOLD = 0.5
"""


@pytest.fixture
def rewards_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "user_rewards_t.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_user_function_scores_with_prompt_response_answer(rewards_module) -> None:
    score = reward_scorer("user_rewards_t:exact")
    assert score("2+2?", " 4 ", "4") == 1.0 and score("2+2?", "5", "4") == 0.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_t:f", "reward no_such_module_t:f: cannot import no_such_module_t: ModuleNotFoundError: "
                               "No module named 'no_such_module_t'"),
        ("user_rewards_t:THRESHOLD", "reward user_rewards_t:THRESHOLD: THRESHOLD is a float, not a function"),
        ("user_rewards_t:two_args", "reward user_rewards_t:two_args: two_args(response, answer) cannot take "
                                    "(prompt, response, answer)"),
    ],
)  # fmt: skip
def test_unusable_functions_are_one_line_errors(rewards_module, spec: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        load_user_reward(spec)
    assert str(err.value) == message


def test_a_missing_function_names_the_module_file(rewards_module) -> None:
    with pytest.raises(ValueError, match=r"module user_rewards_t \(.*user_rewards_t\.py\) has no 'nope'"):
        load_user_reward("user_rewards_t:nope")


def test_a_non_number_reward_fails_naming_the_function(rewards_module) -> None:
    with pytest.raises(ValueError, match=r"reward user_rewards_t:wordy returned 'high'; it must return a finite float"):
        reward_scorer("user_rewards_t:wordy")("p", "r", "a")


def test_workload_rejects_a_malformed_reward_rule(tmp_path: Path) -> None:
    path = tmp_path / "wl.yaml"
    path.write_text("reward_rule: 'rm -rf /'\n")
    with pytest.raises(BadInput, match=r"neither a built-in rule \(numeric-answer, toy\) nor 'module:function'"):
        load_workload(path)


def plan_file(tmp_path: Path, rule: str) -> Path:
    path = tmp_path / "plan.json"
    save_artifact(hand_plan(tiny_workload(reward_rule=rule), on(D0, GRPO_TASKS), name="single"), path)
    return path


def test_a_plan_naming_code_needs_allow_user_reward(hetrl, tmp_path: Path) -> None:
    """A plan file carries its workload: run refuses to import what it names unless the user says so."""
    plan = plan_file(tmp_path, "os:system")
    result = hetrl("run", plan, "--run-dir", tmp_path / "run", "--steps", "1", "--engine", "hf", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "hetrl: error: plan 'single' names reward code 'os:system' (workload reward_rule), which the workers would "
        "import and run: pass --allow-user-reward if it is yours\n"
    )
    assert not (tmp_path / "run").exists()
    result = hetrl("validate", plan, "--run-dir", tmp_path / "run", "--steps", "2", "--engine", "hf", cwd=tmp_path)
    assert result.returncode == 2 and "pass --allow-user-reward" in result.stderr


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("no_such_module_t:f", "reward no_such_module_t:f: cannot import no_such_module_t: ModuleNotFoundError: "
                               "No module named 'no_such_module_t'"),
        ("user_rewards_t:THRESHOLD", "reward user_rewards_t:THRESHOLD: THRESHOLD is a float, not a function"),
    ],
)  # fmt: skip
def test_preflight_refuses_an_unusable_reward_before_launching(hetrl, tmp_path: Path, rule: str, message: str) -> None:
    (tmp_path / "user_rewards_t.py").write_text(MODULE)  # importable from the run's working directory
    plan = plan_file(tmp_path, rule)
    result = hetrl("run", plan, "--run-dir", tmp_path / "run", "--steps", "1", "--engine", "hf",
                   "--allow-user-reward", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == f"hetrl: error: {message}\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_multihost_preflight_checks_the_reward_on_the_hosts_that_score(hetrl, sshd_hosts, tmp_path: Path) -> None:
    """Disaggregated over two hosts: the reward runs on the second, so only that host reports the import failure."""
    a, b = sshd_hosts.addresses[:2]
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(sshd_hosts.hosts_line(a) + sshd_hosts.hosts_line(b))
    d0, d1 = f"{a}:{sshd_hosts.port}/0", f"{b}:{sshd_hosts.port}/0"
    save_artifact(disaggregated(tiny_workload(reward_rule="no_such_module_t:f"), d0, d1), tmp_path / "plan.json")
    result = hetrl("run", "plan.json", "--hosts", hosts, "--known-hosts", sshd_hosts.known_hosts, "--engine", "hf",
                   "--run-dir", tmp_path / "run", "--allow-user-reward", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1, result.stderr
    report = result.stderr.split("nothing launched:", 1)[1]
    assert "preflight failed on 1 of 2 hosts" in result.stderr
    assert f"{b}:{sshd_hosts.port}: reward no_such_module_t:f: cannot import no_such_module_t" in report
    assert f"{a}:{sshd_hosts.port}:" not in report
    assert not (tmp_path / "run").exists()
