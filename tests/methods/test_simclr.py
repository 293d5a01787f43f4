"""SimCLR (methods/simclr): google-research/simclr's summed loss and its batch-norm projection head."""

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, fixed_batch_losses, random_views
from torch import nn

from sslbench.kit.method import embed_views
from sslbench.plugins import load_method_class
from sslbench.pretrain.trainer import Trainer

LARGE_NUM = 1e9  # objective.py's mask value
simclr_method = inspect.getmodule(load_method_class(METHODS_DIR / "simclr"))  # its nt_xent_sum


def official_contrastive_loss(hidden1, hidden2, temperature):
    """google-research/simclr objective.py add_contrastive_loss (one replica), re-derived with torch:
    loss_a + loss_b, each a softmax cross-entropy averaged over the batch."""
    batch_size = hidden1.shape[0]
    labels = F.one_hot(torch.arange(batch_size), batch_size * 2).to(hidden1.dtype)
    masks = F.one_hot(torch.arange(batch_size), batch_size).to(hidden1.dtype)
    logits_aa = hidden1 @ hidden1.T / temperature - masks * LARGE_NUM
    logits_bb = hidden2 @ hidden2.T / temperature - masks * LARGE_NUM
    logits_ab = hidden1 @ hidden2.T / temperature
    logits_ba = hidden2 @ hidden1.T / temperature
    loss_a = F.cross_entropy(torch.cat([logits_ab, logits_aa], 1), labels)
    loss_b = F.cross_entropy(torch.cat([logits_ba, logits_bb], 1), labels)
    return loss_a + loss_b


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_loss_is_objective_py_sum_of_both_directions(seed, temperature):
    g = torch.Generator().manual_seed(seed)
    h1, h2 = (F.normalize(torch.randn(9, 6, generator=g, dtype=torch.float64), dim=1) for _ in range(2))
    loss = simclr_method.nt_xent_sum(torch.stack([h1, h2], dim=1), temperature)
    assert loss.item() == pytest.approx(official_contrastive_loss(h1, h2, temperature).item(), rel=1e-12)


def test_loss_on_collapsed_features_is_twice_log_of_the_other_views():
    # every similarity is 1: each anchor's softmax is uniform over the 2B - 1 other views
    z = F.normalize(torch.ones(5, 2, 4, dtype=torch.float64), dim=-1)
    assert simclr_method.nt_xent_sum(z, 0.5).item() == pytest.approx(2 * math.log(2 * 5 - 1), rel=1e-12)


def test_training_loss_is_the_summed_loss_of_the_jointly_embedded_views(build):
    method = build("simclr")
    views = random_views(n=12)
    loss = method.training_loss(views, None, torch.arange(12))
    z = embed_views(method.backbone, method.projector, views)
    z1, z2 = z.unbind(1)
    torch.testing.assert_close(loss, official_contrastive_loss(z1, z2, 0.5))


def test_projection_head_has_batch_norm_in_every_layer_as_model_util(tmp_path, method_config, build):
    method = build("simclr")
    head, d = method.projector, method.feature_dim
    kinds = [type(m) for m in head]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d]
    hidden, hidden_bn, _, output, output_bn = head
    assert (hidden.in_features, hidden.out_features, output.out_features) == (d, d, 128)
    assert hidden.bias is None and output.bias is None  # use_bias and not use_bn
    assert hidden_bn.bias.requires_grad and not output_bn.bias.requires_grad  # center: hidden only
    assert hidden.weight.std().item() == pytest.approx(0.01, rel=0.2)  # N(0, 0.01^2) initialiser
    # In training each output unit is centred over the batch with a learnt scale and no shift.
    out = head(torch.randn(32, d, generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(out.mean(0), torch.zeros(128), atol=1e-5, rtol=0)
    # After training the output shift is still zero while the other batch-norm parameters moved.
    trainer = Trainer(METHODS_DIR / "simclr", method_config("simclr"), 0, tmp_path, progress=False)
    initial = {k: v.clone() for k, v in trainer.method.projector.state_dict().items()}
    fixed_batch_losses(trainer, 2, labelled=False)
    after = trainer.method.projector.state_dict()
    assert torch.equal(after["4.bias"], torch.zeros(128))
    for key in ("1.weight", "1.bias", "4.weight"):
        assert not torch.equal(after[key], initial[key]), key
