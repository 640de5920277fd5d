"""The data, rewards and models users bring (issue 22, items 5-7): JSONL and Parquet datasets mapped by column
(verl's chat-message prompts and `reward_model.ground_truth` included), the chat template, verl-style
`compute_score` rewards, `actor: {path: DIR}` planned as DIR's architecture, and paths taken from the workload
file's folder. The end-to-end `hetrl run` of all of it together is the one slow test at the bottom."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl_cli.artifacts.workload import DatasetSpec, load_workload
from hetrl_cli.errors import BadInput
from hetrl_cli.runtime.datasets import Record, encode_prompts, load_dataset, step_records
from hetrl_cli.runtime.rewards import load_user_reward, record_scorer

HETRL = str(Path(sys.executable).with_name("hetrl"))
PROFILE = Path(__file__).resolve().parent.parent / "calibration" / "data" / "localhost-2cpu.json"
TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
"""A chat template for the tiny tokenizer (which has none): roles spelled out, ending in 'assistant:'."""


def verl_rows(count: int) -> list[dict]:
    """Rows shaped as verl's GSM8K parquet files: a chat prompt, the answer under reward_model, extra_info."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}? Let's think step by step."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(count)
    ]


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = list(dict.fromkeys(key for row in rows for key in row))  # from_pylist reads the first row's only
    pq.write_table(pa.Table.from_pylist([{key: row.get(key) for key in columns} for row in rows]), path)
    return path


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# ---- datasets: column mapping -----------------------------------------------------------------------------


def test_parquet_in_verls_layout_maps_chat_prompts_answers_and_row_facts(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "train.parquet", verl_rows(3))
    records = load_dataset(DatasetSpec(kind="parquet", path=str(path)), seed=0)
    assert records[1] == Record(
        prompt="What is 1 + 1? Let's think step by step.",
        answer="2",
        messages=(("user", "What is 1 + 1? Let's think step by step."),),
        data_source="openai/gsm8k",
        extra_info={"split": "train", "index": 1},
    )


@pytest.mark.parametrize(
    ("row", "keys", "expected"),
    [
        ({"question": "2+2?", "answer": 4}, {}, Record("2+2?", "4")),
        ({"prompt": "2+2?", "ground_truth": "4", "data_source": "mine"}, {}, Record("2+2?", "4", data_source="mine")),
        ({"prompt": "p", "question": "q", "answer": "a", "ground_truth": "g"}, {}, Record("p", "a")),
        ({"q": {"text": "2+2?"}, "sol": {"final": "4"}}, {"prompt_key": "q.text", "answer_key": "sol.final"},
         Record("2+2?", "4")),
        ({"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
          "reward_model": {"ground_truth": "4"}}, {},
         Record("be brief\n2+2?", "4", messages=(("system", "be brief"), ("user", "2+2?")))),
    ],
)  # fmt: skip
def test_jsonl_columns_are_found_by_name(tmp_path: Path, row: dict, keys: dict, expected: Record) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [row])
    assert load_dataset(DatasetSpec(kind="jsonl", path=str(path), **keys), seed=0) == [expected]


def test_the_existing_kinds_keep_working(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "1+1?", "answer": "#### 2"}])
    assert load_dataset(DatasetSpec(kind="gsm8k-jsonl", path=str(path)), 0) == [Record("1+1?", "#### 2")]
    assert load_dataset(DatasetSpec(kind="toy"), 0)[0].answer == "a"


FINE = {"prompt": "fine", "answer": "1"}
CHAT = {"prompt": [{"role": "user", "content": "fine"}], "answer": "1"}
BAD_ROWS = {
    "no prompt column": (FINE, {"text": "x", "answer": "1"},
                         "row 2: no prompt column (looked for 'prompt', 'question'); name it with dataset.prompt_key"),
    "no answer column": (FINE, {"prompt": "x"}, "row 2: no answer column (looked for 'answer', 'ground_truth', "
                                                "'reward_model.ground_truth'); name it with dataset.answer_key"),
    "a message without content": (CHAT, {"prompt": [{"role": "user"}], "answer": "1"},
                                  "row 2: column 'prompt', message 0: expected {role, content} strings"),
    "an empty message list": (CHAT, {"prompt": [], "answer": "1"}, "row 2: column 'prompt' is an empty message list"),
    "a list for an answer": (FINE, {"prompt": "x", "reward_model": {"ground_truth": ["1", "2"]}},
                             "row 2: column 'reward_model.ground_truth' is a list; expected a string or a number"),
    "a bool for an answer": (FINE, {"prompt": "x", "answer": None, "ground_truth": True},
                             "row 2: column 'ground_truth' is a bool; expected a string or a number"),
}  # fmt: skip
"""(a good first row, the bad second row, what the error says): rows Parquet can hold in one table."""


