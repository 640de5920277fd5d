"""What `up` will make, computed without making it: htb classes per host, CPU periods the kernel accepts."""

from __future__ import annotations

import pytest

from hetrl_cli.emulate.api import shaping_plan
from hetrl_cli.emulate.cgroups import effective_period_us
from hetrl_cli.emulate.netns import Shaping, veth_name
from hetrl_cli.emulate.spec import parse_spec_text

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
