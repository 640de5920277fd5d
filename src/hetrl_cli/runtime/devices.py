"""Which device each worker computes on and which torch.distributed backend joins them (issue 21, item 1).

- A plan device is CUDA or CPU as the plan's profile says (`ClusterProfile.devices[].kind`); without a profile at
  hand, as this machine is (CUDA when torch sees a GPU here), which is what a one-host run meets.
- All CPU: gloo. All CUDA: one world group `cpu:gloo,cuda:nccl`, so tensors on the GPU go over NCCL and the
  object collectives (rollouts, reports: pickled on the CPU) over gloo; every group made from it has both.
- A plan mixing CPU and CUDA ranks is refused before the launch (NCCL cannot reach a CPU rank and gloo would
  stage every GPU tensor through host memory).
- A CUDA worker uses the GPU of its plan device's index on its host, the index `hetrl profile` recorded (the
  host's own numbering). The launchers leave CUDA_VISIBLE_DEVICES as they found it: when it is set (a scheduler
  gave this job some GPUs), the index is looked up in it and the worker uses its position there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetrl_cli.errors import BadInput

if TYPE_CHECKING:
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.artifacts.profile import ClusterProfile

GLOO = "gloo"
CUDA_BACKEND = "cpu:gloo,cuda:nccl"


def device_kinds(devices: list[str], profile: ClusterProfile | None, local_cuda: int | None = None) -> dict[str, str]:
    """'cuda' or 'cpu' for each plan device: the profile's kind, else this machine's (`local_cuda` GPUs here,
    probed when None: a device is CUDA when its index is one of them)."""
    from hetrl_cli.runtime.layout import split_device_id

    known = {d.id: d.kind for d in profile.devices} if profile is not None else {}
    kinds = {}
    for device in devices:
        if device in known:
            kinds[device] = "cuda" if known[device] == "cuda" else "cpu"
            continue
        if local_cuda is None:
            local_cuda = local_cuda_count()
        kinds[device] = "cuda" if split_device_id(device)[1] < local_cuda else "cpu"
    return kinds


def local_cuda_count() -> int:
    """GPUs torch sees on this machine (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(plan_name: str, kinds: dict[str, str]) -> str:
    """gloo for CPU ranks, `cpu:gloo,cuda:nccl` for CUDA ranks; a plan mixing both is one line (exit 2)."""
    cuda = sorted(d for d, k in kinds.items() if k == "cuda")
    cpu = sorted(d for d, k in kinds.items() if k != "cuda")
    if cuda and cpu:
        raise BadInput(
            f"plan '{plan_name}' mixes CUDA devices ({_some(cuda)}) and CPU devices ({_some(cpu)}): a run uses one "
            "kind (NCCL cannot reach a CPU rank); plan on a profile of GPUs only or of CPUs only"
        )
    return CUDA_BACKEND if cuda else GLOO


def plan_backend(plan: Plan, profile: ClusterProfile | None) -> str:
    """The world group's backend for `plan` (launch manifest), checked before the launch."""
    from hetrl_cli.runtime.layout import plan_devices

    return choose_backend(plan.name, device_kinds(plan_devices(plan), profile))


def _some(devices: list[str], shown: int = 3) -> str:
    more = len(devices) - shown
    return ", ".join(devices[:shown]) + (f" and {more} more" if more > 0 else "")


def cuda_ordinal(index: int, visible: str | None) -> int:
    """The CUDA ordinal of the host's GPU `index` in this process: the index itself, or its position in
    CUDA_VISIBLE_DEVICES when that is set.

    >>> cuda_ordinal(2, None), cuda_ordinal(2, "1,2,3")
    (2, 1)
    """
    if visible is None or not visible.strip():
        return index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not all(e.isdigit() for e in entries):
        raise RuntimeError(
            f"CUDA_VISIBLE_DEVICES={visible!r} names GPUs by UUID; hetrl maps plan device indices through it only "
            "when it lists indices (e.g. 0,1,3), or unset it"
        )
    if str(index) not in entries:
        raise RuntimeError(
            f"the plan puts this rank on GPU {index} but CUDA_VISIBLE_DEVICES={visible!r} hides it; "
            "unset it or include that index"
        )
    return entries.index(str(index))


def worker_device(backend: str, device_id: str) -> str:
    """This worker's torch device ("cpu" or "cuda:N"), selected before the process group starts: CUDA ranks
    set their device and allow TF32 for fp32 matmuls."""
    import os

    if backend != CUDA_BACKEND:
        return "cpu"
    import torch

    from hetrl_cli.runtime.layout import split_device_id
    from hetrl_cli.runtime.precision import enable_tf32

    index = split_device_id(device_id)[1]
    ordinal = cuda_ordinal(index, os.environ.get("CUDA_VISIBLE_DEVICES"))
    count = local_cuda_count()
    if ordinal >= count:
        raise RuntimeError(f"plan device {device_id} is CUDA GPU {index}, but this host has {count} usable GPU(s)")
    torch.cuda.set_device(ordinal)
    enable_tf32()
    return f"cuda:{ordinal}"
