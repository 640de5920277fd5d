"""`hetrl profile --catalog`: the datasheet catalog, cluster.yaml validation, the shipped paper profiles."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from itertools import combinations
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import dump_artifact, load_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.errors import BadInput
from hetrl_cli.profiling.catalog import (
    ClusterSpec,
    gpu_spec,
    load_catalog,
    parse_catalog,
    profile_from_cluster,
    profile_from_cluster_file,
    synthetic_cluster,
)

HETRL = str(Path(sys.executable).with_name("hetrl"))
PROFILES = Path(__file__).resolve().parent.parent / "profiles"
SCENARIOS = ("paper-single-region", "paper-multi-region-hybrid", "paper-multi-country", "paper-multi-continent")
GBPS = 1e9 / 8  # bytes/s in one Gbit/s
MS = 1e-3
A100, L40S, L4 = "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA L4"


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HETRL, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def without_timestamp(text: str) -> dict:
    data = json.loads(text)
    data.pop("created_at")
    return data


@pytest.fixture(scope="module")
def paper() -> dict[str, ClusterProfile]:
    return {name: load_artifact(PROFILES / f"{name}.json", ClusterProfile) for name in SCENARIOS}


# --- the GPU catalog ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["H200", "H100 SXM", "H100 PCIe", "A100 40GB", "A100 80GB", "L40S", "L4", "A10G", "V100", "T4", "RTX 4090"],
)
def test_catalog_has_the_common_gpus_with_a_source(name: str) -> None:
    spec = gpu_spec(name)
    assert spec.name == name
    assert "NVIDIA" in spec.source
    assert spec.memory_gbps > 0 and spec.memory_bytes > 0 and spec.peak_tflops["fp32"] > 0


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("a100-80gb", "A100 80GB"),
        ("A100 80GB", "A100 80GB"),
        ("a100", "A100 80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("a100_40gb", "A100 40GB"),
        ("h100", "H100 SXM"),
        ("h100-pcie", "H100 PCIe"),
        ("l40s", "L40S"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ],
)
def test_lookup_is_case_insensitive_with_aliases_and_driver_names(query: str, name: str) -> None:
    assert gpu_spec(query).name == name


def test_figures_are_dense_datasheet_numbers() -> None:
    assert gpu_spec("A100 80GB").peak_tflops == {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}
    assert gpu_spec("H100 SXM").peak_tflops["bf16"] == 989.5  # 1979 "with sparsity" on the datasheet
    assert gpu_spec("L40S").peak_tflops["bf16"] == 362.05
    assert gpu_spec("L4").peak_tflops["bf16"] == 121
    assert gpu_spec("A100 80GB").memory_bytes == 80 * 2**30
    assert gpu_spec("A100 40GB").memory_gbps == 1555


@pytest.mark.parametrize("name", ["V100", "T4"])
def test_gpus_without_bf16_carry_no_bf16_figure(name: str) -> None:
    spec = gpu_spec(name)
    assert not spec.bf16
    assert "bf16" not in spec.peak_tflops
    assert spec.peak_tflops["fp16"] > spec.peak_tflops["fp32"]


def test_docs_table_matches_the_catalog() -> None:
    docs = (PROFILES.parent / "docs" / "catalog.md").read_text(encoding="utf-8")
    catalog = load_catalog()

    def cell(value: float | None) -> str:
        return "—" if value is None else f"{value:g}"

    for gpu in catalog.gpus:
        tflops = [cell(gpu.peak_tflops.get(dtype)) for dtype in ("bf16", "fp16", "tf32", "fp32")]
        link = catalog.interconnects[gpu.interconnect]
        row = (
            f"| {gpu.name} | {gpu.device_name} | {gpu.memory_gib:g} GiB {gpu.memory_type} | {gpu.memory_gbps:g} | "
            f"{' | '.join(tflops)} | {gpu.interconnect} ({link.bandwidth_GBps:g} GB/s) | {gpu.source} |"
        )
        assert row in docs


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(BadInput) as err:
        gpu_spec("A200")
    assert str(err.value) == f"unknown GPU type 'A200'; known types: {', '.join(load_catalog().names())}"


def test_catalog_rejects_an_alias_used_twice() -> None:
    entry = (
        "  - {{name: {n}, device_name: {n}, aliases: [same], prefix: x, memory_gib: 1, memory_type: x, "
        "memory_gbps: 1, peak_tflops: {{fp32: 1}}, bf16: false, compute_capability: '1', interconnect: p, "
        "source: s}}\n"
    )
    text = (
        "interconnects: {p: {kind: pcie, bandwidth_GBps: 1, latency_us: 1, source: s}}\ngpus:\n"
        + entry.format(n="A")
        + entry.format(n="B")
    )
    with pytest.raises(BadInput, match="name 'same' is used by both A and B"):
        parse_catalog(text, "cat.yaml")


# --- the shipped paper profiles -----------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_paper_cluster_is_24_a100_24_l40s_16_l4_on_8_hosts(paper: dict[str, ClusterProfile], scenario: str) -> None:
    profile = paper[scenario]
    assert Counter(d.name for d in profile.devices) == {A100: 24, L40S: 24, L4: 16}
    assert [h.name for h in profile.hosts] == [
        "a100-0",
        "a100-1",
        "a100-2",
        "l40s-0",
        "l40s-1",
        "l40s-2",
        "l4-0",
        "l4-1",
    ]
    assert profile.method == "catalog"
    assert profile.fingerprint == profile.compute_fingerprint()
    assert all(d.kind == "cuda" and not d.measured_tflops for d in profile.devices)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_host_pair_has_exactly_one_link_of_the_right_kind(
    paper: dict[str, ClusterProfile], scenario: str
) -> None:
    profile = paper[scenario]
    pairs = Counter(frozenset((lk.a, lk.b)) for lk in profile.links)
    assert set(pairs) == {frozenset(p) for p in combinations([h.name for h in profile.hosts], 2)}
    assert set(pairs.values()) == {1}
    for link in profile.links:
        cross = profile.host(link.a).region != profile.host(link.b).region
        assert link.kind == ("wan" if cross else "lan")
        assert link.source == "catalog"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_intra_node_links_come_from_the_catalog(paper: dict[str, ClusterProfile], scenario: str) -> None:
    for host in paper[scenario].hosts:
        assert host.intra_link is not None
        expected = ("nvlink", 300e9) if host.name.startswith("a100") else ("pcie", 32e9)
        assert (host.intra_link.kind, host.intra_link.bandwidth_Bps) == expected


def test_single_region_is_one_region_of_100gbps_lan(paper: dict[str, ClusterProfile]) -> None:
    profile = paper["paper-single-region"]
    assert {h.region for h in profile.hosts} == {"us-east-1"}
    assert {(lk.kind, lk.bandwidth_Bps, lk.latency_s) for lk in profile.links} == {("lan", 100 * GBPS, 0.1 * MS)}


def test_hybrid_has_5gbps_10ms_between_regions_and_1gbps_edge(paper: dict[str, ClusterProfile]) -> None:
    profile = paper["paper-multi-region-hybrid"]
    for link in profile.links:
        ends = {link.a.split("-")[0], link.b.split("-")[0]}
        if link.kind == "lan":
            assert (link.bandwidth_Bps, link.latency_s) == (100 * GBPS, 0.1 * MS)
        elif "l4" in ends:  # the L4 nodes sit at the edge
            assert (link.bandwidth_Bps, link.latency_s) == (1 * GBPS, 10 * MS)
        else:
            assert ends == {"a100", "l40s"}
            assert (link.bandwidth_Bps, link.latency_s) == (5 * GBPS, 10 * MS)
    assert profile.link_map()[frozenset(("l4-0", "l4-1"))].kind == "lan"


@pytest.mark.parametrize(
    ("scenario", "latency_ms", "bandwidth_gbps"),
    [("paper-multi-country", (5, 30), (0.9, 5)), ("paper-multi-continent", (5, 60), (0.9, 5))],
)
def test_wan_figures_span_the_papers_range(
    paper: dict[str, ClusterProfile],
    scenario: str,
    latency_ms: tuple[float, float],
    bandwidth_gbps: tuple[float, float],
) -> None:
    wan = [lk for lk in paper[scenario].links if lk.kind == "wan"]
    latencies = sorted(lk.latency_s / MS for lk in wan)
    bandwidths = sorted(lk.bandwidth_Bps / GBPS for lk in wan)
    assert (latencies[0], latencies[-1]) == pytest.approx(latency_ms)  # both ends of the range are used
    assert bandwidth_gbps[0] <= bandwidths[0] and bandwidths[-1] <= bandwidth_gbps[1]
    assert len({h.region for h in paper[scenario].hosts}) == 4


def test_multi_continent_uses_the_whole_bandwidth_range(paper: dict[str, ClusterProfile]) -> None:
    wan = [lk.bandwidth_Bps / GBPS for lk in paper["paper-multi-continent"].links if lk.kind == "wan"]
    assert (min(wan), max(wan)) == pytest.approx((0.9, 5.0))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_shipped_json_is_what_the_cli_writes(tmp_path: Path, scenario: str) -> None:
    out = tmp_path / f"{scenario}.json"
    result = run_cli("profile", "--catalog", str(PROFILES / f"{scenario}.yaml"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    shipped = (PROFILES / f"{scenario}.json").read_text(encoding="utf-8")
    assert without_timestamp(out.read_text(encoding="utf-8")) == without_timestamp(shipped)


def test_cli_json_output_is_the_profile() -> None:
    result = run_cli("profile", "--catalog", str(PROFILES / "paper-single-region.yaml"), "--json", "--name", "x")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["kind"], data["name"], len(data["devices"])) == ("cluster-profile", "x", 64)


def test_cli_bad_cluster_file_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("node_groups:\n  - {gpu: A200, gpus_per_node: 8}\n")
    result = run_cli("profile", "--catalog", str(path), "-o", str(tmp_path / "out.json"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"hetrl: error: {path}: field 'node_groups.0.gpu': unknown GPU type 'A200';")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists()


# --- cluster.yaml validation --------------------------------------------------------------------------------

TWO_L4 = "node_groups:\n  - {gpu: L4, gpus_per_node: 8, nodes: 2}\n"
WITH_OVERRIDE = "network: {intra_region: {bandwidth: 100Gbps, latency: 0.1ms}, overrides: [%s]}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty cluster file: add 'node_groups:' with at least one group (docs/catalog.md)"),
        ("- a\n", "expected a mapping with 'node_groups' and 'network', got list"),
        ("node_groups: []\n", "field 'node_groups': List should have at least 1 item after validation, not 0"),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8, nodes: -1}\n",
            "field 'node_groups.0.nodes': Input should be greater than 0",
        ),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 0}\n",
            "field 'node_groups.0.gpus_per_node': Input should be greater than 0",
        ),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8, gpus: 3}\n",
            "field 'node_groups.0.gpus': Extra inputs are not permitted",
        ),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8}\nnode_groups: []\n",
            ":3: not valid YAML: duplicate key 'node_groups'",
        ),
        ("node_groups: [\n", ":2: not valid YAML: expected the node content, but found '<stream end>'"),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8, nodes: 2}\nnetwork: {intra_region: {bandwidth: 100, "
            "latency: 1ms}}\n",
            "field 'network.intra_region.bandwidth': Value error, write the bandwidth as text with its unit, "
            "e.g. '5Gbps'",
        ),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8, nodes: 2}\nnetwork: {intra_region: {bandwidth: fast, "
            "latency: 1ms}}\n",
            "field 'network.intra_region.bandwidth': bad bandwidth 'fast': expected "
            '"5Gbps", "100Mbps", "25 GB/s" or a number of bytes/s',
        ),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8, nodes: 2}\n",
            "field 'network.intra_region': hosts l4-0 and l4-1 share region 'default': give network.intra_region, "
            "e.g. {bandwidth: 100Gbps, latency: 0.1ms}",
        ),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8, region: a}\n  - {gpu: L4, gpus_per_node: 8, region: b}\n",
            "field 'network.inter_region': no link between regions 'a' and 'b': "
            "add network.inter_region.default or a pair for them",
        ),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8, region: a}\n  - {gpu: L4, gpus_per_node: 8, region: b}\n"
            "network:\n  inter_region:\n    pairs:\n      - {regions: [a, b], bandwidth: 1Gbps, latency: 1ms}\n"
            "      - {regions: [b, a], bandwidth: 2Gbps, latency: 1ms}\n",
            "field 'network.inter_region.pairs.1.regions': region pair b<->a is listed twice",
        ),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8, region: a}\n  - {gpu: L4, gpus_per_node: 8, region: b}\n"
            "network:\n  inter_region:\n    pairs:\n      - {regions: [a, c], bandwidth: 1Gbps, latency: 1ms}\n",
            "field 'network.inter_region.pairs.0.regions': no node group is in region 'c'; regions in use: a, b",
        ),
        (
            "node_groups:\n  - {gpu: L4, gpus_per_node: 8}\n"
            "network: {inter_region: {default: {bandwidth: 5Gbps, latency: soon}}}\n",
            "field 'network.inter_region.default.latency': bad latency 'soon': expected "
            '"10ms", "50us", "0.01s" or a number of seconds',
        ),
        (
            TWO_L4 + WITH_OVERRIDE % "{between: [l40s, '*'], bandwidth: 1Gbps}",
            "field 'network.overrides.0.between': 'l40s' is no host name or prefix; prefixes: l4",
        ),
        (
            TWO_L4 + WITH_OVERRIDE % "{between: [l4, '*'], scope: inter-region, bandwidth: 1Gbps}",
            "field 'network.overrides.0': matches no host pair (between 'l4' and '*', scope inter-region)",
        ),
        (
            TWO_L4 + WITH_OVERRIDE % "{between: [l4, '*']}",
            "field 'network.overrides.0': Value error, give a bandwidth, a latency or both",
        ),
    ],
)
def test_bad_cluster_file_is_one_exact_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(BadInput) as err:
        profile_from_cluster_file(path)
    separator = "" if message.startswith(":") else ": "
    assert str(err.value) == f"{path}{separator}{message}"


def test_missing_cluster_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"nope\.yaml: no such file"):
        profile_from_cluster_file(tmp_path / "nope.yaml")


# --- building rules -----------------------------------------------------------------------------------------


def test_prefix_numbering_continues_across_groups_and_names_default_to_the_stem(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text(
        "node_groups:\n  - {gpu: l4, gpus_per_node: 2, region: a}\n  - {gpu: l4, gpus_per_node: 2, region: b}\n"
        "  - {gpu: t4, gpus_per_node: 1, region: c, name_prefix: edge}\n"
        "network:\n  inter_region: {default: {bandwidth: 1Gbps, latency: 20ms}}\n"
    )
    profile = profile_from_cluster_file(path)
    assert profile.name == "lab"
    assert [(h.name, h.region) for h in profile.hosts] == [("l4-0", "a"), ("l4-1", "b"), ("edge-0", "c")]
    assert [d.id for d in profile.devices] == ["l4-0/0", "l4-0/1", "l4-1/0", "l4-1/1", "edge-0/0"]
    assert profile.host("edge-0").intra_link is None  # one GPU: nothing inside to link
    assert profile_from_cluster_file(path, name="other").name == "other"


def test_overrides_change_only_what_they_give_and_later_ones_win() -> None:
    spec = {
        "name": "o",
        "node_groups": [
            {"gpu": "A100 80GB", "gpus_per_node": 8, "nodes": 2, "intra_link": {"latency": "3us"}},
            {"gpu": "L4", "gpus_per_node": 8, "region": "edge"},
        ],
        "network": {
            "intra_region": {"bandwidth": "100Gbps", "latency": "0.1ms"},
            "inter_region": {"default": {"bandwidth": "5Gbps", "latency": "10ms"}},
            "overrides": [
                {"between": ["l4", "*"], "latency": "20ms"},
                {"between": ["a100-1", "l4-0"], "bandwidth": "1Gbps"},
            ],
        },
    }
    links = profile_from_cluster(spec).link_map()
    assert (links[frozenset(("a100-0", "l4-0"))].bandwidth_Bps, links[frozenset(("a100-0", "l4-0"))].latency_s) == (
        5 * GBPS,
        20 * MS,
    )
    assert links[frozenset(("a100-1", "l4-0"))].bandwidth_Bps == 1 * GBPS
    assert links[frozenset(("a100-0", "a100-1"))].latency_s == 0.1 * MS
    intra = profile_from_cluster(ClusterSpec.model_validate(spec)).host("a100-0").intra_link
    assert intra is not None and (intra.bandwidth_Bps, intra.latency_s) == (300e9, 3e-6)


def test_cluster_spec_in_code_needs_a_name() -> None:
    with pytest.raises(BadInput, match="no name"):
        profile_from_cluster({"node_groups": [{"gpu": "L4", "gpus_per_node": 1}]})


def test_v100_profile_notes_the_missing_bf16() -> None:
    profile = profile_from_cluster({"node_groups": [{"gpu": "v100", "gpus_per_node": 8}]}, "v")
    assert "bf16" not in profile.devices[0].peak_tflops
    assert "V100 has no bf16 hardware: no bf16 figure (plan it with fp16)" in profile.notes


# --- the synthetic scale family -----------------------------------------------------------------------------


@pytest.mark.parametrize("n_devices", [8, 16, 64, 256, 1024])
def test_synthetic_cluster_has_the_size_the_mix_and_wan_links(n_devices: int) -> None:
    profile = synthetic_cluster(n_devices, seed=1)
    hosts = len(profile.hosts)
    assert len(profile.devices) == n_devices
    assert {d.name for d in profile.devices} == {A100, L40S, L4}
    assert len(profile.links) == hosts * (hosts - 1) // 2
    assert len({frozenset((lk.a, lk.b)) for lk in profile.links}) == len(profile.links)
    assert len({h.region for h in profile.hosts}) >= 2
    wan = [lk for lk in profile.links if lk.kind == "wan"]
    assert wan and all(5 * MS <= lk.latency_s <= 60 * MS and 0.9 * GBPS <= lk.bandwidth_Bps <= 5 * GBPS for lk in wan)


def test_synthetic_cluster_is_deterministic_per_seed() -> None:
    first, again, other = synthetic_cluster(64, 7), synthetic_cluster(64, 7), synthetic_cluster(64, 8)
    assert without_timestamp(dump_artifact(first)) == without_timestamp(dump_artifact(again))
    assert without_timestamp(dump_artifact(first))["links"] != without_timestamp(dump_artifact(other))["links"]


def test_synthetic_cluster_refuses_no_devices() -> None:
    with pytest.raises(BadInput, match="n_devices must be positive, got 0"):
        synthetic_cluster(0, 0)


def test_every_error_of_a_cluster_file_in_one_line(tmp_path: Path) -> None:
    """A hand-written file is fixed in one round: all schema errors, and all unknown GPU types, at once."""
    path = tmp_path / "cluster.yaml"
    path.write_text("node_groups:\n  - {gpu: L4, gpus_per_node: 0}\n  - {gpu: L4, gpus_per_node: 8, nodez: 2}\n")
    with pytest.raises(BadInput) as err:
        profile_from_cluster_file(path)
    assert str(err.value) == (
        f"{path}: field 'node_groups.0.gpus_per_node': Input should be greater than 0; "
        "field 'node_groups.1.nodez': Extra inputs are not permitted"
    )
    path.write_text("node_groups:\n  - {gpu: L5, gpus_per_node: 8}\n  - {gpu: Z9, gpus_per_node: 8}\n")
    with pytest.raises(BadInput) as err:
        profile_from_cluster_file(path)
    assert str(err.value) == (
        f"{path}: field 'node_groups.0.gpu': unknown GPU type 'L5'; field 'node_groups.1.gpu': unknown GPU type "
        f"'Z9'; known types: {', '.join(load_catalog().names())}"
    )
