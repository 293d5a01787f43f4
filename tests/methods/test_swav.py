"""SwAV (methods/swav): its Sinkhorn (sslbench.kit.clustering.swav_sinkhorn), the swapped prediction
(sslbench.kit.losses.cross_view_cross_entropy), the codes, the queue and the prototypes, on tiny inputs;
and under 2 gloo processes the codes and loss of one process on the whole batch, queue included."""

import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, random_views, tiny_suite_config

from sslbench import distributed as dist
from sslbench.errors import ConfigError
from sslbench.kit.clustering import balanced_assignment, sinkhorn, swav_sinkhorn
from sslbench.kit.losses import cross_view_cross_entropy
from sslbench.kit.queue import KeyQueue
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import Trainer, build_method

BATCH = 16
K = 8  # prototypes of the tiny method


def swav_config(batch: int = BATCH, **overrides) -> dict:
    suite = tiny_suite_config(batch_size=batch)
    suite["method_overrides"] = {"swav": {"num_prototypes": K, "queue_size": 2 * BATCH, **overrides}}
    return resolve_method_config(suite, METHODS_DIR, "swav")


def build_swav(digits, **overrides):
    return build_method(METHODS_DIR / "swav", swav_config(**overrides), digits, 0)


def cosines(seed: int, b: int, k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (
        F.normalize(torch.randn(b, 5, generator=g), dim=1)
        @ F.normalize(torch.randn(k, 5, generator=g), dim=1).T
    )


# --- Sinkhorn ---------------------------------------------------------------------------------


def test_one_iteration_by_hand():
    # Kernel exp(s / eps) = [[4, 1], [1, 1]] (samples x prototypes). Total 7; prototype sums 5/7, 2/7 ->
    # [[.4, .25], [.1, .25]] (/ K = 2); sample sums .65, .35 -> codes [[8/13, 5/13], [2/7, 5/7]].
    eps = 0.05
    scores = eps * torch.log(torch.tensor([[4.0, 1.0], [1.0, 1.0]]))
    codes = swav_sinkhorn(scores, eps, iterations=1)
    torch.testing.assert_close(codes, torch.tensor([[8 / 13, 5 / 13], [2 / 7, 5 / 7]]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_codes_sum_to_one_and_prototype_sums_approach_b_over_k_with_iterations(seed):
    scores = cosines(seed, 64, 10)
    errors = []
    for iterations in (1, 3, 10, 100):
        codes = swav_sinkhorn(scores, 0.05, iterations)
        assert codes.dtype == torch.float32 and (codes >= 0).all()
        torch.testing.assert_close(codes.sum(dim=1), torch.ones(64), rtol=0, atol=1e-5)  # exact per sample
        errors.append((codes.sum(dim=0) / (64 / 10) - 1).abs().max().item())  # per prototype: near B / K
    # 3 iterations leave the prototypes 30-60 % off equal here; each iteration brings them closer
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-4


@pytest.mark.parametrize("seed", [0, 1])
def test_converged_codes_are_selas_plan_times_b(seed):
    # The same transport problem: SeLa's plan of P = softmax(s) with lam = 1 / eps (rows 1/B, columns 1/K).
    scores = cosines(seed, 32, 6).double()
    codes = swav_sinkhorn(scores, 0.1, iterations=500)
    plan = sinkhorn(F.softmax(scores, dim=1), lam=10.0, tol=1e-10).plan
    torch.testing.assert_close(codes.double(), 32 * plan, rtol=1e-4, atol=1e-6)


def test_one_sample_is_spread_evenly_and_codes_carry_no_gradient():
    scores = torch.tensor([[0.9, -0.3, 0.1]], requires_grad=True)
    codes = swav_sinkhorn(scores)
    torch.testing.assert_close(codes, torch.full((1, 3), 1 / 3))  # equal mass per prototype forces it
    assert not codes.requires_grad and codes.grad_fn is None


# --- the swapped prediction -----------------------------------------------------------------------


def test_the_codes_are_the_balanced_assignment_of_the_exponentiated_scores_which_msn_shares():
    scores = torch.rand(6, 4, generator=torch.Generator().manual_seed(3)) * 2 - 1
    weights = torch.exp(scores / 0.05)
    torch.testing.assert_close(
        swav_sinkhorn(scores, 0.05, 3), balanced_assignment(weights, 3), rtol=0, atol=0
    )
    before = weights.clone()
    codes = balanced_assignment(weights, 1)
    torch.testing.assert_close(weights, before, rtol=0, atol=0)  # the caller's weights are left as they were
    torch.testing.assert_close(codes.sum(dim=1), torch.ones(6))


def test_cross_view_cross_entropy_by_hand():
    # Two views, one sample, K = 2, T = 1: the pairs (0, 1) and (1, 0).
    logits = [torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(3.0), 0.0]])]
    targets = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]])]
    # CE(t0, softmax(l1)) = -log(3/4); CE(t1, softmax(l0)) = log 2
    expected = (-math.log(0.75) + math.log(2.0)) / 2
    assert cross_view_cross_entropy(targets, logits, 1.0).item() == pytest.approx(expected)
    # A third view joins both targets' sums: mean over the 2 x 2 pairs.
    third = torch.tensor([[0.0, math.log(3.0)]])  # softmax (1/4, 3/4)
    expected3 = (-math.log(0.75) - math.log(0.25) + math.log(2.0) - 0.5 * math.log(3 / 16)) / 4
    assert cross_view_cross_entropy(targets, [*logits, third], 1.0).item() == pytest.approx(expected3)


