"""Prompt datasets and the per-step batch: every process derives the same prompts from (seed, step).

Because the batch of step s is a pure function of the seed and s, no process ever sends prompts to another,
and a resumed run sees exactly the prompts the interrupted one would have.

Kinds: `toy` (built in), `gsm8k-jsonl` (string `prompt`/`answer` lines, as before), and `jsonl` / `parquet`,
whose rows are mapped column by column: the prompt from `prompt` or `question` (a string, or the list of
{role, content} messages verl's GSM8K/MATH parquet files hold), the answer from `answer`, `ground_truth` or
`reward_model.ground_truth`, and `data_source` / `extra_info` kept for verl-style rewards. Message lists are
rendered with the actor tokenizer's chat template (`encode_prompts`) unless the workload turns it off.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrl_cli.errors import BadInput

if TYPE_CHECKING:
    from hetrl_cli.artifacts.workload import DatasetSpec

TOY_TARGET = "a"
_TOY_WORDS = ("cat", "dog", "sun", "sky", "red", "blue", "tree", "book", "pen", "egg", "day", "week")
PROMPT_COLUMNS = ("prompt", "question")
"""Where a `jsonl`/`parquet` row's prompt is looked for, in order (unless `dataset.prompt_key` names it)."""
ANSWER_COLUMNS = ("answer", "ground_truth", "reward_model.ground_truth")
"""Where its reference answer is looked for, in order (unless `dataset.answer_key` names it); dots go into
nested objects (verl keeps the answer in `reward_model: {style, ground_truth}`)."""


@dataclass(frozen=True)
class Record:
    """One prompt and its reference answer (the number for GSM8K, the target character for the toy task).

    `messages` holds a chat prompt's (role, content) pairs (then `prompt` is their contents, one a line);
    `data_source` and `extra_info` are the row's, passed to verl-style rewards."""

    prompt: str
    answer: str
    messages: tuple[tuple[str, str], ...] = ()
    data_source: str = ""
    extra_info: dict[str, Any] | None = field(default=None, hash=False)


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
    lines = _read_text(where, "JSONL").splitlines()
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


DATASET_KINDS = ("toy", "gsm8k-jsonl", "jsonl", "parquet")


def load_records(
    kind: str, path: str | None, seed: int, prompt_key: str | None = None, answer_key: str | None = None
) -> list[Record]:
    """The dataset a workload names: `toy`, `gsm8k-jsonl`, or a `jsonl`/`parquet` file mapped by columns."""
    if kind == "toy":
        return toy_records(seed)
    if kind not in DATASET_KINDS:
        raise BadInput(f"unknown dataset kind {kind!r}; use one of: {', '.join(DATASET_KINDS)}")
    if not path:
        what = "a JSONL file with prompt/answer" if kind == "gsm8k-jsonl" else f"a {kind} file"
        raise BadInput(f"dataset kind {kind!r} needs 'dataset.path' ({what})")
    if kind == "gsm8k-jsonl":
        return load_jsonl(path)
    rows = _jsonl_rows(Path(path).expanduser()) if kind == "jsonl" else _parquet_rows(Path(path).expanduser())
    records = [_record(row, where, prompt_key, answer_key) for row, where in rows]
    if not records:
        raise BadInput(f"{Path(path).expanduser()}: the dataset has no records; set dataset.path to a {kind} file")
    return records


def load_dataset(spec: DatasetSpec, seed: int) -> list[Record]:
    """The records of a workload's `dataset` (what the workers and the pre-launch checks load)."""
    return load_records(spec.kind, spec.path, seed, spec.prompt_key, spec.answer_key)


def _read_text(where: Path, kind: str) -> str:
    fix = f"set dataset.path to a UTF-8 {kind} file"
    try:
        return where.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{where}: no such dataset file; {fix}") from None
    except IsADirectoryError:
        raise BadInput(f"{where}: is a directory, not a dataset file; {fix}") from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"{where}: not UTF-8 text (byte {exc.start}); {fix}") from None
    except OSError as exc:
        raise BadInput(f"{where}: cannot read the dataset ({exc.strerror}); {fix}") from None


def _jsonl_rows(where: Path) -> Iterator[tuple[Any, str]]:
    """(row, 'file: line N') of every non-blank line."""
    for number, line in enumerate(_read_text(where, "JSONL").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line), f"{where}: line {number}"
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where}: line {number}: not valid JSON ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:  # a number over Python's digit limit, nesting too deep
            raise BadInput(f"{where}: line {number}: not a usable JSON line ({type(exc).__name__})") from None


