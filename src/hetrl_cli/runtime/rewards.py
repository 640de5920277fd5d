"""Rule-based rewards: plain functions of (response text, reference answer) -> float in [0, 1].

`numeric-answer` checks a GSM8K-style final number; `toy` rewards the fraction of a target character, a task
the tiny random model measurably learns on CPU within a few dozen GRPO steps (it only has to shift probability
mass towards the tokens that contain the character).
"""

from __future__ import annotations

import re
from collections.abc import Callable

RewardFn = Callable[[str, str], float]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def extract_number(text: str) -> str | None:
    """The final answer of a GSM8K-style text: the number after the last `####`, else the last number.

    >>> extract_number("3 + 4 = 7. #### 7")
    '7'
    >>> extract_number("she has 1,250 apples, so 1,200.")
    '1200'
    >>> extract_number("no digits") is None
    True
    """
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    found = _NUMBER.findall(tail)
    if not found:
        return None
    return found[-1 if "####" not in text else 0].replace(",", "").rstrip(".")


def numeric_answer_reward(response: str, answer: str) -> float:
    """1.0 when the response's final number equals the answer's (numerically), else 0.0.

    >>> numeric_answer_reward("so the total is 42", "#### 42")
    1.0
    >>> numeric_answer_reward("#### 42.0", "42")
    1.0
    >>> numeric_answer_reward("I think 41", "42")
    0.0
    """
    got, want = extract_number(response), extract_number(answer)
    if got is None or want is None:
        return 0.0
    try:
        return 1.0 if abs(float(got) - float(want)) < 1e-6 else 0.0
    except ValueError:
        return 0.0


def char_fraction_reward(response: str, target: str) -> float:
    """Fraction of the response's non-space characters that are `target` (0.0 for an empty response).

    >>> char_fraction_reward("aab a", "a")
    0.75
    >>> char_fraction_reward("", "a")
    0.0
    """
    chars = [c for c in response if not c.isspace()]
    if not chars or not target:
        return 0.0
    return sum(c == target for c in chars) / len(chars)


REWARD_RULES: dict[str, RewardFn] = {"numeric-answer": numeric_answer_reward, "toy": char_fraction_reward}


def reward_rule(name: str) -> RewardFn:
    """The reward function registered under a workload's `reward_rule`."""
    try:
        return REWARD_RULES[name]
    except KeyError:
        raise ValueError(f"unknown reward rule {name!r}; known: {', '.join(REWARD_RULES)}") from None
