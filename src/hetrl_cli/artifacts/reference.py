"""The workload file's reference (docs/workload.md), generated from the model's own field docs.

Each field's docstring is the one place that says what it means and what it changes in the plan and the run,
so the reference cannot drift from the code: tests/test_workload_reference.py checks that docs/workload.md is
exactly what `workload_reference()` prints and that every field has a docstring. Regenerate with
`python -m hetrl_cli.artifacts.reference > docs/workload.md` (or `make docs`).
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from hetrl_cli.artifacts.workload import Workload

HEADER = """# Workload reference

A workload file (YAML or JSON) says what RL job to plan and run. Every field is optional: the defaults are the
built-in workload (Qwen3-8B GRPO) that `hetrl plan` uses when no `--workload` is given. Unknown fields are errors;
numbers must be finite numbers (no `true` for 1, no `.inf`). Generated from the code's field docs
(`src/hetrl_cli/artifacts/workload.py`): edit those, then `make docs`.

```yaml
algorithm: ppo          # or grpo
mode: async             # or sync
actor: {arch: qwen3-8b}
critic: {arch: qwen3-8b}
prompts_per_step: 64
responses_per_prompt: 4
rl: {lr: 1.0e-6, kl_coef: 0.001}
```
"""


def _type_name(annotation: Any) -> str:
    """A short, readable type: `int`, `bf16 | fp16 | fp32`, `ModelSpec or none`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        named = [_type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(named) + (" or none" if type(None) in args else "")
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def _default(info: Any) -> str:
    if info.default_factory is not None:
        value = info.default_factory()
        if isinstance(value, BaseModel):
            return "see below" if value.model_dump(exclude_defaults=True) == {} else f"`{value.model_dump()}`"
        return f"`{json.dumps(value)}`"
    if info.default is PydanticUndefined:
        return "required"
    return f"`{json.dumps(info.default)}`"


def _bounds(info: Any) -> str:
    parts = []
    for item in info.metadata:
        for name, word in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(item, name, None)
            if value is not None:
                parts.append(f"{word} {value}")
    return ", ".join(parts)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    args = typing.get_args(annotation) or (annotation,)
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def undocumented_fields(model: type[BaseModel] = Workload, prefix: str = "") -> list[str]:
    """Dotted names of fields (nested models included) without a docstring."""
    out = []
    for name, info in model.model_fields.items():
        if not (info.description or "").strip():
            out.append(prefix + name)
        for sub in _models_in(info.annotation):
            out += undocumented_fields(sub, f"{prefix}{name}.")
    return out


def _section(model: type[BaseModel], title: str) -> list[str]:
    """A table of `model`'s fields, then one section per nested model (named by the fields that hold it)."""
    lines = [f"## {title}", "", (model.__doc__ or "").strip(), "", "| field | type | default | meaning |",
             "|---|---|---|---|"]  # fmt: skip
    holders: dict[type[BaseModel], list[str]] = {}
    for name, info in model.model_fields.items():
        kind = _type_name(info.annotation)
        bounds = _bounds(info)
        doc = " ".join((info.description or "").split()).replace("|", "\\|")
        lines.append(f"| `{name}` | {kind}{f' ({bounds})' if bounds else ''} | {_default(info)} | {doc} |")
        for sub in _models_in(info.annotation):
            holders.setdefault(sub, []).append(f"`{name}`")
    lines.append("")
    for sub, names in holders.items():
        lines += _section(sub, f"{sub.__name__}: {', '.join(names)}")
    return lines


def workload_reference() -> str:
    """docs/workload.md, whole."""
    return HEADER + "\n" + "\n".join(_section(Workload, "Workload")).rstrip() + "\n"


if __name__ == "__main__":
    print(workload_reference(), end="")
