"""Prices on profiles made over SSH and on emulated clusters (issue 24, item 5): a probed GPU the catalog knows
gets the catalog's list price with a source that says so, hosts.txt's `price=` overrides it, and an emulate
spec carries prices as cluster.yaml does (written into its hosts.txt)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hetrl_cli.artifacts.hosts import parse_hosts_text
from hetrl_cli.artifacts.io import load_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.emulate.api import price_option
from hetrl_cli.emulate.spec import parse_spec_text
from hetrl_cli.errors import BadInput
from hetrl_cli.profiling.catalog import gpu_spec
from hetrl_cli.profiling.remote import HostRun, build_host
from sshd import SshdHosts

Hetrl = Callable[..., "subprocess.CompletedProcess[str]"]

H100 = {
    "index": 0,
    "kind": "cuda",
    "name": "NVIDIA H100 80GB HBM3",  # what NVML reports for an H100 SXM
    "memory_bytes": 80 << 30,
    "memory_gbps": 3000.0,
    "peak_tflops": {"bf16": 989.0},
}
L4 = {**H100, "index": 1, "name": "NVIDIA L4", "memory_bytes": 24 << 30, "memory_gbps": 300.0}


def _probed(line: str, devices: list[dict]) -> list:
    [entry] = parse_hosts_text(line, "hosts.txt")
    facts = {"hostname": "gpu-a", "devices": devices, "cpu_count": 8, "memory_bytes": 1 << 36}
    return build_host(HostRun(entry, facts=facts))[1]


def test_a_probed_catalog_gpu_gets_the_catalog_price_marked_as_the_catalogs() -> None:
    h100, l4 = _probed("gpu-a\n", [H100, L4])
    assert h100.price_per_gpu_hour == pytest.approx(gpu_spec("H100 SXM").price.usd_per_gpu_hour)
    assert h100.price_source.startswith("catalog: AWS p5.48xlarge")
    assert (l4.price_per_gpu_hour, l4.price_source) == (None, None)  # the catalog has no L4 price: unknown


def test_hosts_txt_price_overrides_the_catalog_and_prices_any_device() -> None:
    h100, l4 = _probed("gpu-a price=2.25\n", [H100, L4])
    assert (h100.price_per_gpu_hour, l4.price_per_gpu_hour) == (2.25, 2.25)
    assert h100.price_source == "hosts.txt hosts.txt:1 price="


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "two", "1e400"])
def test_a_bad_hosts_txt_price_is_one_line(value: str) -> None:
    with pytest.raises(BadInput, match=rf"^hosts.txt:1: price='{value}': expected US dollars per device-hour"):
        parse_hosts_text(f"gpu-a price={value}\n", "hosts.txt")


@pytest.mark.slow
def test_ssh_profile_records_hosts_txt_prices(hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path) -> None:
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(sshd_hosts.hosts_line("127.0.0.2", "price=0.5") + sshd_hosts.hosts_line("127.0.0.3"))
    out = tmp_path / "p.json"
    args = ("profile", hosts_file, "--known-hosts", sshd_hosts.known_hosts, "--timeout", "60", "-o", out)
    result = hetrl(*args)
    assert result.returncode == 0, result.stderr
    profile = load_artifact(out, ClusterProfile)
    prices = {d.host: (d.price_per_gpu_hour, d.price_source) for d in profile.devices}
    assert prices == {
        f"127.0.0.2:{sshd_hosts.port}": (0.5, f"hosts.txt {hosts_file}:1 price="),
        f"127.0.0.3:{sshd_hosts.port}": (None, None),  # a CPU: no catalog price
    }


def test_emulate_spec_prices_reach_hosts_txt() -> None:
    spec = parse_spec_text(
        "hosts: [{name: a, region: r, cpu: 1, price_per_gpu_hour: 0.4}, {name: b, region: r, cpu: 1}]", "s.yaml"
    )
    a, b = spec.hosts
    assert (a.price_per_gpu_hour, b.price_per_gpu_hour) == (0.4, None)
    assert price_option(b) == ""
    [entry] = parse_hosts_text(f"root@10.0.0.2:22 region=r{price_option(a)}  # host a\n", "hosts.txt")
    assert entry.price == 0.4


def test_emulate_spec_refuses_a_negative_price() -> None:
    with pytest.raises(BadInput, match=r"^s.yaml: field 'hosts.0.price_per_gpu_hour'"):
        parse_spec_text("hosts: [{name: a, region: r, cpu: 1, price_per_gpu_hour: -1}]", "s.yaml")