def test_swapping_the_views_codes_swaps_the_loss_terms():
    g = torch.Generator().manual_seed(0)
    s = [torch.randn(6, 4, generator=g) for _ in range(3)]
    q = [swav_sinkhorn(x) for x in s[:2]]
    term = lambda i, v: cross_view_cross_entropy([q[i], q[i]], [s[v], s[v]], 0.1)  # one pair's CE
    swapped = cross_view_cross_entropy([q[1], q[0]], [s[1], s[0], s[2]], 0.1)
    assert swapped.item() == pytest.approx(cross_view_cross_entropy(q, s, 0.1).item(), rel=1e-6)
    expected = (term(0, 1) + term(0, 2) + term(1, 0) + term(1, 2)) / 4
    assert cross_view_cross_entropy(q, s, 0.1).item() == pytest.approx(expected.item(), rel=1e-6)
    # Codes predicted from their own view instead (no swap) is another loss.
    unswapped = cross_view_cross_entropy([q[1], q[0]], s, 0.1)
    assert unswapped.item() != pytest.approx(swapped.item(), rel=1e-3)


def test_the_method_s_loss_is_unchanged_when_the_two_global_views_swap(digits):
    method = build_swav(digits).eval()  # eval: batch norm is per sample, so only the order of views differs
    views = random_views(0, BATCH, local=2)
    torch.manual_seed(0)
    loss = method.training_loss(views, None, torch.arange(BATCH))
    swapped = method.training_loss([views[1], views[0], *views[2:]], None, torch.arange(BATCH))
    assert swapped.item() == pytest.approx(loss.item(), rel=1e-5)


def test_the_gradient_treats_the_codes_as_constants(digits):
    method = build_swav(digits).eval()
    views = random_views(1, BATCH, local=2)
    method.training_loss(views, None, torch.arange(BATCH)).backward()
    got = method.prototypes.weight.grad.clone()
    method.zero_grad()
    # The loss again with codes computed apart, as constants.
    with torch.no_grad():
        z = [method.embed(method.backbone(v)) for v in views]
        codes = [swav_sinkhorn(method.prototypes(z[i]), method.epsilon, 3) for i in (0, 1)]
    scores = [method.prototypes(method.embed(method.backbone(v))) for v in views]
    cross_view_cross_entropy(codes, scores, method.temperature).backward()
    torch.testing.assert_close(got, method.prototypes.weight.grad, rtol=1e-4, atol=1e-7)


# --- the queue ----------------------------------------------------------------------------------


def test_the_queue_joins_sinkhorn_only_once_full_and_takes_each_batch_after_its_codes(digits):
    method = build_swav(digits)
    queue = KeyQueue(2 * BATCH, 128)
    queue.keys.zero_()
    embeddings = [F.normalize(torch.randn(BATCH, 128), dim=1) for _ in range(3)]
    for step, z in enumerate(embeddings):
        scores = method.prototypes(z).detach()
        queued = method.prototypes(queue.keys).detach()
        codes = method.assign(scores, z, queue)
        if step < 2:  # empty, then half full: the batch alone
            torch.testing.assert_close(codes, swav_sinkhorn(scores, method.epsilon))
        else:  # full: behind the two earlier batches' embeddings (not this one's), batch rows kept
            assert torch.equal(queued, method.prototypes(torch.cat(embeddings[:2])).detach())
            torch.testing.assert_close(
                codes, swav_sinkhorn(torch.cat([queued, scores]), method.epsilon)[-BATCH:]
            )
            assert not torch.allclose(codes, swav_sinkhorn(scores, method.epsilon), atol=1e-3)
    assert {tuple(r.tolist()) for r in queue.keys} == {tuple(r.tolist()) for r in torch.cat(embeddings[1:])}


