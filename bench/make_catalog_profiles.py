"""Regenerate the shipped catalog profiles: profiles/paper-*.yaml → profiles/paper-*.json.

Each JSON is what `hetrl profile --catalog profiles/X.yaml -o profiles/X.json` writes (same function). A JSON
whose content is unchanged but for `created_at` is left alone, so regenerating does not churn git.

    .venv/bin/python bench/make_catalog_profiles.py            # rewrite what changed
    .venv/bin/python bench/make_catalog_profiles.py --check    # exit 1 if a shipped JSON is stale
    .venv/bin/python bench/make_catalog_profiles.py --synthetic /tmp/scale   # also the scale family
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hetrl_cli.artifacts.io import dump_artifact, save_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.profiling.catalog import profile_from_cluster_file, synthetic_cluster

PROFILES = Path(__file__).resolve().parent.parent / "profiles"
CLUSTER_GLOB = "paper-*.yaml"
# The benchmark scale family (docs/catalog.md): 8 to 1024 devices.
SYNTHETIC_SIZES = (8, 16, 64, 256, 1024)


def comparable(text: str) -> dict:
    """A profile JSON without its timestamp: two runs over the same cluster file compare equal."""
    data = json.loads(text)
    data.pop("created_at", None)
    return data


def regenerate(cluster_file: Path, check: bool) -> bool:
    """Write cluster_file's profile next to it when it changed; True when the shipped file was up to date."""
    target = cluster_file.with_suffix(".json")
    fresh = profile_from_cluster_file(cluster_file)
    current = target.read_text(encoding="utf-8") if target.exists() else None
    if current is not None and comparable(current) == comparable(dump_artifact(fresh)):
        return True
    if not check:
        save_artifact(fresh, target)
    print(f"{'stale' if check else 'wrote'}: {target}", file=sys.stderr)
    return False


def write_synthetic(folder: Path, seed: int) -> None:
    """The scale family, one JSON per size (not shipped: the 1024-device one is several MB)."""
    for n_devices in SYNTHETIC_SIZES:
        profile: ClusterProfile = synthetic_cluster(n_devices, seed)
        save_artifact(profile, folder / f"{profile.name}.json")
        print(f"wrote: {folder / profile.name}.json", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if a shipped JSON is stale.")
    parser.add_argument("--synthetic", type=Path, help="Also write synthetic_cluster profiles into this folder.")
    parser.add_argument("--seed", type=int, default=0, help="Seed for --synthetic.")
    args = parser.parse_args()
    up_to_date = [regenerate(path, args.check) for path in sorted(PROFILES.glob(CLUSTER_GLOB))]
    if args.synthetic is not None:
        write_synthetic(args.synthetic, args.seed)
    if args.check and not all(up_to_date):
        sys.exit(1)


if __name__ == "__main__":
    main()
