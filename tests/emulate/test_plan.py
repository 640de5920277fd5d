"""What `up` will make, computed without making it: htb classes per host, CPU periods the kernel accepts, which
CPUs each host is pinned to."""

from __future__ import annotations

import pytest

from hetrl_cli.emulate.api import host_cpu_sets, pack_cpus, shaping_plan
from hetrl_cli.emulate.cgroups import effective_period_us
from hetrl_cli.emulate.netns import Shaping, veth_name
from hetrl_cli.emulate.spec import parse_spec_text
from hetrl_cli.errors import BadInput

SPEC = """
hosts:
  - {name: a1, region: a, cpu: 1}
  - {name: a2, region: a, cpu: 1}
  - {name: b1, region: b, cpu: 1}
  - {name: c1, region: c, cpu: 1}
links:
  - {a: a, b: b, bandwidth: 50Mbit/s, latency: 20ms}
  - {a: a, b: a, bandwidth: 1Gbps, burst: 1MiB}
  - {a: b, b: c, latency: 5ms}
"""
ADDR = {"a1": "10.0.0.2", "a2": "10.0.0.3", "b1": "10.0.0.4", "c1": "10.0.0.5"}


def test_each_host_gets_one_class_per_shaped_region_towards_that_regions_hosts() -> None:
    plan = shaping_plan(parse_spec_text(SPEC, "s.yaml"), ADDR)
    assert plan["a1"] == [Shaping("b", 6.25e6, None, ("10.0.0.4",)), Shaping("a", 1.25e8, 1 << 20, ("10.0.0.3",))]
    assert plan["a2"] == [Shaping("b", 6.25e6, None, ("10.0.0.4",)), Shaping("a", 1.25e8, 1 << 20, ("10.0.0.2",))]
    assert plan["b1"] == [Shaping("a", 6.25e6, None, ("10.0.0.2", "10.0.0.3"))]  # latency-only b<->c: no class
    assert plan["c1"] == []


@pytest.mark.parametrize(
    ("cpu", "period_us", "expected"),
    [(1.0, 4000, 4000), (0.25, 4000, 4000), (0.1, 4000, 10000), (0.01, 4000, 100000), (0.5, 100000, 100000)],
)
def test_period_is_raised_so_the_quota_is_at_least_one_millisecond(cpu: float, period_us: int, expected: int) -> None:
    assert effective_period_us(cpu, period_us) == expected
    assert round(cpu * expected) >= 1000


def test_interface_names_fit_ifnamsiz() -> None:
    assert len(veth_name(9999)) <= 15


@pytest.mark.parametrize(
    ("shares", "cpus", "expected"),
    [
        ([1.0, 0.5, 0.25], [0, 1], [(1,), (0,), (0,)]),  # the example: fast alone, mid and slow share the other
        ([0.25, 0.5, 1.0], [0, 1], [(0,), (0,), (1,)]),  # largest first, whatever the spec order
        ([0.5, 0.5, 0.5, 0.5], [2, 3], [(3,), (3,), (2,), (2,)]),  # exactly full
        ([1.5, 0.5], [0, 1, 2], [(1, 2), (0,)]),  # above one core: whole CPUs to itself
        ([0.6, 0.6], [0, 1], [(1,), (0,)]),  # two that do not fit in one CPU get one each
        ([1.0, 1.0, 0.5], [0, 1], None),
        ([0.6, 0.6, 0.6], [0, 1], None),  # 1.8 cores in all, yet no CPU holds two
        ([2.5], [0, 1], None),
    ],
)
def test_hosts_are_packed_onto_cpus_of_their_own(
    shares: list[float], cpus: list[int], expected: list[tuple[int, ...]] | None
) -> None:
    packed = pack_cpus(shares, cpus)
    assert packed == expected
    if packed is not None:  # no CPU holds more than its one core of shares, and a host above one core is alone
        for cpu in cpus:
            assert sum(s for s, on in zip(shares, packed, strict=True) if cpu in on and s <= 1) <= 1
            assert sum(1 for s, on in zip(shares, packed, strict=True) if cpu in on and s > 1) <= 1


def test_pin_cpus_auto_pins_only_where_every_host_gets_cpus_of_its_own() -> None:
    two = parse_spec_text("hosts: [{name: a, region: r, cpu: 1}, {name: b, region: r, cpu: 0.5}]\n", "s.yaml")
    assert two.pin_cpus == "auto"
    assert host_cpu_sets(two, [0, 1], "s.yaml") == [(1,), (0,)]
    assert host_cpu_sets(two, [0], "s.yaml") == [(), ()]  # would share the one CPU: not pinned
    three = parse_spec_text(
        "hosts: [{name: a, region: r, cpu: 1}, {name: b, region: r, cpu: 0.5}, {name: c, region: r, cpu: 0.25}]\n",
        "s.yaml",
    )
    assert host_cpu_sets(three, [0, 1], "s.yaml") == [(), (), ()]  # b and c would share a CPU
    assert host_cpu_sets(three, [0, 1, 2, 3], "s.yaml") == [(3,), (2,), (1,)]
    big = parse_spec_text("hosts: [{name: a, region: r, cpu: 1.5}, {name: b, region: r, cpu: 0.5}]\n", "s.yaml")
    assert host_cpu_sets(big, [0, 1, 2], "s.yaml") == [(1, 2), (0,)]


def test_pin_cpus_false_never_pins_and_true_packs_or_refuses() -> None:
    text = "hosts: [{name: a, region: r, cpu: 1}, {name: b, region: r, cpu: 0.5}, {name: c, region: r, cpu: 0.25}]\n"
    assert host_cpu_sets(parse_spec_text("pin_cpus: false\n" + text, "s.yaml"), [0, 1, 2], "s.yaml") == [(), (), ()]
    packed = parse_spec_text("pin_cpus: true\n" + text, "s.yaml")
    assert host_cpu_sets(packed, [0, 1], "s.yaml") == [(1,), (0,), (0,)]  # b and c share CPU 0
    with pytest.raises(BadInput) as err:
        host_cpu_sets(packed, [0], "s.yaml")
    assert str(err.value) == (
        "s.yaml: field 'pin_cpus': the hosts' shares (1.75 cores in all) do not pack onto the 1 CPU(s) here; "
        "lower the shares or set pin_cpus: auto"
    )
