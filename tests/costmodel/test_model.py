"""CostModel arithmetic against hand-computed values, memory violations, balancing and composition."""

from __future__ import annotations

import math

import pytest

from hetrl_cli.artifacts.plan import SolverStats
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import BUILTIN
from hetrl_cli.costmodel.compose import compose_iteration, spans
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement
from hetrl_cli.costmodel.weightsync import WeightSync
from hetrl_cli.planner.build import placement_from_plan, to_plan

from .conftest import make_profile

A100_FLOPS, A100_BPS = 312e12, 2039e9


def dp_placement(task: str, devices: list[str], **kw) -> TaskPlacement:
    return TaskPlacement(task, tuple(((d,),) for d in devices), **kw)


@pytest.fixture
def one_a100():
    return make_profile([("a0", "A100", 1, "r")])


def test_generation_time_by_hand(one_a100, grpo_small: Workload) -> None:
    cm = CostModel(one_a100, grpo_small)
    est = cm.task(dp_placement("generation", ["a0/0"]))
    a = BUILTIN["qwen3-0.6b"]
    n, prompt, r_mean, r_tail = 64, 256, 128, 256
    # all 64 sequences fit in the KV cache: one batch, 256 decode steps (the p99 tail), avg batch 64·128/256
    steps, ctx = r_tail, prompt + r_mean / 2
    # response lengths L = r_tail·u^k, k = r_tail / r_mean − 1 = 1: uniform on [0, 256]. A sequence of length L
    # reads its KV cache at contexts prompt + 0 .. L − 1, so the KV tokens read are n·(prompt·E[L] + E[L²]/2),
    # E[L²] = 256²/3 — not n·r_mean·(prompt + r_mean/2): the long responses read the longest caches
    kv_tokens = n * (prompt * r_mean + r_tail**2 / 3 / 2)
    # the attention's FLOPs (4·q_dim·context a layer) cover the same contexts as its KV reads: kv_tokens in all
    flops = n * r_mean * a.forward_flops_per_token(0) + a.num_layers * a.layer_attention_flops(kv_tokens)
    compute = flops / steps / (A100_FLOPS * C.DECODE_MFU)  # a step's, on average
    weights = a.param_count() * 2 / (A100_BPS * C.HBM_EFFICIENCY)
    kv = kv_tokens * a.kv_bytes_per_token() / (A100_BPS * C.HBM_EFFICIENCY)
    prefill = n * prompt * a.forward_flops_per_token(prompt / 2) / (A100_FLOPS * C.PREFILL_MFU)
    expected = prefill + steps * weights + kv + steps * C.DECODE_STEP_OVERHEAD_S
    assert est.violation is None
    assert est.cost.total_s == pytest.approx(expected, rel=1e-9)
    assert n * a.forward_flops_per_token(ctx) / (A100_FLOPS * C.DECODE_MFU) < weights  # every step reads weights
    assert est.cost.memory_s == pytest.approx(steps * (weights - compute) + kv, rel=1e-9)


def test_generation_waves_when_kv_cache_is_short() -> None:
    prof = make_profile([("l0", "L4", 1, "r")])
    w = Workload(actor={"arch": "qwen3-8b"}, prompts_per_step=64, responses_per_prompt=4)
    est = CostModel(prof, w).task(dp_placement("generation", ["l0/0"]))
    # 16.4 GB of weights leave ~4 GB of KV on a 24 GB L4: far fewer than 256 sequences decode together
    assert est.violation is None
    steps_one_batch = 0.5 * 1024 + 1024 - 512
    assert est.cost.total_s > steps_one_batch * 16.4e9 / (300e9 * C.HBM_EFFICIENCY) * 5


def forward_traffic(a, tokens: float, act: int = 2, response_share: float = 0.0, head: str = "lm") -> float:
    """Non-matmul bytes of one forward of `tokens` tokens on one device, by hand."""
    traffic = a.num_layers * a.layer_traffic_bytes_per_token(act)
    if head == "lm":
        traffic += a.vocab_size * (act + response_share * C.LOGITS_TRAFFIC_BYTES_PER_RESPONSE_ENTRY)
    return tokens * traffic


