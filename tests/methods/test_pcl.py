"""PCL (methods/pcl): warm-up, E-step, ProtoNCE through the method, training, on tiny inputs."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, REPO, preset_config

from sslbench.data.registry import load_data
from sslbench.kit.losses import PROTO_NCE_FORMS, info_nce, proto_nce
from sslbench.plan.checks import load_yaml
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import Trainer, build_method

BATCH = 64  # the tiny suite's batch size (tests/support.py)


def config(method_config, **overrides):
    return method_config("pcl", **{"queue_size": 2 * BATCH, **overrides})


def trainer(tmp_path, method_config, **overrides):
    return Trainer(METHODS_DIR / "pcl", config(method_config, **overrides), 0, tmp_path, progress=False)


def e_step(t: Trainer) -> dict:
    """Run the method's epoch hook as the engine does, with the real training set."""
    ctx = t.epoch_context()
    t.method.on_epoch_start(ctx)
    return ctx.log


def batch(t: Trainer, seed=0):
    g = torch.Generator().manual_seed(seed)
    indices = torch.randperm(len(t.labels), generator=g)[:BATCH]
    return t.make_views(t.data.train.images[indices], g), indices


def capture_outputs(module):
    outputs = []
    module.register_forward_hook(lambda mod, args, out: outputs.append(out.detach().clone()))
    return outputs


@pytest.mark.parametrize("form", PROTO_NCE_FORMS)
def test_warm_up_loss_is_infonce_alone_and_then_adds_the_mean_protonce(tmp_path, method_config, form):
    t = trainer(tmp_path, method_config, warmup_epochs=1, num_clusters=[10, 20, 40], proto_logits=form)
    method = t.method.train()
    log = e_step(t)  # epoch 0 < warmup_epochs: no clustering
    assert "estep_seconds" not in log and (method.assignments == -1).all()

    def loss_and_parts(seed):
        queue = method.queue.keys.clone()
        queries, keys = capture_outputs(method.projector), capture_outputs(method.key_encoder)
        views, indices = batch(t, seed)
        loss = method.training_loss(views, None, indices)
        q, k = F.normalize(queries[-1], dim=1), F.normalize(keys[-1], dim=1)
        return loss, info_nce(q, k, queue, method.temperature), q, indices

    loss, infonce, _, _ = loss_and_parts(0)
    torch.testing.assert_close(loss, infonce)

    t.state.epoch = 1  # warm-up over: the next epoch starts with an E-step
    e_step(t)
    loss, infonce, q, indices = loss_and_parts(1)
    protos = [
        proto_nce(q, method.prototype(m), method.assignments[m][indices], method.phi(m), form=form)
        for m in range(3)
    ]
    torch.testing.assert_close(loss, infonce + sum(protos) / 3)


def test_e_step_gives_unit_prototypes_concentrations_of_mean_t_and_assigns_every_image(
    tmp_path, method_config
):
    t = trainer(tmp_path, method_config, warmup_epochs=0, num_clusters=[10, 25])
    method = t.method
    log = e_step(t)
    num_train = len(t.labels)
    assert method.assignments.shape == (2, num_train)
    for m, k in enumerate([10, 25]):
        prototypes, phi, assigned = method.prototype(m), method.phi(m), method.assignments[m]
        assert prototypes.shape == (k, 128)
        torch.testing.assert_close(prototypes.norm(dim=1), torch.ones(k))
        assert phi.shape == (k,) and (phi > 0).all()
        assert phi.mean().item() == pytest.approx(method.temperature, rel=1e-5)
        assert assigned.min() >= 0 and assigned.max() < k  # every training image has a cluster
        sizes = torch.bincount(assigned, minlength=k)
        assert log[f"k{k}_size_max"] == sizes.max() and log[f"k{k}_size_min"] == sizes.min()
        assert log[f"k{k}_empty"] == int((sizes == 0).sum())
    assert log["estep_seconds"] > 0
    # The assignment of an image is its momentum feature's cluster: the nearest prototype
    # agrees for the vast majority (k-means clusters by L2 distance to un-normalised centroids).
    features = t.forward_train_set(lambda x: F.normalize(method.key_encoder.embed(x), dim=1))
    nearest = (features @ method.prototype(0).T).argmax(dim=1)
    assert (nearest == method.assignments[0]).float().mean() > 0.9


def test_fixed_concentration_sets_every_phi_and_keeps_the_clustering(tmp_path, method_config):
    """The paper's ablation: phi fixed for every prototype; the E-step's clusters are the estimated run's."""
    estimated = trainer(tmp_path / "estimated", method_config, warmup_epochs=0, num_clusters=[10, 25])
    fixed = trainer(
        tmp_path / "fixed", method_config, warmup_epochs=0, num_clusters=[10, 25], fixed_concentration=0.3
    )
    e_step(estimated), e_step(fixed)
    for m, k in enumerate([10, 25]):
        torch.testing.assert_close(fixed.method.phi(m), torch.full((k,), 0.3))
        assert estimated.method.phi(m).std() > 0  # the estimate differs per cluster
        assert torch.equal(fixed.method.assignments[m], estimated.method.assignments[m])
        torch.testing.assert_close(fixed.method.prototype(m), estimated.method.prototype(m))


