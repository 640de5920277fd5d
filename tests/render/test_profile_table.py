"""The profile summary `hetrl profile` prints: one row per host, the decode and forward rates where measured."""

from __future__ import annotations

from rich.console import Console

from hetrl_cli.artifacts.profile import ClusterProfile, Device, Host
from hetrl_cli.render.profile import hosts_table


def test_hosts_table_shows_the_probe_rates_where_measured() -> None:
    cpu = Device(id="a:22/0", host="a:22", index=0, kind="cpu", name="CPU", memory_bytes=8 << 30, memory_gbps=20.0,
                 measured_tflops={"fp32": 0.1}, cores=0.5, decode_steps_per_s=346.2,
                 forward_tokens_per_s=9157.6)  # fmt: skip
    profile = ClusterProfile(
        name="p", created_at="2026-12-04T00:00:00Z", method="ssh-probe",
        hosts=[Host(name="a:22", address="10.0.0.1"),
               Host(name="b:22", address="10.0.0.2", status="missing", error="connection refused")],
        devices=[cpu], links=[],
    )  # fmt: skip
    console = Console(width=200, record=True)
    console.print(hosts_table(profile))
    header, row_a, row_b = (line for line in console.export_text().splitlines() if "│" in line or "┃" in line)
    assert "decode" in header and "346 steps/s" in row_a
    assert "forward" in header and "9.2k tokens/s" in row_a
    assert "missing: connection refused" in row_b and "steps/s" not in row_b and "tokens/s" not in row_b