def _parquet_rows(where: Path) -> Iterator[tuple[Any, str]]:
    """(row, 'file: row N') of every row (N from 1), read with pyarrow."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise BadInput(f"{where}: reading Parquet needs pyarrow: pip install pyarrow (or 'hetrl[cpu]')") from None
    if not where.is_file():
        state = "is a directory, not a dataset file" if where.is_dir() else "no such dataset file"
        raise BadInput(f"{where}: {state}; set dataset.path to a Parquet file")
    try:
        rows = pq.read_table(where).to_pylist()
    except Exception as exc:  # pyarrow's ArrowInvalid, OSError, ... for a file that is not Parquet
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise BadInput(f"{where}: not a readable Parquet file ({first}); set dataset.path to a Parquet file") from None
    for number, row in enumerate(rows, start=1):
        yield row, f"{where}: row {number}"


def _lookup(row: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of `key` in `row`: the key itself, else a dotted path through nested objects."""
    if key in row:
        return True, row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _column(
    row: dict[str, Any], where: str, given: str | None, candidates: Sequence[str], what: str
) -> tuple[str, Any]:
    """(column, value) of the row's prompt or answer: the workload's key, else the first candidate present."""
    for key in (given,) if given else candidates:
        found, value = _lookup(row, key)
        if found and value is not None:
            return key, value
    looked = f"'{given}'" if given else ", ".join(f"'{c}'" for c in candidates)
    option = "prompt_key" if what == "prompt" else "answer_key"
    raise BadInput(f"{where}: no {what} column (looked for {looked}); name it with dataset.{option}")


def _record(row: Any, where: str, prompt_key: str | None, answer_key: str | None) -> Record:
    """A Record from one row, or BadInput naming the file, the row and the column."""
    if not isinstance(row, dict):
        raise BadInput(f"{where}: expected an object (a row of named columns), got {type(row).__name__}")
    prompt_column, prompt = _column(row, where, prompt_key, PROMPT_COLUMNS, "prompt")
    answer_column, answer = _column(row, where, answer_key, ANSWER_COLUMNS, "answer")
    messages = _messages(prompt, where, prompt_column)
    if not messages and not (isinstance(prompt, str) and prompt):
        raise BadInput(
            f"{where}: column '{prompt_column}' is {_kind(prompt)}; expected a non-empty string or a list of "
            "{role, content} messages"
        )
    if not _plain(answer):
        raise BadInput(f"{where}: column '{answer_column}' is {_kind(answer)}; expected a string or a number")
    source = row.get("data_source")
    extra = row.get("extra_info")
    return Record(
        prompt="\n".join(content for _, content in messages) if messages else prompt,
        answer=str(answer),
        messages=messages,
        data_source=source if isinstance(source, str) else "",
        extra_info=extra if isinstance(extra, dict) else None,
    )


def _messages(prompt: Any, where: str, column: str) -> tuple[tuple[str, str], ...]:
    """A chat prompt's (role, content) pairs; () when the prompt is not a list."""
    if not isinstance(prompt, list):
        return ()
    if not prompt:
        raise BadInput(f"{where}: column '{column}' is an empty message list; give at least one message")
    out = []
    for i, message in enumerate(prompt):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):  # fmt: skip
            raise BadInput(
                f"{where}: column '{column}', message {i}: expected {{role, content}} strings, got {_kind(message)}"
            )
        out.append((message["role"], message["content"]))
    return tuple(out)


def _kind(value: Any) -> str:
    """'a list', 'a bool', 'null': what a value is, for an error message (never the value: it may be huge)."""
    if value is None:
        return "null"
    name = {"dict": "an object", "list": "a list", "str": "an empty string" if value == "" else "a string"}
    return name.get(type(value).__name__, f"a {type(value).__name__}")


_NOTED: set[str] = set()


def _note_once(line: str) -> None:
    """Say `line` once per process (on stdout: the launcher shows the workers' output)."""
    if line not in _NOTED:
        _NOTED.add(line)
        print(line, file=sys.stdout, flush=True)


def encode_prompts(tokenizer: Any, records: Sequence[Record], chat_template: bool = True) -> list[list[int]]:
    """Token ids of each record's prompt: a message list rendered with the tokenizer's chat template (with the
    generation prompt) when `chat_template` is on and the tokenizer has one, anything else tokenised raw.
    No special tokens are added: a template writes its own."""
    template = chat_template and bool(getattr(tokenizer, "chat_template", None))
    texts = []
    for record in records:
        if record.messages and template:
            chat = [{"role": role, "content": content} for role, content in record.messages]
            texts.append(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
        else:
            texts.append(record.prompt)
    if any(r.messages for r in records):
        if template:
            _note_once("dataset: chat prompts rendered with the actor tokenizer's chat template")
        elif chat_template:
            _note_once("dataset: the actor tokenizer has no chat template; chat prompts are tokenised as plain text")
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


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
