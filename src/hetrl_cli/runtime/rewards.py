"""Rule-based rewards: plain functions of (response text, reference answer) -> float in [0, 1], and user rewards.

`numeric-answer` checks a GSM8K-style final number; `toy` rewards the fraction of a target character, a task
the tiny random model measurably learns on CPU within a few dozen GRPO steps (it only has to shift probability
mass towards the tokens that contain the character).

A workload's `reward_rule` may instead name the user's own function as `module:function` (e.g.
`my_rewards:exact_match`), importable from the run's working directory or PYTHONPATH, called as
`fn(prompt, response, answer) -> float`, or a verl reward, recognised by its parameter names
(`solution_str` and `ground_truth`) and called as verl calls it:
`compute_score(data_source=..., solution_str=response, ground_truth=answer, extra_info=...)`, with the row's
`data_source` and `extra_info` (those it accepts); it may return a number or a dict with a `score`, as in verl.
That names code to execute, and a plan file carries its workload, so `hetrl run` / `hetrl validate` import it
only with `--allow-user-reward` (see `user_reward_gate`), and check that it imports and can be called one of
those ways before anything is launched (`check_user_reward`).
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetrl_cli.errors import BadInput
from hetrl_cli.runtime.datasets import Record

RewardFn = Callable[[str, str], float]
"""A built-in rule: (response, answer) -> reward."""
ScoreFn = Callable[[str, str, str], float]
"""A user function called as (prompt, response, answer) -> reward."""
RecordScore = Callable[[Record, str], float]
"""What the reward role calls: (the dataset record, the decoded response) -> reward."""
VERL_PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""verl's `compute_score` parameters; a function taking `solution_str` and `ground_truth` is called verl's way."""

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
"""Built-in rules by name; the workload accepts the names artifacts/rl.REWARD_RULE_NAMES lists (a test keeps
the two equal, so validating a workload needs no runtime import)."""


def reward_rule(name: str) -> RewardFn:
    """The reward function registered under a workload's `reward_rule`."""
    try:
        return REWARD_RULES[name]
    except KeyError:
        raise ValueError(f"unknown reward rule {name!r}; known: {', '.join(REWARD_RULES)}") from None


def is_user_reward(rule: str) -> bool:
    """Whether a `reward_rule` names user code (`module:function`) rather than a built-in rule.

    >>> is_user_reward("toy"), is_user_reward("my_rewards:exact")
    (False, True)
    """
    return ":" in rule


def load_user_reward(spec: str) -> ScoreFn:
    """Import `module:function` and check it can be called as fn(prompt, response, answer) or verl's way
    (ValueError, one line); the result is called as (prompt, response, answer)."""
    score = user_record_scorer(spec)
    return lambda prompt, response, answer: score(Record(prompt, answer), response)


def user_record_scorer(spec: str) -> RecordScore:
    """The user's `module:function` as the reward role calls it: on the record and the response."""
    fn = _import_user_function(spec)
    if is_verl_style(fn):
        return _checked(spec, _verl_caller(spec, fn))
    try:
        inspect.signature(fn).bind("prompt", "response", "answer")
    except TypeError:
        raise ValueError(
            f"reward {spec}: {spec.partition(':')[2]}{inspect.signature(fn)} cannot take (prompt, response, answer)"
        ) from None
    except ValueError:  # builtins without a signature: trust them
        pass
    return _checked(spec, lambda record, response: fn(record.prompt, response, record.answer))


