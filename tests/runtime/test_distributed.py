"""Real gloo process groups: uneven data parallelism equals the full batch, weight broadcast equals the trainer."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.artifacts.workload import RLSpec
from hetrl_cli.runtime.layout import apportion
from hetrl_cli.runtime.local import free_port
from hetrl_cli.runtime.roles import Actor, Rollout, pad_rows

SHARES = [0.25, 0.75]
NO_CLIP = RLSpec(lr=1e-2, grad_clip=1e9, kl_coef=0.05)


def _batch() -> tuple[list[Rollout], torch.Tensor]:
    """8 sequences with different prompt and response lengths, and fixed advantages."""
    g = torch.Generator().manual_seed(0)
    rollouts = []
    for i in range(8):
        prompt = torch.randint(4, 384, (3 + i % 3,), generator=g).tolist()
        response = torch.randint(4, 384, (2 + (i * 5) % 7,), generator=g).tolist()
        rollouts.append(Rollout(i, tuple(prompt), tuple(response)))
    return rollouts, torch.randn(8, 1, generator=g)


def _update(actor: Actor, rollouts: list[Rollout], adv: torch.Tensor, lo: int, hi: int, dp) -> None:
    steps = max(len(r.response_ids) for r in rollouts)
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
    old = pad_rows(actor.logprobs(rollouts), steps)
    ref = old - 0.1 * mask  # a reference that differs, so the KL term has a gradient too
    actor.train_step(rollouts[lo:hi], (adv * mask)[lo:hi], old[lo:hi], ref[lo:hi], float(mask.sum()), dp)


def _init(rank: int, port: int, world: int = 2) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip


def _dp_worker(rank: int, port: int, tiny_dir: str, out: str) -> None:
    import torch.distributed as dist

    _init(rank, port)
    rollouts, adv = _batch()
    counts = apportion(SHARES, len(rollouts))
    lo = sum(counts[:rank])
    actor = Actor(tiny_dir, NO_CLIP, "grpo", "sgd", 1, pad_id=1, micro_batch=3)
    _update(actor, rollouts, adv, lo, lo + counts[rank], (dist.group.WORLD, 2))
    grads = {n: p.grad.clone() for n, p in actor.model.named_parameters()}
    torch.save({"grads": grads, "weights": dict(actor.named_weights())}, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _sync_worker(rank: int, port: int, tiny_dir: str, out: str) -> None:
    import torch.distributed as dist

    from hetrl_cli.runtime.comm import WeightChannel
    from hetrl_cli.runtime.engines import Sampling
    from hetrl_cli.runtime.engines.hf import HFEngine

    _init(rank, port)
    named = None
    if rank == 0:  # the trainer: one update, so its weights differ from the engine's initial ones
        actor = Actor(tiny_dir, NO_CLIP, "grpo", "adam", 1, pad_id=1, micro_batch=8)
        rollouts, adv = _batch()
        _update(actor, rollouts, adv, 0, 8, (None, 1))
        named = actor.named_weights()
    engine = HFEngine(tiny_dir)
    engine.update_weights(WeightChannel(0, dist.group.WORLD, 2).transfer(named))
    greedy = Sampling(max_new_tokens=10, temperature=0.0, seeds=(0, 0), eos_token_id=3, pad_token_id=1)
    result = {"checksum": engine.weights_checksum(), "greedy": engine.generate([[5, 6, 7], [40, 41]], greedy)}
    if rank == 0:
        from hetrl_cli.runtime.engines import checksum_named

        result["trainer_checksum"] = checksum_named(named)
        ids = actor.model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=10, do_sample=False, pad_token_id=1,
                                   eos_token_id=3)  # fmt: skip
        result["trainer_greedy"] = ids[0, 3:].tolist()
    torch.save(result, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _spawn(fn, tiny_dir: Path, out: Path) -> list[dict]:
    mp.spawn(fn, args=(free_port(), str(tiny_dir), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.slow
def test_uneven_dp_gradient_equals_the_full_batch_gradient(tiny_dir: Path, tmp_path: Path) -> None:
    ranks = _spawn(_dp_worker, tiny_dir, tmp_path)
    single = Actor(
        tiny_dir, NO_CLIP, "grpo", "sgd", 1, pad_id=1, micro_batch=8
    )  # SGD: weights = w - lr * g, exactly comparable (Adam amplifies float noise in ~0 gradients)
    rollouts, adv = _batch()
    _update(single, rollouts, adv, 0, len(rollouts), (None, 1))
    for name, param in single.model.named_parameters():
        for result in ranks:
            torch.testing.assert_close(result["grads"][name], param.grad, atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(result["weights"][name], param.detach(), atol=1e-6, rtol=1e-5)
    assert any(float(p.grad.abs().sum()) > 0 for p in single.model.parameters())


@pytest.mark.slow
def test_broadcast_weight_sync_matches_the_trainer(tiny_dir: Path, tmp_path: Path) -> None:
    trainer, receiver = _spawn(_sync_worker, tiny_dir, tmp_path)
    assert receiver["checksum"] == trainer["checksum"] == trainer["trainer_checksum"]
    assert receiver["greedy"] == trainer["greedy"]
    assert trainer["greedy"][0] == trainer["trainer_greedy"][: len(trainer["greedy"][0])]


def _relay_worker(rank: int, port: int, out: str) -> None:
    """Three ranks, the chain 2 -> 0 -> 1, a buffer of 37 chunks (the last one short)."""
    import torch.distributed as dist

    from hetrl_cli.runtime.comm import relay

    _init(rank, port, world=3)
    flat = torch.arange(1000, dtype=torch.float32) * 0.5 if rank == 2 else torch.zeros(1000)
    relay(flat, [2, 0, 1], dist.group.WORLD, chunk_bytes=27 * 4)
    torch.save(flat, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
def test_relay_chain_delivers_every_chunk_to_every_member(tmp_path: Path) -> None:
    mp.spawn(_relay_worker, args=(free_port(), str(tmp_path)), nprocs=3, join=True)
    expected = torch.arange(1000, dtype=torch.float32) * 0.5
    for rank in range(3):
        torch.testing.assert_close(torch.load(tmp_path / f"rank{rank}.pt"), expected, rtol=0, atol=0)
