"""parallel.pipeline_train runs 1F1B (issue 21, item 7): stage s of S holds at most min(S - s, m) micro-batches'
activations (GPipe held all m), the figure costmodel/memory.py charges, and the gradients are the one-process sum.
Three gloo ranks, one toy stage each (a linear layer), 5 micro-batches."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp

from hetrl_cli.runtime.local import free_port

STAGES, MICRO_BATCHES, WIDTH = 3, 5, 4


def _batches() -> list[SimpleNamespace]:
    g = torch.Generator().manual_seed(0)
    return [SimpleNamespace(input_ids=torch.randn(2, 3, generator=g), attention_mask=None)
            for _ in range(MICRO_BATCHES)]  # fmt: skip


def _layers() -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    return [torch.nn.Linear(WIDTH, WIDTH) for _ in range(STAGES)]


class _ToyStage:
    """What pipeline_train uses of a Shard: its position, held parameters, hidden size and forward; counts the
    micro-batches whose activations are alive (forwarded, backward not yet through this stage)."""

    def __init__(self, stage: int, layer: torch.nn.Linear) -> None:
        first, last = stage == 0, stage == STAGES - 1
        prev_rank, next_rank = (None if first else stage - 1), (None if last else stage + 1)
        pos = SimpleNamespace(stages=STAGES, stage=stage, first=first, last=last, prev_rank=prev_rank,
                              next_rank=next_rank)  # fmt: skip
        self.par = SimpleNamespace(pos=pos)
        self.layer = layer
        self.held = list(layer.named_parameters())
        self.model = SimpleNamespace(config=SimpleNamespace(hidden_size=WIDTH))
        self.alive, self.most = 0, 0

    def forward(self, input_ids, _mask, hidden=None):
        x = input_ids[..., None].expand(-1, -1, WIDTH) if hidden is None else hidden
        out = torch.tanh(self.layer(x))
        self.alive += 1
        self.most = max(self.most, self.alive)
        out.register_hook(self._done)
        return out

    def _done(self, grad):
        self.alive -= 1
        return grad


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from hetrl_cli.runtime.parallel import pipeline_train

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=STAGES,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    stage = _ToyStage(rank, _layers()[rank])
    pipeline_train(stage, _batches(), lambda y, i: ((y**2).sum() * (i + 1), i))
    grads = [p.grad.tolist() for _, p in stage.held]
    Path(out, f"{rank}.json").write_text(json.dumps({"most": stage.most, "grads": grads}))
    dist.destroy_process_group()


def test_pipeline_train_holds_1f1b_activations_and_the_one_process_gradients(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=STAGES, join=True)
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(STAGES)]
    assert [r["most"] for r in ranks] == [min(STAGES - s, MICRO_BATCHES) for s in range(STAGES)]  # GPipe: 5 each
    layers = _layers()
    for i, batch in enumerate(_batches()):  # one process, the micro-batch loop
        x = batch.input_ids[..., None].expand(-1, -1, WIDTH)
        for layer in layers:
            x = torch.tanh(layer(x))
        ((x**2).sum() * (i + 1)).backward()
    for rank, layer in zip(ranks, layers, strict=True):
        for mine, (_, p) in zip(rank["grads"], layer.named_parameters(), strict=True):
            torch.testing.assert_close(torch.tensor(mine), p.grad, atol=1e-6, rtol=1e-5)
