"""`hetrl plan --exclude HOST`: plan on a profile without some of its hosts.

After a host is lost in the middle of a run, plan the rest of the cluster without it and continue the run from
its last checkpoint on the new plan (`hetrl run NEW_PLAN --resume RUN`; runtime/checkpoint.py reshards it): the
lost host's devices and links leave the profile before planning, so no plan can place anything there.
"""

from __future__ import annotations

from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.errors import BadInput


def exclude_hosts(profile: ClusterProfile, hosts: list[str]) -> ClusterProfile:
    """`profile` without `hosts` (their devices and links), renamed NAME-without-HOSTS so a plan made from it is
    not written over the full cluster's; BadInput naming an unknown host, or when no device is left."""
    names = [h.name for h in profile.hosts]
    for host in hosts:
        if host not in names:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise BadInput(f"--exclude {host[:80]}: profile '{profile.name}' has no such host (hosts: {shown})")
    gone = set(hosts)
    devices = [d for d in profile.devices if d.host not in gone]
    if not devices:
        raise BadInput(f"--exclude: no device of profile '{profile.name}' is left to plan on; exclude fewer hosts")
    name = f"{profile.name}-without-{'-'.join(sorted(gone))}"[:200]
    return profile.model_copy(
        update={
            "name": name,
            "hosts": [h for h in profile.hosts if h.name not in gone],
            "devices": devices,
            "links": [lk for lk in profile.links if lk.a not in gone and lk.b not in gone],
            "notes": [*profile.notes, f"hetrl plan --exclude: without {', '.join(sorted(gone))}"],
        }
    ).with_fingerprint()
