"""Prompt datasets and the per-step batch: every process derives the same prompts from (seed, step).

Because the batch of step s is a pure function of the seed and s, no process ever sends prompts to another,
and a resumed run sees exactly the prompts the interrupted one would have.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from hetrl_cli.errors import BadInput

TOY_TARGET = "a"
_TOY_WORDS = ("cat", "dog", "sun", "sky", "red", "blue", "tree", "book", "pen", "egg", "day", "week")


@dataclass(frozen=True)
class Record:
    """One prompt and its reference answer (the number for GSM8K, the target character for the toy task)."""

    prompt: str
    answer: str


def toy_records(seed: int, count: int = 256) -> list[Record]:
    """The toy task: prompts asking for the letter 'a' again and again; the reward counts 'a's.

    >>> toy_records(0, 2)[0].answer
    'a'
    """
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        words = " ".join(rng.choice(_TOY_WORDS) for _ in range(rng.randint(1, 3)))
        records.append(Record(prompt=f"{words}: write the letter {TOY_TARGET} again and again:", answer=TOY_TARGET))
    return records


def load_jsonl(path: str | Path) -> list[Record]:
    """GSM8K-style JSONL: one object a line with string fields `prompt` and `answer`; errors name file:line.

    The launcher loads it once before anything starts (runtime.api), so a bad file ends there in one line."""
    where = Path(path).expanduser()
    fix = "set dataset.path to a UTF-8 JSONL file"
    try:
        lines = where.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BadInput(f"{where}: no such dataset file; {fix}") from None
    except IsADirectoryError:
        raise BadInput(f"{where}: is a directory, not a dataset file; {fix}") from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"{where}: not UTF-8 text (byte {exc.start}); {fix}") from None
    except OSError as exc:
        raise BadInput(f"{where}: cannot read the dataset ({exc.strerror}); {fix}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where}:{number}: not valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:  # a number over Python's digit limit, nesting too deep
            raise BadInput(f"{where}:{number}: not a usable JSON line ({type(exc).__name__})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not _plain(item.get("answer")):
            raise BadInput(f"{where}:{number}: expected an object with string 'prompt' and 'answer'")
        records.append(Record(prompt=item["prompt"], answer=str(item["answer"])))
    if not records:
        raise BadInput(f"{where}: the dataset has no records; {fix}")
    return records


def _plain(answer: object) -> bool:
    """An answer the reward can compare: a string or a plain number (GSM8K files carry both)."""
    return isinstance(answer, str) or (isinstance(answer, int | float) and not isinstance(answer, bool))


def load_records(kind: str, path: str | None, seed: int) -> list[Record]:
    """The dataset a workload names (`toy` or `gsm8k-jsonl` with a path)."""
    if kind == "toy":
        return toy_records(seed)
    if kind == "gsm8k-jsonl":
        if not path:
            raise BadInput("dataset kind 'gsm8k-jsonl' needs 'dataset.path' (a JSONL file with prompt/answer)")
        return load_jsonl(path)
    raise BadInput(f"unknown dataset kind {kind!r}; use 'toy' or 'gsm8k-jsonl'")


def step_records(records: list[Record], step: int, prompts_per_step: int, seed: int) -> list[Record]:
    """The prompts of step `step` (1-based): consecutive slices of a per-epoch shuffle seeded by (seed, epoch).

    >>> recs = [Record(str(i), "") for i in range(5)]
    >>> sorted(r.prompt for r in step_records(recs, 1, 5, 0))
    ['0', '1', '2', '3', '4']
    """
    orders: dict[int, list[int]] = {}
    out = []
    start = (step - 1) * prompts_per_step
    for position in range(start, start + prompts_per_step):
        epoch, offset = divmod(position, len(records))
        if epoch not in orders:
            orders[epoch] = list(range(len(records)))
            random.Random(f"{seed}:{epoch}").shuffle(orders[epoch])
        out.append(records[orders[epoch][offset]])
    return out