def test_training_time_by_hand(one_a100, grpo_small: Workload) -> None:
    cm = CostModel(one_a100, grpo_small)
    est = cm.task(dp_placement("actor_train", ["a0/0"]))
    a = BUILTIN["qwen3-0.6b"]
    tokens = 64 * (256 + 128)
    # fwd + bwd (3 forwards; GRPO with one epoch takes the old log-probs from the update's own forward, as the
    # runtime does, so no separate pass): matmuls as FLOPs, the rest as memory traffic (non-matmul ops, 1/3 of the
    # tokens are response tokens for the log-softmax), plus the gradient accumulation per micro-batch (16
    # micro-batches of 4): 3 x the bf16 gradient's bytes per parameter (the runtime computes in bf16 with fp32
    # masters in the optimizer: no autocast casts)
    compute = tokens * 3 * a.forward_flops_per_token((256 + 128) / 2) / (A100_FLOPS * C.TRAIN_MATMUL_EFFICIENCY)
    traffic = forward_traffic(a, tokens, response_share=128 / 384)
    micro_batches, passes = 16, 1
    trained = a.num_layers * a.layer_params + a.head_matmul_params()  # the weights whose gradients accumulate
    accumulate = micro_batches * passes * trained * C.GRAD_ACCUMULATION_PASSES * 2
    memory = (3 * traffic + accumulate) / (A100_BPS * C.ELEMENTWISE_HBM_EFFICIENCY)
    optimizer = a.param_count() * 80 / A100_BPS
    floor = micro_batches * passes * a.num_layers * C.EAGER_DISPATCH_S_PER_LAYER_TRAIN
    assert compute + memory < floor  # 4-sequence micro-batches of a 0.6B model: an A100 waits on its host
    assert est.cost.compute_s == pytest.approx(compute, rel=1e-9)
    assert est.terms["memory"] == pytest.approx(memory, rel=1e-9)
    assert est.terms["host"] == pytest.approx(floor - compute - memory, rel=1e-9)
    assert est.cost.total_s == pytest.approx(floor + optimizer, rel=1e-9)
    # memory: 16 B/param of model states + one micro-batch (4 × 512 tokens) of bf16 activations as the eager
    # layers save them + one chunk of log-prob logits (110 tokens of the 152k vocabulary), or the optimizer
    # step's temporaries (fp32 gradient copies and Adam's sqrt(v), + the embedding) if larger
    mb_tokens = 4 * 512
    acts = mb_tokens * 28 * a.activation_bytes_per_token_layer() * C.EAGER_ACTIVATION_FACTOR
    logits = 110 * a.vocab_size * C.LOGPROB_CHUNK_TRAIN_BYTES_PER_ENTRY["bf16"]
    step = a.param_count() * 8 + 4 * a.vocab_size * a.hidden_size
    assert est.memory_bytes["a0/0"] == pytest.approx(a.param_count() * 16 + max(acts + logits, step), rel=1e-9)


def test_small_micro_batches_are_host_bound_on_a_gpu_not_on_a_cpu(one_a100) -> None:
    """One sequence per micro-batch leaves an A100 waiting on the host's launches: the stage takes the
    dispatch floor per layer and micro-batch; a CPU device has no such floor."""
    w = Workload(actor={"arch": "qwen3-0.6b"}, prompts_per_step=8, responses_per_prompt=2, max_prompt_tokens=64,
                 max_response_tokens=64, micro_batch=1)  # fmt: skip
    est = CostModel(one_a100, w).task(dp_placement("reference", ["a0/0"]))
    floor = 16 * 28 * C.EAGER_DISPATCH_S_PER_LAYER_FORWARD
    assert est.cost.total_s == pytest.approx(floor, rel=1e-9)
    assert est.terms["host"] == pytest.approx(floor - est.terms["compute"] - est.terms["memory"], rel=1e-9)
    assert est.terms["host"] > 0
    cpu = make_profile([("c0", "A100", 1, "r")])
    cpu = cpu.model_copy(update={"devices": [d.model_copy(update={"kind": "cpu"}) for d in cpu.devices]})
    on_cpu = CostModel(cpu, w).task(dp_placement("reference", ["c0/0"]))
    assert on_cpu.terms["host"] == 0
    assert on_cpu.cost.total_s == pytest.approx(on_cpu.terms["compute"] + on_cpu.terms["memory"], rel=1e-9)


def test_reward_model_forward_by_hand(one_a100) -> None:
    w = Workload(
        actor={"arch": "qwen3-0.6b"},
        reward={"arch": "qwen3-0.6b"},
        prompts_per_step=8,
        responses_per_prompt=2,
        max_prompt_tokens=100,
        max_response_tokens=100,
    )
    est = CostModel(one_a100, w).task(dp_placement("reward", ["a0/0"]))
    a = BUILTIN["qwen3-0.6b"]
    tokens = 16 * 150
    compute = tokens * a.forward_flops_per_token(75, head="value") / (A100_FLOPS * C.INFERENCE_MATMUL_EFFICIENCY)
    traffic = forward_traffic(a, tokens, head="value")  # a value head: no vocabulary-sized logits
    memory = traffic / (A100_BPS * C.ELEMENTWISE_HBM_EFFICIENCY)
    floor = math.ceil(16 / w.micro_batch) * 28 * C.EAGER_DISPATCH_S_PER_LAYER_FORWARD
    assert est.cost.total_s == pytest.approx(max(compute + memory, floor), rel=1e-9)
    assert floor > 0 and compute + memory > 0


def test_plan_that_does_not_fit_names_device_and_bytes() -> None:
    prof = make_profile([("a0", "A100", 1, "r")])
    w = Workload(actor={"arch": "qwen3-8b"})
    est = CostModel(prof, w).task(dp_placement("actor_train", ["a0/0"]))
    assert est.violation is not None
    assert est.violation.startswith("a0/0 needs ")
    assert "GB for actor_train weights+grads+optimizer" in est.violation
    assert "has 73.6 GB usable of 80.0 GB" in est.violation


