"""YAML from untrusted files (workloads, cluster.yaml, --links), parsed with limits.

PyYAML's safe loader shares a node each alias names, so ten lines of anchors ("billion laughs") load as a
small object that expands to 10^9 values once anything walks it: `json.dumps`, pydantic, a printer. The
document is composed first, its size counted as if every alias were expanded, and refused above
MAX_YAML_NODES before anything is built; an alias to itself (a cycle) is refused too.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from hetrl_cli.errors import BadInput

MAX_YAML_NODES = 200_000
"""Values a YAML input may hold with its aliases expanded: a 1,000-host cluster.yaml is a few thousand."""
MAX_YAML_CHARS = 16 * 2**20
"""The artifact size limit (artifacts/io.py MAX_ARTIFACT_CHARS) for YAML too."""


def load_yaml_text(text: str, where: str, loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> Any:
    """`yaml.load(text, loader)` for one document, refusing (BadInput) input too large, too deep, or whose
    aliases expand beyond MAX_YAML_NODES. YAML syntax errors propagate as yaml.YAMLError for the caller's
    message (it knows what the file is)."""
    if len(text) > MAX_YAML_CHARS:
        raise BadInput(f"{where}: {len(text) / 2**20:.0f} MiB is more than an input file may be (16 MiB)")
    parser = loader(text)
    try:
        node = parser.get_single_node()
        if node is None:
            return None
        check_expansion(node, where)
        data = parser.construct_document(node)
        check_numbers(data, where)
        return data
    except RecursionError:
        raise BadInput(f"{where}: nested too deeply; write at most a few hundred levels") from None
    except ValueError as exc:  # int() of a scalar over Python's 4,300-digit limit
        if "digits" not in str(exc):
            raise
        raise BadInput(f"{where}: a number has too many digits; write at most a few hundred") from None
    finally:
        parser.dispose()


MAX_INT = 10**300
"""Larger integers overflow a float field into inf (artifacts/io.py MAX_DIGITS for JSON)."""


def check_numbers(data: Any, where: str) -> None:
    """Refuse .inf, .nan and integers beyond 64 bits anywhere in loaded YAML data (as JSON artifacts do): no
    field wants them, and they overflow the arithmetic downstream. Iterative; `data` is bounded already."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise BadInput(f"{where}: a number is inf or NaN; write a finite number")
        elif isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value <= MAX_INT:
            raise BadInput(f"{where}: a number has too many digits (at most 300)")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_expansion(root: yaml.Node, where: str) -> None:
    """Count the nodes of `root` as if every alias were expanded (shared nodes counted once per use, each
    size computed once), without recursion; BadInput above MAX_YAML_NODES or on a cycle."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > MAX_YAML_NODES:
                raise BadInput(
                    f"{where}: its anchors and aliases expand to more than {MAX_YAML_NODES:,} values "
                    "(a YAML bomb?); write the values out or use fewer aliases"
                )
            continue
        if key in sizes:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                line = child.start_mark.line + 1
                raise BadInput(f"{where}: an alias refers to a value that contains it (line {line}); write it out")
            if id(child) not in sizes:
                stack.append((child, False))
