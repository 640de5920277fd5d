"""How long `hetrl --help` takes: the CLI must not import torch, highspy or fabric at start-up.

Runs `hetrl --help` and `python -c pass` side by side N times and reports medians and their ratio
(shared machines are noisy, so the baseline is measured in the same run).

    .venv/bin/python bench/cli_startup.py --runs 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def time_command(argv: list[str], runs: int) -> list[float]:
    """Wall-clock seconds of each of `runs` executions of argv."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return samples


def heavy_modules_loaded() -> list[str]:
    """Which heavy packages importing the CLI module pulls in (should be none)."""
    probe = (
        "import sys, hetrl_cli.cli; "
        "print(','.join(m for m in ('torch','highspy','fabric','paramiko','transformers','vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout.strip()
    return [m for m in out.split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("bench/results/cli_startup.json"))
    args = parser.parse_args()
    hetrl = str(Path(sys.executable).with_name("hetrl"))
    baseline = time_command([sys.executable, "-c", "pass"], args.runs)
    help_times = time_command([hetrl, "--help"], args.runs)
    result = {
        "runs": args.runs,
        "python_pass_median_s": statistics.median(baseline),
        "hetrl_help_median_s": statistics.median(help_times),
        "ratio": statistics.median(help_times) / statistics.median(baseline),
        "heavy_modules_at_import": heavy_modules_loaded(),
        "target": "hetrl --help < 1 s",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
