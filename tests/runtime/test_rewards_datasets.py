"""Rule rewards and the per-step prompt batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetrl_cli.errors import BadInput
from hetrl_cli.runtime.datasets import Record, load_jsonl, load_records, step_records, toy_records
from hetrl_cli.runtime.rewards import char_fraction_reward, numeric_answer_reward, reward_rule


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("She pays 3 * 4 = 12 dollars. #### 12", "#### 12", 1.0),
        ("The answer is 1,250.", "1250", 1.0),
        ("#### -3", "-3", 1.0),
        ("#### 7 and later 8", "7", 1.0),  # after ####, the first number counts
        ("12 then 13", "12", 0.0),  # without ####, the last number counts
        ("no number here", "5", 0.0),
        ("0.5", "#### .5", 1.0),
    ],
)
def test_numeric_answer_reward(response: str, answer: str, expected: float) -> None:
    assert numeric_answer_reward(response, answer) == expected


def test_toy_reward_counts_the_target_among_non_space_characters() -> None:
    assert char_fraction_reward("a a b", "a") == pytest.approx(2 / 3)
    assert char_fraction_reward("   ", "a") == 0.0
    assert reward_rule("toy") is char_fraction_reward
    with pytest.raises(ValueError, match="unknown reward rule"):
        reward_rule("nope")


def test_jsonl_loader_names_file_and_line(tmp_path: Path) -> None:
    good = tmp_path / "ok.jsonl"
    good.write_text('{"prompt": "1+1?", "answer": "#### 2"}\n\n{"prompt": "2+2?", "answer": 4}\n')
    assert load_jsonl(good) == [Record("1+1?", "#### 2"), Record("2+2?", "4")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "answer": "1"}\n{"question": "y"}\n')
    with pytest.raises(BadInput, match=r"bad\.jsonl:2: expected an object with string 'prompt' and 'answer'"):
        load_jsonl(bad)
    with pytest.raises(BadInput, match=r"needs 'dataset\.path'"):
        load_records("gsm8k-jsonl", None, 0)


def test_step_batches_are_deterministic_cover_each_epoch_and_wrap() -> None:
    records = [Record(str(i), "") for i in range(6)]
    epoch = [r.prompt for s in (1, 2, 3) for r in step_records(records, s, 2, seed=7)]
    assert sorted(epoch) == [str(i) for i in range(6)]
    assert step_records(records, 2, 2, seed=7) == step_records(records, 2, 2, seed=7)
    assert len(step_records(records, 4, 2, seed=7)) == 2  # second epoch
    assert toy_records(0, 8) == toy_records(0, 8)


def test_the_workload_accepts_exactly_the_rules_the_runtime_has():
    from hetrl_cli.artifacts.rl import REWARD_RULE_NAMES
    from hetrl_cli.runtime.rewards import REWARD_RULES

    assert tuple(REWARD_RULES) == REWARD_RULE_NAMES