@pytest.mark.parametrize("case", BAD_ROWS)
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_bad_row_names_file_row_and_column(tmp_path: Path, case: str, kind: str) -> None:
    good, bad, message = BAD_ROWS[case]
    if kind == "parquet":
        path = write_parquet(tmp_path / "d.parquet", [good, bad])
    else:
        path = write_jsonl(tmp_path / "d.jsonl", [good, bad])
        message = message.replace("row 2", "line 2")
    with pytest.raises(BadInput) as err:
        load_dataset(DatasetSpec(kind=kind, path=str(path)), 0)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_jsonl_prompt_of_another_type_is_named(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [FINE, {"prompt": 7, "answer": "1"}])
    with pytest.raises(BadInput, match=r"d\.jsonl: line 2: column 'prompt' is a int; expected a non-empty string"):
        load_dataset(DatasetSpec(kind="jsonl", path=str(path)), 0)


def test_bad_files_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "not.parquet").write_text("prompt,answer\n1,2\n")
    cases = [
        (DatasetSpec(kind="parquet", path=str(tmp_path / "not.parquet")), "not.parquet: not a readable Parquet file"),
        (DatasetSpec(kind="parquet", path=str(tmp_path / "none.parquet")), "none.parquet: no such dataset file"),
        (DatasetSpec(kind="parquet", path=str(tmp_path)), "is a directory, not a dataset file"),
        (DatasetSpec(kind="parquet"), "dataset kind 'parquet' needs 'dataset.path'"),
        (
            DatasetSpec(kind="jsonl", path=str(write_jsonl(tmp_path / "l.jsonl", [[1, 2]]))),
            "line 1: expected an object",
        ),
        (DatasetSpec(kind="jsonl", path=str(write_jsonl(tmp_path / "e.jsonl", []))), "the dataset has no records"),
    ]
    for spec, message in cases:
        with pytest.raises(BadInput) as err:
            load_dataset(spec, 0)
        assert message in str(err.value) and "\n" not in str(err.value), spec


def test_run_refuses_a_bad_row_before_the_launch(tmp_path: Path) -> None:
    """`hetrl run` loads the dataset before anything starts: one line naming file, row and column, exit 2."""
    from hetrl_cli.artifacts.io import save_artifact

    from .plans import D0, GRPO_TASKS, hand_plan, on, tiny_workload

    path = write_parquet(tmp_path / "d.parquet", [FINE, {"prompt": "x", "answer": None, "ground_truth": True}])
    workload = tiny_workload(dataset={"kind": "parquet", "path": str(path)})
    save_artifact(hand_plan(workload, on(D0, GRPO_TASKS), name="single"), tmp_path / "plan.json")
    argv = [HETRL, "run", "plan.json", "--engine", "hf", "--steps", "1", "--run-dir", "run"]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == (
        f"hetrl: error: {path}: row 2: column 'ground_truth' is a bool; expected a string or a number\n"
    )
    assert not (tmp_path / "run").exists()


# ---- the chat template ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_tokenizer(tiny_dir: Path):
    from hetrl_cli.runtime.tinymodel import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_chat_prompts_use_the_template_and_plain_prompts_stay_raw(chat_tokenizer, capsys) -> None:
    chat = Record("2+2?", "4", messages=(("user", "2+2?"),))
    plain = Record("2+2?", "4")
    ids = encode_prompts(chat_tokenizer, [chat, plain])
    assert chat_tokenizer.decode(ids[0]) == "<s>user: 2+2?\nassistant:"
    assert ids[1] == chat_tokenizer("2+2?", add_special_tokens=False)["input_ids"]
    assert encode_prompts(chat_tokenizer, [chat], chat_template=False) == [ids[1]]  # the workload switch
    assert "rendered with the actor tokenizer's chat template" in capsys.readouterr().out


def test_a_tokenizer_without_a_template_tokenises_the_text_and_says_so(tiny_dir: Path, capsys) -> None:
    from hetrl_cli.runtime.tinymodel import load_tokenizer

    tokenizer = load_tokenizer(tiny_dir)
    chat = Record("2+2?", "4", messages=(("user", "2+2?"),))
    assert encode_prompts(tokenizer, [chat]) == [tokenizer("2+2?", add_special_tokens=False)["input_ids"]]
    assert "has no chat template" in capsys.readouterr().out


