import math

import pytest

from hetrl_cli.costmodel.comm import LinkInfo, Links, allreduce_s, p2p_s, pipelined_broadcast_s, reduce_scatter_s

from .conftest import make_profile

LINK = LinkInfo(1e9, 1e-3, "lan", "test")


def test_ring_allreduce_large_message() -> None:
    n, p = 1e9, 4
    assert allreduce_s(n, p, LINK) == pytest.approx(2 * 3 * 1e-3 + 2 * 3 / 4 * n / 1e9)


def test_allreduce_small_message_uses_recursive_doubling() -> None:
    n, p = 1e3, 8
    assert allreduce_s(n, p, LINK) == pytest.approx(3 * (1e-3 + n / 1e9))


def test_trivial_collectives_are_free() -> None:
    assert allreduce_s(1e9, 1, LINK) == 0
    assert reduce_scatter_s(0, 4, LINK) == 0
    assert p2p_s(0, LINK) == 0


def test_pipelined_broadcast_runs_at_slowest_hop() -> None:
    fast = LinkInfo(1e10, 1e-5, "nvlink", "fast")
    assert pipelined_broadcast_s(1e9, [LINK, fast]) == pytest.approx(1e-3 + 1e-5 + 1.0)


def test_ring_bottleneck_and_missing_pair() -> None:
    prof = make_profile(
        [("a", "A100", 2, "r1"), ("b", "A100", 2, "r1"), ("c", "L4", 1, "r2")],
        links={("a", "b"): (10e9, 1e-4), ("a", "c"): (1e8, 0.02)},
    )
    prof = prof.model_copy(update={"links": [lk for lk in prof.links if {lk.a, lk.b} != {"b", "c"}]})
    links = Links(prof, {"lan": {"bandwidth": 0.5}})
    assert links.between("a", "b").bandwidth_Bps == pytest.approx(5e9)  # calibrated
    assert links.between("b", "c").label.endswith("(not in profile: assumed)")
    ring = links.ring(frozenset({"a", "b", "c"}))
    assert ring.bandwidth_Bps == pytest.approx(1e8)  # a<->c is the slowest hop
    assert links.between("b", "c").bandwidth_Bps == pytest.approx(0.9e9 / 8)
    assert ring.latency_s == pytest.approx(0.06)  # the assumed b<->c hop has the worst latency
    assert math.isinf(links.ring(frozenset({"a"})).bandwidth_Bps)