def test_colocated_resident_state_counts(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    train = dp_placement("actor_train", ["a0/0", "a0/1"])
    alone = cm.task(train).memory_bytes["a0/0"]
    with_ref = cm.task(train, ("reference",)).memory_bytes["a0/0"]
    ref_weights = BUILTIN["qwen3-0.6b"].param_count() * 2 / 1  # spread over tp·pp = 1
    assert with_ref - alone == pytest.approx(ref_weights, abs=2)
    # exact placement: the same when the reference uses the same layout
    exact = cm.task(train, (dp_placement("reference", ["a0/0", "a0/1"]),)).memory_bytes["a0/0"]
    assert exact == with_ref


def test_generation_weights_freed_when_colocated_with_training(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    train = dp_placement("actor_train", ["a0/0"])
    gen = dp_placement("generation", ["a0/0"])
    with_gen = cm.task(train, (gen,)).memory_bytes["a0/0"]
    assert with_gen == cm.task(train).memory_bytes["a0/0"]  # hybrid engine: nothing of generation stays
    # but generation sees the trainer's weights + optimizer, so its KV pool is smaller
    assert cm.task(gen, (train,)).memory_bytes["a0/0"] == cm.task(gen).memory_bytes["a0/0"]  # engine fills 90 %


def test_offload_frees_optimizer_and_costs_pcie_time(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    gen = dp_placement("generation", ["a0/0"])
    kept = cm.task(gen, (dp_placement("actor_train", ["a0/0"]),))
    off_train = dp_placement("actor_train", ["a0/0"], offload=True)
    offl = cm.task(gen, (off_train,))
    assert offl.cost.total_s <= kept.cost.total_s
    opt_bytes = BUILTIN["qwen3-0.6b"].param_count() * 12
    train_est = cm.task(off_train)
    assert train_est.terms["offload"] == pytest.approx(2 * opt_bytes / C.HOST_DEVICE_Bps)


def test_load_balanced_shares_beat_uniform_on_mixed_replicas(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    devs = ["a0/0", "l0/0"]
    for task in ("reference", "actor_train", "generation"):
        balanced = cm.task(dp_placement(task, devs))
        uniform = cm.task(dp_placement(task, devs, batch_shares=(0.5, 0.5)))
        assert balanced.cost.total_s < uniform.cost.total_s, task
        a_share, l_share = balanced.placement.batch_shares
        assert a_share > l_share
        assert sum(balanced.placement.batch_shares) == pytest.approx(1)


def test_uneven_layer_split_sums_to_layers(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    p = TaskPlacement("actor_train", ((("a0/0",), ("l0/0",), ("l0/1",)),))
    est = cm.task(p)
    split = est.placement.layer_splits[0]
    assert sum(split) == 28 and min(split) >= 1
    given = cm.task(TaskPlacement("actor_train", p.replicas, layer_splits=((10, 9, 9),)))
    assert given.cost.total_s >= est.cost.total_s
    # no single-layer move between two stages is faster (the send after the A100 stage crosses the WAN, so
    # the split weighs each stage's send and all-reduces, not only its FLOP/s)
    for i in range(3):
        for j in range(3):
            if i != j and split[i] > 1:
                moved = list(split)
                moved[i] -= 1
                moved[j] += 1
                other = cm.task(TaskPlacement("actor_train", p.replicas, layer_splits=(tuple(moved),)))
                assert other.cost.total_s >= est.cost.total_s * (1 - 1e-9), moved


def test_bad_splits_shares_and_tp_are_violations(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    assert "layer_splits" in cm.task(TaskPlacement("actor_train", ((("a0/0",),),), layer_splits=((27,),))).violation
    assert "batch_shares" in cm.task(dp_placement("reference", ["a0/0", "a0/1"], batch_shares=(0.7, 0.7))).violation
    three = TaskPlacement("actor_train", ((("l0/0", "l0/1", "l0/2"),),))
    assert cm.task(three).violation == "actor_train: qwen3-0.6b has 16 attention heads, not divisible by tp=3"
    assert "does not have" in cm.task(dp_placement("reference", ["zz/0"])).violation
    assert math.isinf(cm.task(dp_placement("reference", ["zz/0"])).cost.total_s)


def test_tp_adds_comm_on_its_link(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    nv = cm.task(TaskPlacement("actor_train", ((("a0/0", "a0/1"),),)))
    cross = cm.task(TaskPlacement("actor_train", ((("a0/0", "l0/0"),),)))
    assert 0 < nv.terms["tp_comm"] < cross.terms["tp_comm"]
    assert "wan" in cross.links["tp_comm"]


def test_dp_allreduce_is_hierarchical(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    grads = BUILTIN["qwen3-0.6b"].param_count() * 2
    one_host = cm.task(dp_placement("actor_train", ["a0/0", "a0/1"]))
    two_hosts = cm.task(dp_placement("actor_train", ["a0/0", "a0/1", "a1/0", "a1/1"]))
    nvlink = 300e9
    assert one_host.terms["dp_allreduce"] == pytest.approx(2 * (5e-6 + grads / 2 / nvlink))
    lan = 100e9 / 8
    inter = 1e-4 + grads / lan  # one copy per host; 2 hosts: a single exchange (recursive doubling)
    assert two_hosts.terms["dp_allreduce"] == pytest.approx(one_host.terms["dp_allreduce"] + inter)


def test_weight_sync_8b_over_5gbps() -> None:
    prof = make_profile([("a0", "A100", 1, "east"), ("b0", "A100", 1, "west")], wan_between_regions=(5e9 / 8, 0.01))
    cm = CostModel(prof, Workload(actor={"arch": "qwen3-8b"}))
    s = cm.weight_sync_s(["a0/0"], ["b0/0"])
    nbytes = BUILTIN["qwen3-8b"].param_count() * 2
    assert nbytes / 1e9 == pytest.approx(16.38, abs=0.01)
    expected = 0.01 + nbytes / (5e9 / 8) + BUILTIN["qwen3-8b"].tensor_count() * C.WEIGHT_SYNC_PER_TENSOR_S
    assert s == pytest.approx(expected)
    assert 26 < s < 27


def test_weight_sync_one_copy_per_region(mixed_profile) -> None:
    cm = CostModel(mixed_profile, Workload(actor={"arch": "qwen3-8b"}))
    nbytes = BUILTIN["qwen3-8b"].param_count() * 2
    one = cm.weight_sync_s(["a0/0"], ["l0/0"])
    four = cm.weight_sync_s(["a0/0"], ["l0/0", "l0/1", "l0/2", "l0/3"])
    assert four == pytest.approx(one + 10e-6, rel=1e-6)  # fan-out inside the host is pipelined, PCIe ≫ WAN
    assert one > nbytes / (5e9 / 8)
    local = cm.weight_sync_s(["a0/0", "a0/1"], ["a0/0", "a0/1"])
    # colocated: no bytes cross a link, but the engine sleeps/wakes and its loader takes every tensor
    refit = WeightSync.colocated_refit_s(BUILTIN["qwen3-8b"].tensor_count())
    assert refit <= local < refit + 0.1
    assert local < one / 10


def test_transfer(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    assert cm.transfer_s(["a0/0"], ["a0/0"], 1e9) == 0
    assert cm.transfer_s(["a0/0"], ["l0/0"], 1e9) == pytest.approx(0.01 + 1e9 / (5e9 / 8))
    assert cm.transfer_s(["a0/0"], ["a1/0", "l0/0"], 1e9) == pytest.approx(1e-4 + 1e9 / (100e9 / 8))


def split_groups(gen_devs, rest_devs):
    groups = [
        GroupPlacement("gen", ("generation",), tuple(gen_devs)),
        GroupPlacement("train", ("reference", "actor_train"), tuple(rest_devs)),
    ]
    placements = [
        dp_placement("generation", gen_devs),
        dp_placement("reference", rest_devs),
        dp_placement("actor_train", rest_devs),
    ]
    return groups, placements


def test_iteration_equals_phase_formula(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    groups, placements = split_groups(["l0/0", "l0/1", "l0/2", "l0/3"], ["a0/0", "a0/1", "a1/0", "a1/1"])
    est = cm.evaluate(groups, placements)
    assert est.feasible, est.violations
    t = {k: e.cost.total_s for k, e in est.tasks.items()}
    rollout = cm.transfer_s(groups[0].devices, groups[1].devices, cm.rollout_bytes())
    ws = cm.weight_sync_s(groups[1].devices, groups[0].devices)
    expected = t["generation"] + rollout + t["reference"] + t["actor_train"] + ws
    assert est.iteration_s == pytest.approx(expected)
    phases = cm.phase_times(groups, est.tasks)
    assert phases == [{"gen": t["generation"]}, {"train": t["reference"]}, {"train": t["actor_train"]}]
    assert cm.transfers(groups) == [("transfer:gen->train", "gen", "train", cm.rollout_bytes())]
    assert compose_iteration(phases, [rollout, 0.0], ws, False) == pytest.approx(expected)
    assert est.samples_per_s == pytest.approx(64 / expected)
    assert est.tokens_per_s == pytest.approx(64 * 128 / expected)
    assert sum(est.breakdown.values()) == pytest.approx(expected)
    assert est.timeline[-1].name == "weight_sync" and est.timeline[-1].end_s == pytest.approx(expected)
    assert est.bottleneck.startswith("weight sync (training → generation) over the 5 Gbps wan link")


def test_async_never_slower_than_sync(mixed_profile, grpo_small) -> None:
    groups, placements = split_groups(["l0/0", "l0/1", "l0/2", "l0/3"], ["a0/0", "a0/1", "a1/0", "a1/1"])
    sync = CostModel(mixed_profile, grpo_small).evaluate(groups, placements)
    asy = CostModel(mixed_profile, grpo_small.model_copy(update={"mode": "async"})).evaluate(groups, placements)
    assert asy.iteration_s <= sync.iteration_s
    s = spans(CostModel(mixed_profile, grpo_small).phase_times(groups, sync.tasks))
    # one-step off-policy: step t's sync starts when its update ends and the rollout of t+2 waits for it, so over
    # two iterations G + R + W is a cycle; each of G (generation), R (transfers + training), W (sync) also bounds one
    # G also loads the weights staged in host memory between rollouts (generation.staged_load_s): async only
    load = asy.tasks["generation"].terms["offload"]
    g, r, w = s[0] + load, sync.transfer_s + s[1] + s[2], sync.weight_sync_s
    assert asy.iteration_s == pytest.approx(max(g, r, (g + w + r) / 2, w))
    assert sum(asy.breakdown.values()) == pytest.approx(asy.iteration_s)


def test_async_colocated_falls_back_to_sync(mixed_profile, grpo_small) -> None:
    devs = ("a0/0", "a0/1")
    groups = [GroupPlacement("all", ("generation", "reference", "actor_train"), devs)]
    placements = [dp_placement(t, list(devs)) for t in ("generation", "reference", "actor_train")]
    sync = CostModel(mixed_profile, grpo_small).evaluate(groups, placements)
    asy = CostModel(mixed_profile, grpo_small.model_copy(update={"mode": "async"})).evaluate(groups, placements)
    assert asy.iteration_s == pytest.approx(sync.iteration_s)
    assert sync.transfer_s == 0


def test_structural_violations(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    groups = [
        GroupPlacement("g0", ("generation",), ("a0/0", "zz/9")),
        GroupPlacement("g1", ("actor_train",), ("a0/0",)),
    ]
    placements = [dp_placement("generation", ["a0/0"]), dp_placement("actor_train", ["a0/1"])]
    v = cm.evaluate(groups, placements).violations
    assert "group g0 names device zz/9 that the profile does not have; check the profile" in v
    assert "device a0/0 is in groups g0 and g1; a device belongs to one group" in v
    assert "task reference is not placed; every grpo task needs a group and devices" in v
    assert "task actor_train uses a0/1 outside its group g1" in v


def test_rule_reward_needs_no_placement_and_model_reward_does(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    v = cm.task(dp_placement("reward", ["a0/0"])).violation
    assert v.startswith("reward is rule-based")
    w = Workload.model_validate({**grpo_small.model_dump(), "reward": {"arch": "qwen3-0.6b"}})
    groups, placements = split_groups(["l0/0"], ["a0/0"])
    assert (
        "task reward is not placed; every grpo task needs a group and devices"
        in CostModel(mixed_profile, w).evaluate(groups, placements).violations
    )


def test_ppo_critic_tasks(mixed_profile) -> None:
    w = Workload(
        algorithm="ppo",
        actor={"arch": "qwen3-0.6b"},
        critic={"arch": "qwen3-0.6b"},
        prompts_per_step=8,
        responses_per_prompt=2,
        max_prompt_tokens=128,
        max_response_tokens=128,
    )
    cm = CostModel(mixed_profile, w)
    devs = ["a0/0", "a0/1", "a1/0", "a1/1"]
    groups = [
        GroupPlacement("gen", ("generation",), ("l0/0", "l0/1")),
        GroupPlacement("actor", ("reference", "actor_train"), ("a0/0", "a0/1")),
        GroupPlacement("critic", ("critic_inference", "critic_train"), ("a1/0", "a1/1")),
    ]
    placements = [dp_placement("generation", ["l0/0", "l0/1"])] + [
        dp_placement(t, devs[:2] if t in ("reference", "actor_train") else devs[2:])
        for t in ("reference", "actor_train", "critic_inference", "critic_train")
    ]
    est = cm.evaluate(groups, placements)
    assert est.feasible, est.violations
    # critic inference runs on the critic trainer's weights: no second copy
    ci = est.tasks["critic_inference"].memory_bytes["a1/0"]
    assert ci < est.tasks["critic_train"].memory_bytes["a1/0"]
    assert len(cm.boundary_transfers(groups)[1]) == 2  # values critic→actor, log-probs actor→critic


def test_critic_weights_sync_when_critic_inference_is_in_another_group(mixed_profile) -> None:
    """The runtime sends the trained critic to a critic_inference copy in another group every step (after the
    actor's sync); in the trainer's own group critic inference runs on the trained weights (no sync)."""
    w = Workload(algorithm="ppo", actor={"arch": "qwen3-0.6b"}, critic={"arch": "qwen3-1.7b"}, prompts_per_step=4,
                 responses_per_prompt=2, max_prompt_tokens=64, max_response_tokens=64)  # fmt: skip
    cm = CostModel(mixed_profile, w)
    gen, train = ["l0/0", "l0/1"], ["a0/0", "a0/1"]
    apart = [
        GroupPlacement("gen", ("generation", "critic_inference"), tuple(gen)),
        GroupPlacement("train", ("reference", "actor_train", "critic_train"), tuple(train)),
    ]
    together = [
        GroupPlacement("gen", ("generation",), tuple(gen)),
        GroupPlacement("train", ("reference", "critic_inference", "actor_train", "critic_train"), tuple(train)),
    ]

    def placements(critic_inference_devices):
        return [
            dp_placement("generation", gen),
            dp_placement("critic_inference", critic_inference_devices),
            *(dp_placement(t, train) for t in ("reference", "actor_train", "critic_train")),
        ]

    actor = cm.weight_sync_s(train, gen)
    critic = cm.weight_sync_s(train, gen, role="critic")
    nbytes = BUILTIN["qwen3-1.7b"].param_count("value") * 2
    assert critic > nbytes / (5e9 / 8) > actor / 2  # the 1.7B critic over the 5 Gbps WAN, more than the 0.6B actor
    est = cm.evaluate(apart, placements(gen))
    assert est.weight_sync_s == pytest.approx(actor + critic)
    assert est.bottleneck.startswith("weight sync (critic training → critic inference) over the 5 Gbps wan link")
    assert cm.evaluate(together, placements(train)).weight_sync_s == pytest.approx(actor)


def test_per_step_overheads_run_at_the_host_core_share() -> None:
    """A CPU device capped to a quarter of a core does the decode steps' and the calibrated per-step host
    work 4× slower; its compute is what its profile measured."""
    from hetrl_cli.artifacts.profile import ClusterProfile, Device, Host, Link

    def cpu(host: str, cores: float) -> Device:
        return Device(id=f"{host}/0", host=host, index=0, kind="cpu", name="CPU", memory_bytes=8 * 10**9,
                      measured_tflops={"fp32": 0.05}, memory_gbps=10.0, cores=cores)  # fmt: skip

    prof = ClusterProfile(
        name="cores", created_at="2026-12-03T00:00:00Z", method="catalog",
        hosts=[Host(name="fast", address="10.0.0.1"), Host(name="slow", address="10.0.0.2")],
        devices=[cpu("fast", 1.0), cpu("slow", 0.25)],
        links=[Link(a="fast", b="slow", bandwidth_Bps=1e9, latency_s=1e-4)],
    ).with_fingerprint()  # fmt: skip
    w = Workload(actor={"arch": "tiny"}, precision="fp32", max_prompt_tokens=16, max_response_tokens=16)
    cal = {"task_overhead_s": {"generation": 0.1, "weight_sync": 0.01}}
    uncalibrated = CostModel(prof, w).task(dp_placement("generation", ["fast/0"])).terms["overhead"]
    for calibration, per_step in ((None, 0.0), (cal, 0.1)):
        cm = CostModel(prof, w, calibration)
        fast, slow = (cm.task(dp_placement("generation", [d])) for d in ("fast/0", "slow/0"))
        assert slow.terms["compute"] == pytest.approx(fast.terms["compute"])
        assert slow.terms["overhead"] == pytest.approx(4 * fast.terms["overhead"])
        assert fast.terms["overhead"] == pytest.approx(per_step + uncalibrated)
        both = cm.task(dp_placement("generation", ["fast/0", "slow/0"]))
        assert both.placement.batch_shares[1] < 0.5  # the balancer gives the slow host less of the batch
    count = BUILTIN["tiny"].tensor_count()
    host_work = count * C.WEIGHT_SYNC_PER_TENSOR_S + WeightSync.colocated_refit_s(count)  # colocated: + the refit
    assert cm.weight_sync_s(["fast/0"], ["fast/0"]) - cm.weight_sync_s(["slow/0"], ["slow/0"]) == pytest.approx(
        -3 * (host_work + 0.01), rel=1e-3
    )


def _cpu_device(host: str, cores: float = 1.0, tflops: float = 0.05, **rates: float | None):
    """A profiled CPU device `host/0` (rates: decode_steps_per_s, forward_tokens_per_s)."""
    from hetrl_cli.artifacts.profile import Device

    return Device(id=f"{host}/0", host=host, index=0, kind="cpu", name="CPU", memory_bytes=8 * 10**9,
                  measured_tflops={"fp32": tflops}, memory_gbps=10.0, cores=cores, **rates)  # fmt: skip


def _fast_slow_profile(devices):
    """A catalog profile of hosts `fast` and `slow` (one device each, `devices`) on a 1 GB/s link."""
    from hetrl_cli.artifacts.profile import ClusterProfile, Host, Link

    return ClusterProfile(
        name="fast-slow", created_at="2026-12-04T00:00:00Z", method="catalog",
        hosts=[Host(name="fast", address="10.0.0.1"), Host(name="slow", address="10.0.0.2")],
        devices=devices, links=[Link(a="fast", b="slow", bandwidth_Bps=1e9, latency_s=1e-4)],
    ).with_fingerprint()  # fmt: skip


def test_generation_host_work_runs_at_the_measured_decode_rate() -> None:
    """Where the profile measured decode_steps_per_s, generation's per-step host work (the built-in decode-step
    overhead and the calibrated fixed overhead) scales by the rates' ratio to the fastest-measured host (a
    quarter-core host at a fifth of its rate: 5×); other tasks' overheads keep the core share's 4×."""
    from hetrl_cli.costmodel.devices import decode_slowdowns

    def cpu(host: str, cores: float, rate: float | None):
        return _cpu_device(host, cores, decode_steps_per_s=rate)

    devices = [cpu("fast", 1.0, 30.0), cpu("slow", 0.25, 6.0), cpu("mid", 0.5, None)]
    assert decode_slowdowns(devices) == pytest.approx({"fast/0": 1.0, "slow/0": 5.0, "mid/0": 2.0})
    assert decode_slowdowns([cpu("a", 0.5, 10.0), cpu("b", 0.5, 10.0)]) == {"a/0": 2.0, "b/0": 2.0}
    prof = _fast_slow_profile(devices[:2])
    w = Workload(actor={"arch": "tiny"}, precision="fp32", max_prompt_tokens=16, max_response_tokens=16)
    cm = CostModel(prof, w, {"task_overhead_s": {"generation": 0.1, "reference": 0.01}})
    for task, factor in (("generation", 5.0), ("reference", 4.0)):
        fast, slow = (cm.task(dp_placement(task, [d])) for d in ("fast/0", "slow/0"))
        assert slow.terms["overhead"] == pytest.approx(factor * fast.terms["overhead"])
        assert cm.overhead_scale(["fast/0", "slow/0"], task) == factor


def test_cpu_compute_rates_follow_the_measured_forward_rates() -> None:
    """Where the profile measured forward_tokens_per_s on CPU devices, the fastest-measured one keeps its
    matmul figure and the others take its figure times their rate's ratio (a host at a fifth of the rate gets a
    fifth of the FLOP/s whatever its own matmul said); unmeasured devices keep their own figure, and the cost
    model's compute time and the planner's class speed follow."""
    from hetrl_cli.costmodel.devices import compute_tflops
    from hetrl_cli.planner.space import device_classes

    def cpu(host: str, tflops: float, rate: float | None):
        return _cpu_device(host, tflops=tflops, forward_tokens_per_s=rate)

    devices = [cpu("fast", 0.2, 20000.0), cpu("slow", 0.05, 4000.0), cpu("other", 0.03, None)]
    assert compute_tflops(devices, "fp32") == pytest.approx({"fast/0": 0.2, "slow/0": 0.04, "other/0": 0.03})
    assert compute_tflops(devices[:1], "bf16") == {"fast/0": 0.2}  # the fp32 figure stands in, as Device.tflops
    prof = _fast_slow_profile(devices[:2])
    w = Workload(actor={"arch": "tiny"}, precision="fp32", max_prompt_tokens=16, max_response_tokens=16)
    cm = CostModel(prof, w)
    fast, slow = (cm.task(dp_placement("reference", [d])) for d in ("fast/0", "slow/0"))
    assert slow.terms["compute"] == pytest.approx(5 * fast.terms["compute"])
    assert [c.speed_tflops for c in device_classes(prof, "fp32")] == pytest.approx([0.2, 0.04])


def test_calibration_scales_device_and_link(mixed_profile, grpo_small) -> None:
    p = dp_placement("actor_train", ["a0/0", "a1/0"])
    base = CostModel(mixed_profile, grpo_small).task(p)
    cal = {"device_class": {"NVIDIA A100-SXM4-80GB": {"compute": 0.5}}, "link_class": {"lan": {"bandwidth": 0.1}}}
    slow = CostModel(mixed_profile, grpo_small, cal).task(p)
    assert slow.cost.compute_s == pytest.approx(2 * base.cost.compute_s)
    assert slow.terms["dp_allreduce"] > 5 * base.terms["dp_allreduce"]


def test_to_plan_and_back(mixed_profile, grpo_small) -> None:
    cm = CostModel(mixed_profile, grpo_small)
    groups, placements = split_groups(["l0/0", "l0/1"], ["a0/0", "l0/2"])
    est = cm.evaluate(groups, placements)
    plan = to_plan(cm, est, groups, SolverStats(solver="manual", status="heuristic"), "p1")
    assert plan.profile_fingerprint == mixed_profile.fingerprint
    assert plan.created_at.endswith("Z")
    tp = plan.task("actor_train")
    assert (tp.dp, tp.pp, tp.tp) == (2, 1, 1)
    assert tp.replicas[0].batch_share > tp.replicas[1].batch_share
    assert plan.cost.iteration_s == pytest.approx(est.iteration_s)
    g2, p2 = placement_from_plan(plan)
    again = cm.evaluate(g2, p2)
    assert again.iteration_s == pytest.approx(est.iteration_s)


def test_to_plan_refuses_infeasible(mixed_profile) -> None:
    from hetrl_cli.errors import Infeasible

    cm = CostModel(mixed_profile, Workload(actor={"arch": "qwen3-8b"}))
    groups, placements = split_groups(["l0/0"], ["a0/0"])
    est = cm.evaluate(groups, placements)
    with pytest.raises(Infeasible, match="plan 'x' does not fit: a0/0 needs"):
        to_plan(cm, est, groups, SolverStats(solver="manual", status="heuristic"), "x")


def test_weight_sync_feeds_regions_from_different_training_hosts() -> None:
    prof = make_profile(
        [("a0", "A100", 1, "east"), ("a1", "A100", 1, "east"), ("w0", "L4", 1, "west"), ("e0", "L4", 1, "eu")],
        wan_between_regions=(5e9 / 8, 0.01),
    )
    cm = CostModel(prof, Workload(actor={"arch": "qwen3-8b"}))
    one = cm.weight_sync_s(["a0/0", "a1/0"], ["w0/0"])
    two = cm.weight_sync_s(["a0/0", "a1/0"], ["w0/0", "e0/0"])
    assert two == pytest.approx(one)  # each region gets its copy from its own training host
    relayed = cm.weight_sync_s(["a0/0"], ["w0/0", "e0/0"])
    assert relayed == pytest.approx(one + 0.01)  # a0 → w0 → e0, pipelined: one more hop's latency


def test_weight_sync_relays_around_a_slow_link() -> None:
    prof = make_profile(
        [("a0", "A100", 1, "east"), ("w0", "L4", 1, "west"), ("e0", "L4", 1, "eu")],
        links={("a0", "e0"): (1e9 / 8, 0.05)},
        wan_between_regions=(5e9 / 8, 0.01),
    )
    cm = CostModel(prof, Workload(actor={"arch": "qwen3-8b"}))
    nbytes = BUILTIN["qwen3-8b"].param_count() * 2
    tensors = 399 * C.WEIGHT_SYNC_PER_TENSOR_S
    assert cm.weight_sync_s(["a0/0"], ["e0/0"]) == pytest.approx(0.05 + nbytes / (1e9 / 8) + tensors)
    assert cm.weight_sync_s(["a0/0"], ["w0/0", "e0/0"]) == pytest.approx(0.02 + nbytes / (5e9 / 8) + tensors)


def test_async_timeline_overlaps_generation_with_training(mixed_profile, grpo_small) -> None:
    groups, placements = split_groups(["l0/0", "l0/1"], ["a0/0", "a0/1"])
    est = CostModel(mixed_profile, grpo_small.model_copy(update={"mode": "async"})).evaluate(groups, placements)
    by_name = {e.name: e for e in est.timeline}
    assert by_name["generation"].start_s == 0 and by_name["transfer:gen->train"].start_s == 0
    assert by_name["weight_sync"].start_s == pytest.approx(by_name["generation"].end_s)
    assert max(e.end_s for e in est.timeline) == pytest.approx(est.iteration_s)


def test_zero_sharding_divides_model_states(mixed_profile) -> None:
    base = Workload(actor={"arch": "qwen3-1.7b"}, prompts_per_step=8, responses_per_prompt=2, recompute=True)
    devs = ["a0/0", "a0/1", "a1/0", "a1/1"]
    mem = {}
    for sharding in ("none", "zero1", "zero2", "zero3"):
        cm = CostModel(mixed_profile, base.model_copy(update={"sharding": sharding}))
        mem[sharding] = cm.task(dp_placement("actor_train", devs)).memory_bytes["a0/0"]
    n = BUILTIN["qwen3-1.7b"].param_count()
    # the peak is the optimizer step's (recompute keeps activations small): zero1 shards the fp32 masters and
    # moments (12 B/param) and the step's temporaries for the partition it steps (fp32 gradient copies and
    # Adam's sqrt(v), 8 B/param)
    assert mem["none"] - mem["zero1"] == pytest.approx(n * (12 + 8) * 3 / 4, rel=1e-6)
    assert mem["zero1"] - mem["zero2"] == pytest.approx(n * 2 * 3 / 4, rel=1e-6)
    assert mem["zero3"] < mem["zero2"]


def test_bottleneck_names_the_slow_dp_link() -> None:
    prof = make_profile([("a0", "A100", 1, "east"), ("a1", "A100", 1, "west")], wan_between_regions=(1e9 / 8, 0.03))
    w = Workload(
        actor={"arch": "qwen3-1.7b"},
        prompts_per_step=4,
        responses_per_prompt=2,
        max_prompt_tokens=64,
        max_response_tokens=64,
        micro_batch=8,
    )
    cm = CostModel(prof, w)
    devs = ("a0/0", "a1/0")
    tasks = ("generation", "reference", "actor_train")
    groups = [GroupPlacement("g1", tasks, devs)]
    est = cm.evaluate(groups, [dp_placement(t, list(devs)) for t in tasks])
    assert est.bottleneck.startswith("actor_train on group g1 (2×A100-SXM4-80GB, east/west) takes ")
    assert "its DP all-reduce over the 1 Gbps wan link a0<->a1 is " in est.bottleneck


def test_actor_train_charges_the_old_logprob_forward_where_the_runtime_runs_it(one_a100, grpo_small) -> None:
    """GRPO with one epoch: the update's own forward gives the old log-probs (runtime roles.Actor
    .reuses_old_logprobs), so no pass is charged; a second epoch needs them first: 2 + 1/3 training passes of
    compute, not 2; PPO always runs it."""
    from hetrl_cli.artifacts.rl import separate_old_logprob_pass

    def compute(w: Workload) -> float:
        return CostModel(one_a100, w).task(dp_placement("actor_train", ["a0/0"])).cost.compute_s

    one, two = compute(grpo_small), compute(grpo_small.model_copy(update={"ppo_epochs": 2}))
    assert two == pytest.approx(one * (2 + 1 / 3), rel=1e-9)
    assert not separate_old_logprob_pass("grpo", 1)
    assert separate_old_logprob_pass("grpo", 2) and separate_old_logprob_pass("ppo", 1)