# ---- rewards ----------------------------------------------------------------------------------------------

REWARDS = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0 if solution_str.strip() == ground_truth else 0.0, "source": data_source,
            "index": extra_info["index"]}

def by_index(data_source, solution_str, ground_truth, extra_info):
    return extra_info["index"] / 10 if data_source == "openai/gsm8k" else -1.0

def gsm8k_style(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    return score if ground_truth in solution_str else format_score

def needs_more(data_source, solution_str, ground_truth, extra_info, tokenizer):
    return 0.0

def three(prompt, response, answer):
    return float(answer in response)
"""


@pytest.fixture
def rewards_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "user_data_rewards_t.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_data_rewards_t"


def test_verl_rewards_get_the_rows_data_source_and_extra_info(rewards_module: str) -> None:
    row = Record("q", "4", data_source="openai/gsm8k", extra_info={"index": 3})
    assert record_scorer(f"{rewards_module}:by_index")(row, "anything") == pytest.approx(0.3)
    assert record_scorer(f"{rewards_module}:by_index")(Record("q", "4", extra_info={"index": 3}), "x") == -1.0
    assert record_scorer(f"{rewards_module}:compute_score")(row, " 4 ") == 1.0  # a dict's `score`
    assert record_scorer(f"{rewards_module}:gsm8k_style")(row, "so 4") == 1.0  # verl's per-dataset functions
    assert record_scorer(f"{rewards_module}:three")(row, "it is 4") == 1.0  # (prompt, response, answer) as before
    assert record_scorer("numeric-answer")(row, "#### 4") == 1.0


def test_a_verl_reward_that_needs_more_is_one_line(rewards_module: str) -> None:
    with pytest.raises(ValueError) as err:
        load_user_reward(f"{rewards_module}:needs_more")
    assert str(err.value) == (
        f"reward {rewards_module}:needs_more: needs_more(data_source, solution_str, ground_truth, extra_info, "
        "tokenizer) needs tokenizer; verl rewards are called with (data_source, solution_str, ground_truth, "
        "extra_info)"
    )


# ---- models and paths -------------------------------------------------------------------------------------

SMALL_QWEN3 = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
"""Qwen3-0.6B's config.json shape (the built-in `qwen3-0.6b`)."""

WORKLOAD = """name: brought
algorithm: grpo
actor: {ACTOR}
prompts_per_step: 2
responses_per_prompt: 2
max_prompt_tokens: 32
max_response_tokens: 8
micro_batch: 4
precision: fp32
dataset: {kind: parquet, path: data/train.parquet}
reward_rule: numeric-answer
"""


def plan_in(tmp: Path, actor: str, name: str) -> dict:
    """`hetrl plan` (the verl baseline) of the workload in tmp/exp/, started from tmp: a folder away."""
    (tmp / "exp").mkdir(exist_ok=True)
    (tmp / "exp" / f"{name}.yaml").write_text(WORKLOAD.replace("{ACTOR}", actor))
    argv = [HETRL, "plan", str(PROFILE), "--workload", f"exp/{name}.yaml", "--solver", "verl", "-o", f"{name}.json"]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=tmp, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads((tmp / f"{name}.json").read_text())


def test_a_model_directory_is_planned_as_its_own_architecture(tmp_path: Path) -> None:
    """`actor: {path: DIR}` takes DIR/config.json's shape (here Qwen3-0.6B's): the plan predicts what the built-in
    qwen3-0.6b predicts, not what the tiny model does; the relative path is the workload file's folder's."""
    model = tmp_path / "exp" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(SMALL_QWEN3))
    from_dir = plan_in(tmp_path, "{path: model}", "dir")
    builtin = plan_in(tmp_path, "{arch: qwen3-0.6b}", "builtin")
    tiny = plan_in(tmp_path, "{arch: tiny}", "tiny")
    assert from_dir["workload"]["actor"] == {"arch": "hf", "config_path": None, "path": str(model)}
    assert from_dir["workload"]["dataset"]["path"] == str(tmp_path / "exp" / "data" / "train.parquet")
    assert from_dir["cost"]["iteration_s"] == pytest.approx(builtin["cost"]["iteration_s"], rel=1e-9)
    assert from_dir["cost"]["iteration_s"] > 10 * tiny["cost"]["iteration_s"]