def test_protonce_with_r_negatives_contrasts_the_batch_positives_and_the_drawn_negatives(
    tmp_path, method_config
):
    """The loss redone from the ids the method drew: for each granularity, query i against the batch's
    positive prototypes (one per query, repeats kept) then the r drawn negatives, each logit divided
    by its prototype's concentration, target column i (main_pcl.py / pcl/builder.py)."""
    r = 100  # <= min(num_clusters) - batch = 136
    t = trainer(tmp_path, method_config, warmup_epochs=0, num_clusters=[200, 300], num_negatives=r)
    method = t.method.train()
    e_step(t)
    draws = []
    for seed in range(3):
        queue = method.queue.keys.clone()
        queries, keys = capture_outputs(method.projector), capture_outputs(method.key_encoder)
        views, indices = batch(t, seed)
        loss = method.training_loss(views, None, indices)
        q, k = F.normalize(queries[-1], dim=1), F.normalize(keys[-1], dim=1)
        terms = []
        for m, num_clusters in enumerate([200, 300]):
            negatives, positives = method.last_negative_ids[m], method.assignments[m][indices]
            assert len(negatives) == r and len(set(negatives.tolist())) == r
            assert not set(positives.tolist()) & set(negatives.tolist())
            assert 0 <= negatives.min() and negatives.max() < num_clusters
            candidates = torch.cat([positives, negatives])
            logits = q @ method.prototype(m)[candidates].T / method.phi(m)[candidates]
            terms.append(F.cross_entropy(logits, torch.arange(len(q))))
            draws.append(negatives)
        torch.testing.assert_close(loss, info_nce(q, k, queue, method.temperature) + sum(terms) / 2)
    assert not torch.equal(draws[0], draws[2])  # a fresh draw at every step


def test_infeasible_settings_are_rejected(method_config):
    def build(**overrides):
        cfg = config(method_config, **overrides)
        return build_method(METHODS_DIR / "pcl", cfg, load_data(cfg), 0)

    with pytest.raises(ValueError, match="num_negatives"):
        build(num_clusters=[200, 300], num_negatives=137)  # a batch may cover 64 of the 200 clusters
    with pytest.raises(ValueError, match="num_clusters"):
        build(num_clusters=[10, 5000])  # more clusters than the 1347 training images
    with pytest.raises(ValueError, match="num_clusters"):
        build(num_clusters=[])
    with pytest.raises(ValueError, match="proto_logits"):
        build(proto_logits="eq10")
    for phi in (0, -0.1, "0.1", True):
        with pytest.raises(ValueError, match="fixed_concentration"):
            build(fixed_concentration=phi)


def test_clustering_state_has_fixed_shapes_and_reloads(tmp_path, method_config):
    t = trainer(tmp_path, method_config, warmup_epochs=0)
    e_step(t)
    fresh = trainer(tmp_path / "fresh", method_config, warmup_epochs=0).method
    fresh.load_state_dict(t.method.state_dict())  # the shapes do not depend on an E-step having run
    assert torch.equal(fresh.assignments, t.method.assignments)
    assert torch.equal(fresh.prototype(2), t.method.prototype(2))


@pytest.mark.filterwarnings("ignore:pcl. version 2 uses")  # no augmentation, on purpose
def test_training_lowers_the_loss_after_the_first_e_step(tmp_path, method_config):
    # Identical views make the task easy, so the loss falls within tiny epochs whatever the seed
    # (see tests/methods/test_moco.py).
    t = trainer(tmp_path, method_config, warmup_epochs=1, augment={"preset": "none"}, train={"epochs": 4})
    rows = [t.train_epoch() for _ in range(4)]
    losses = [row["loss"] for row in rows]
    assert all(math.isfinite(v) for v in losses)
    assert "estep_seconds" not in rows[0] and all("estep_seconds" in row for row in rows[1:])
    # Epoch 1 is InfoNCE alone; from epoch 2 on the ProtoNCE terms are added, and they fall.
    assert losses[1] > losses[0] + 1.0
    assert losses[3] < losses[2] - 0.2 and losses[2] < losses[1] - 0.5


def runs_pcl(path) -> bool:
    methods = load_yaml(path).get("methods", "all")  # a preset without `methods` keeps the default's all
    return methods == "all" or "pcl" in methods


PRESETS = sorted(p.stem for p in (REPO / "config").glob("*.yaml") if p.stem != "schema" and runs_pcl(p))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_the_official_logits_and_says_so(preset):
    path = REPO / "config" / f"{preset}.yaml"
    params = resolve_method_config(preset_config(preset), METHODS_DIR, "pcl")["params"]
    assert params["proto_logits"] == "official"
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    assert "proto_logits: official" in header