def _import_user_function(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything at import time
        raise ValueError(f"reward {spec}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"reward {spec}: module {module_name} ({module.__file__}) has no {attr!r}")
    if not callable(fn):
        raise ValueError(f"reward {spec}: {attr} is a {type(fn).__name__}, not a function")
    return fn


def is_verl_style(fn: Callable[..., Any]) -> bool:
    """Whether `fn` has verl's reward parameters (`solution_str` and `ground_truth`, by name).

    >>> def compute_score(data_source, solution_str, ground_truth, extra_info=None): ...
    >>> is_verl_style(compute_score), is_verl_style(lambda prompt, response, answer: 0.0)
    (True, False)
    """
    try:
        names = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "solution_str" in names and "ground_truth" in names


def _verl_caller(spec: str, fn: Callable[..., Any]) -> RecordScore:
    """Call `fn` by keyword with what it takes of verl's four arguments; refuse one that needs more."""
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    passed = tuple(name for name in VERL_PARAMETERS if takes_any or name in params)
    needed = [
        name
        for name, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and name not in passed
    ]
    if needed:
        raise ValueError(
            f"reward {spec}: {spec.partition(':')[2]}{inspect.signature(fn)} needs {', '.join(needed)}; verl rewards "
            f"are called with ({', '.join(VERL_PARAMETERS)})"
        )

    def call(record: Record, response: str) -> Any:
        values = {
            "data_source": record.data_source,
            "solution_str": response,
            "ground_truth": record.answer,
            "extra_info": record.extra_info,
        }
        return fn(**{name: values[name] for name in passed})

    return call


def _checked(spec: str, fn: Callable[[Record, str], Any]) -> RecordScore:
    """`fn` whose result must be a finite number, or a dict with a finite `score` as verl's may return (a
    clear error in the worker's log otherwise)."""

    def score(record: Record, response: str) -> float:
        value = fn(record, response)
        if isinstance(value, dict) and "score" in value:
            value = value["score"]
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not math.isfinite(number):
            raise ValueError(f"reward {spec} returned {value!r}; it must return a finite float")
        return number

    return score


def reward_scorer(rule: str) -> ScoreFn:
    """A workload's `reward_rule` called as (prompt, response, answer): a built-in (the prompt unused) or user code.

    >>> reward_scorer("toy")("say a:", "aab", "a")
    0.6666666666666666
    """
    score = record_scorer(rule)
    return lambda prompt, response, answer: score(Record(prompt, answer), response)


def record_scorer(rule: str) -> RecordScore:
    """What the reward role calls for a workload's `reward_rule`, on a dataset record and the response.

    >>> record_scorer("numeric-answer")(Record("2+2?", "4"), "it is 4")
    1.0
    """
    if is_user_reward(rule):
        return user_record_scorer(rule)
    fn = reward_rule(rule)
    return lambda record, response: fn(response, record.answer)


_CHECK_SCRIPT = (
    "import sys\n"
    "from hetrl_cli.runtime.rewards import load_user_reward\n"
    "try:\n    load_user_reward(sys.argv[1])\n"
    "except ValueError as exc:\n    print(exc); sys.exit(1)"
)
"""Run by the worker interpreter in the launch's directory: imports the function exactly as a worker would."""


def user_reward_gate(rule: str, plan_name: str, allowed: bool) -> None:
    """Refuse a plan whose workload names user code unless the user said they trust it (--allow-user-reward)."""
    if is_user_reward(rule) and not allowed:
        raise BadInput(
            f"plan '{plan_name}' names reward code {rule!r} (workload reward_rule), which the workers would import "
            "and run: pass --allow-user-reward if it is yours"
        )


def check_user_reward(rule: str, python: str, cwd: Path | None = None, timeout_s: float = 120.0) -> None:
    """Preflight: import `module:function` with the worker interpreter from the run's working directory."""
    if not is_user_reward(rule):
        return
    try:
        done = subprocess.run(
            [python, "-c", _CHECK_SCRIPT, rule], cwd=cwd, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        raise BadInput(f"reward {rule}: importing it took over {timeout_s:.0f} s") from None
    if done.returncode != 0:
        lines = (done.stdout.strip() or done.stderr.strip() or f"exit code {done.returncode}").splitlines()
        raise BadInput(lines[-1] if lines[-1].startswith("reward ") else f"reward {rule}: {lines[-1]}")