def test_relative_paths_are_the_workload_files_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "w.yaml").write_text(
        "actor: {path: ../models/m, config_path: cfg/c.json}\n"
        "critic: {path: /abs/critic}\nalgorithm: ppo\nreference: {path: ~/ref}\n"
        "dataset: {kind: jsonl, path: d.jsonl}\n"
    )
    monkeypatch.chdir("/")
    workload = load_workload(tmp_path / "exp" / "w.yaml")
    assert workload.actor.path == str(tmp_path / "models" / "m")
    assert workload.actor.config_path == str(tmp_path / "exp" / "cfg" / "c.json")
    assert workload.critic is not None and workload.critic.path == "/abs/critic"
    assert workload.reference is not None and workload.reference.path == "~/ref"  # each host expands its own
    assert workload.dataset.path == str(tmp_path / "exp" / "d.jsonl")


def test_an_hf_arch_with_only_a_path_reads_its_config(tmp_path: Path) -> None:
    from hetrl_cli.artifacts.workload import ModelSpec
    from hetrl_cli.costmodel.architectures import BUILTIN, resolve

    (tmp_path / "config.json").write_text(json.dumps(SMALL_QWEN3))
    spec = ModelSpec(arch="hf", path=str(tmp_path))
    assert resolve(spec).param_count() == BUILTIN["qwen3-0.6b"].param_count()


# ---- end to end -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_parquet_chat_template_and_a_verl_reward_end_to_end(tiny_dir: Path, tmp_path: Path) -> None:
    """A verl-layout parquet file, an HF model directory (the tiny model saved with a chat template) named by a
    relative `path` only, and a verl `compute_score`: planned by `hetrl plan`, trained by `hetrl run`; every
    reward is the row's extra_info index / 10, so each step's mean is known from its prompts."""
    from hetrl_cli.runtime.tinymodel import load_tokenizer

    model = tmp_path / "exp" / "model"
    shutil.copytree(tiny_dir, model)
    tokenizer = load_tokenizer(tiny_dir)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(model)
    (tmp_path / "exp" / "data").mkdir()
    write_parquet(tmp_path / "exp" / "data" / "train.parquet", verl_rows(6))
    (tmp_path / "user_data_rewards_t.py").write_text(REWARDS)
    workload = WORKLOAD.replace("reward_rule: numeric-answer", "reward_rule: user_data_rewards_t:by_index")
    (tmp_path / "exp").mkdir(exist_ok=True)
    (tmp_path / "exp" / "w.yaml").write_text(workload.replace("{ACTOR}", "{path: model}"))
    argv = [HETRL, "plan", str(PROFILE), "--workload", "exp/w.yaml", "--solver", "verl", "-o", "plan.json"]
    planned = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert planned.returncode == 0, planned.stderr[-2000:]
    argv = [HETRL, "run", "plan.json", "--steps", "2", "--engine", "hf", "--run-dir", "run", "--allow-user-reward",
            "--timeout", "5m"]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dataset: chat prompts rendered with the actor tokenizer's chat template" in result.stderr
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    records = load_dataset(DatasetSpec(kind="parquet", path=str(tmp_path / "exp" / "data" / "train.parquet")), 0)
    for line in lines:
        batch = step_records(records, line["step"], 2, seed=0)
        expected = sum(r.extra_info["index"] / 10 for r in batch) / len(batch)
        assert line["reward_mean"] == pytest.approx(expected, abs=1e-6), line["step"]


@pytest.mark.slow
def test_multihost_preflight_maps_the_dataset_on_every_host(sshd_hosts, tmp_path: Path) -> None:
    """Each host loads the parquet file with the workload's column keys, and names a bad row in its report."""
    from .plans import run_two_hosts, tiny_workload, two_host_plan

    rows = [{"q": {"text": "1+1?"}, "answer": "2"}, {"q": {"text": None}, "answer": "4"}]
    path = write_parquet(tmp_path / "data.parquet", rows)
    dataset = {"kind": "parquet", "path": str(path), "prompt_key": "q.text"}
    d0, d1 = two_host_plan(sshd_hosts, tiny_workload(dataset=dataset), tmp_path)
    result = run_two_hosts(sshd_hosts, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "preflight failed on 2 of 2 hosts; nothing launched" in result.stderr
    for host in (d0, d1):
        expected = f"  {host.rsplit('/', 1)[0]}: {path}: row 2: no prompt column (looked for 'q.text')"
        assert expected in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "run").exists()