def test_the_queue_starts_at_its_epoch_and_is_fitted_to_the_data(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 5000 shrinks to num_train - batch, with a warning
        trainer = Trainer(
            METHODS_DIR / "swav", swav_config(queue_size=5000, queue_start_epoch=1), 0, tmp_path
        )
    method = trainer.method
    assert len(method.queues) == 2 and len(method.queues[0]) == (1347 - BATCH) // BATCH * BATCH
    ctx = trainer.epoch_context()
    method.on_epoch_start(ctx)
    assert not method.queue_started and ctx.log["queue_size"] == 0
    trainer.state.epoch = 1
    ctx = trainer.epoch_context()
    method.on_epoch_start(ctx)
    assert method.queue_started and ctx.log["queue_size"] == len(method.queues[0])
    assert not build_method(METHODS_DIR / "swav", swav_config(queue_size=0), trainer.data, 0).queues


# --- the prototypes --------------------------------------------------------------------------------


def test_prototypes_are_frozen_in_the_first_epoch_and_normalised_after_every_step(tmp_path):
    trainer = Trainer(METHODS_DIR / "swav", swav_config(queue_size=0), 0, tmp_path, progress=False)
    method = trainer.method
    unit = lambda: torch.testing.assert_close(method.prototypes.weight.norm(dim=1), torch.ones(K))
    unit()  # normalised from the start
    before = method.prototypes.weight.detach().clone()
    projector = method.projector[0].weight.detach().clone()
    idx = torch.arange(BATCH)
    g = torch.Generator().manual_seed(0)
    views = lambda: trainer.make_views(trainer.data.train.images[idx], g)
    trainer.train_step(views(), idx, trainer.epoch_context())  # epoch 0: frozen (renormalised: last bits)
    torch.testing.assert_close(method.prototypes.weight, before, rtol=0, atol=1e-7)
    assert not torch.equal(method.projector[0].weight, projector)  # the rest trains
    trainer.state.epoch = 1
    trainer.train_step(views(), idx, trainer.epoch_context())  # epoch 1: LARS moves them, then normalised
    assert not torch.equal(method.prototypes.weight, before)
    unit()


@pytest.mark.parametrize("override", [{"epsilon": 0.01}, {"sinkhorn_iterations": 0}, {"num_prototypes": 0}])
def test_a_bad_setting_is_a_config_error_naming_it(digits, override):
    with pytest.raises(ConfigError, match=f"methods/swav/config.yaml: .*{next(iter(override))}"):
        build_swav(digits, **override)


# --- two processes ---------------------------------------------------------------------------------


def ddp_record(out_dir: Path) -> dict:
    """Codes of sharded cosines, and three training steps with the queue starting at once (two batches
    long: full from the third step), each rank on its shard of a fixed global batch; batch norm in eval
    mode as in tests/methods/test_distributed.py (per-process statistics are the engine's declared
    deviation)."""
    mine = dist.shard(2 * BATCH)
    record = {"codes": swav_sinkhorn(cosines(0, 2 * BATCH, K)[mine])}
    cfg = swav_config(2 * BATCH, queue_size=4 * BATCH, queue_start_epoch=0, freeze_prototypes_epochs=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(METHODS_DIR / "swav", cfg, 0, out_dir, device="cpu", progress=False)
    ctx = trainer.epoch_context()
    trainer.method.on_epoch_start(ctx)
    trainer.method.eval()
    losses, shard = [], dist.shard(2 * BATCH)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        idx = torch.randperm(len(trainer.labels), generator=g)[: 2 * BATCH]
        views = trainer.make_views(trainer.data.train.images[idx], g)
        losses.append(trainer.train_step([v[shard] for v in views], idx[shard], ctx))
    record["losses"] = losses
    record["queue_full"] = bool(trainer.method.queues[0].keys[-1].any())
    record["state"] = {k: v.clone() for k, v in trainer.method.state_dict().items()}
    return record


def ddp_main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_from_env("cpu")
    torch.save(ddp_record(Path(out_dir) / "run"), Path(out_dir) / f"rank{dist.rank()}.pt")
    dist.shutdown()


@pytest.mark.slow
def test_two_processes_give_the_codes_and_losses_of_one_process(tmp_path):
    from test_distributed import torchrun

    run = torchrun(__file__, str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    one = ddp_record(tmp_path / "one")
    torch.testing.assert_close(torch.cat([r["codes"] for r in ranks]), one["codes"], rtol=1e-5, atol=1e-7)
    assert one["queue_full"] and all(r["queue_full"] for r in ranks)  # the third step used the queue
    for step in range(3):
        mean = sum(r["losses"][step] for r in ranks) / 2
        assert mean == pytest.approx(one["losses"][step], rel=1e-5), step
    for r in ranks:
        for name, value in one["state"].items():
            torch.testing.assert_close(r["state"][name], value, rtol=1e-4, atol=1e-6, msg=name)


if __name__ == "__main__":  # under torchrun: the 2-process side
    ddp_main(sys.argv[1])


def test_prototype_usage_counts_the_prototypes_the_images_fall_on(digits):
    """One prototype on every embedding's side and the others opposite it: all images use one; random
    prototypes spread them. Measuring changes no tensor and draws no random number."""
    method = build_swav(digits).eval()  # as forward_train_set runs it: batch norm keeps its statistics
    images = digits.train.images[:40].float()
    on_images = lambda fn: fn(images)  # noqa: E731 (forward_train_set on 40 images)
    assert 1 < method.health(on_images)["prototype_usage"] <= K
    with torch.no_grad():
        z = method.embed(method.backbone(images))
        method.prototypes.weight.copy_(-F.normalize(z.mean(0), dim=0).expand(K, -1))
        method.prototypes.weight[3] *= -1  # the only one facing the embeddings
    before, rng = {k: v.clone() for k, v in method.state_dict().items()}, torch.get_rng_state()
    assert method.health(on_images)["prototype_usage"] == pytest.approx(1.0)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in method.state_dict().items())
