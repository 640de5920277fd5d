"""docs/workload.md is generated from the workload model's field docs, so it cannot drift from the code."""

from __future__ import annotations

from pathlib import Path

from hetrl_cli.artifacts.reference import undocumented_fields, workload_reference
from hetrl_cli.artifacts.workload import Workload

DOC = Path(__file__).resolve().parent.parent / "docs" / "workload.md"


def test_every_workload_field_has_a_docstring() -> None:
    assert undocumented_fields() == []


def test_docs_workload_md_is_the_generated_reference() -> None:
    assert DOC.read_text() == workload_reference(), "run `make docs` and commit docs/workload.md"


def test_the_reference_names_every_field_with_its_default() -> None:
    text = workload_reference()
    for name in Workload.model_fields:
        assert f"| `{name}` |" in text
    assert "| `micro_batch` | int (> 0) | `8` |" in text
    assert "| `lr` | float (> 0) | `1e-05` |" in text
