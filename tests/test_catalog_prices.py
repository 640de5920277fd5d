"""GPU-hour prices (issue 24, item 5): the catalog's published on-demand prices with their sources, the
per-node-group override in cluster.yaml, and what the profile carries (not in the fingerprint)."""

from __future__ import annotations

import re

import pytest

from hetrl_cli.errors import BadInput
from hetrl_cli.profiling.catalog import gpu_spec, load_catalog, profile_from_cluster

LAN = {"bandwidth": "100Gbps", "latency": "0.1ms"}


def spec(groups: list[dict]) -> dict:
    return {"name": "p", "node_groups": groups, "network": {"intra_region": LAN, "inter_region": {"default": LAN}}}


def test_every_catalog_price_says_where_and_when_it_was_read() -> None:
    priced = [g for g in load_catalog().gpus if g.price is not None]
    assert {g.name for g in priced} >= {"H200", "H100 SXM", "A100 80GB", "A100 40GB", "A10G"}
    for gpu in priced:
        p = gpu.price
        assert p.url.startswith("https://") and re.fullmatch(r"20\d\d-\d\d-\d\d", p.date)
        assert p.provider and p.instance and p.region and p.gpus_per_instance >= 1
    assert gpu_spec("h100").price.usd_per_gpu_hour == pytest.approx(55.04 / 8)  # AWS p5.48xlarge, us-east-1
    assert gpu_spec("a100-80gb").price.usd_per_gpu_hour == pytest.approx(27.44705 / 8)  # AWS p4de.24xlarge
    assert gpu_spec("l40s").price is None  # none found: unknown, never guessed


def test_profile_carries_catalog_or_node_group_prices_outside_the_fingerprint() -> None:
    groups = [{"gpu": "H100", "gpus_per_node": 2}, {"gpu": "L4", "gpus_per_node": 1, "region": "b"}]
    plain = profile_from_cluster(spec(groups))
    by_id = {d.id: d for d in plain.devices}
    assert by_id["h100-0/1"].price_per_gpu_hour == pytest.approx(6.88)
    assert "p5.48xlarge" in by_id["h100-0/1"].price_source and "2026-11-09" in by_id["h100-0/1"].price_source
    assert by_id["l4-0/0"].price_per_gpu_hour is None and by_id["l4-0/0"].price_source is None
    groups[1]["price_per_gpu_hour"] = 0.8
    groups[0]["price_per_gpu_hour"] = 2.5  # a contract price overrides the list price
    over = {d.id: d for d in profile_from_cluster(spec(groups)).devices}
    assert (over["h100-0/0"].price_per_gpu_hour, over["l4-0/0"].price_per_gpu_hour) == (2.5, 0.8)
    assert over["l4-0/0"].price_source == "cluster.yaml node_groups.1.price_per_gpu_hour"
    assert profile_from_cluster(spec(groups)).fingerprint == plain.fingerprint


@pytest.mark.parametrize("bad", [-1, "cheap", float("nan"), float("inf")])
def test_bad_prices_are_one_line(bad) -> None:
    with pytest.raises(BadInput, match=r"node_groups\.0\.price_per_gpu_hour") as err:
        profile_from_cluster(spec([{"gpu": "H100", "gpus_per_node": 1, "price_per_gpu_hour": bad}]))
    assert "\n" not in str(err.value)


def test_docs_price_table_matches_the_catalog() -> None:
    from pathlib import Path

    docs = (Path(__file__).parent.parent / "docs" / "catalog.md").read_text(encoding="utf-8")
    for gpu in load_catalog().gpus:
        p = gpu.price
        if p is None:
            row = f"| {gpu.name} | unknown | — | — | — | none found |"
        else:
            row = (
                f"| {gpu.name} | {p.usd_per_gpu_hour:.4g} | {p.instance}: {p.instance_usd_per_hour} $/h ÷ "
                f"{p.gpus_per_instance} | {p.provider}, {p.region} | {p.date} | <{p.url}> |"
            )
        assert row in docs, row


@pytest.mark.parametrize(("field", "value"), [("price_per_gpu_hour", -1), ("price_source", "x" * 600)])
def test_hostile_prices_in_a_profile_are_one_line(tmp_path, field: str, value) -> None:
    import json

    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.profile import ClusterProfile

    data = json.loads(profile_from_cluster(spec([{"gpu": "H100", "gpus_per_node": 1}])).model_dump_json())
    data["devices"][0][field] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match=field) as err:
        load_artifact(str(path), ClusterProfile)
    assert "\n" not in str(err.value)
