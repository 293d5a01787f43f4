"""Supervised cross-entropy: the loss is CE of the linear classifier on the backbone, with the true labels."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, fixed_batch_losses, tiny_digits

from sslbench.pretrain.trainer import Trainer, build_method


@pytest.fixture(scope="module")
def digits():
    return tiny_digits()


def build(method_config, digits, seed=0):
    return build_method(METHODS_DIR / "supervised", method_config("supervised"), digits, seed)


def batch(seed=0, size=16):
    g = torch.Generator().manual_seed(seed)
    return (
        [torch.randn(size, 1, 8, 8, generator=g)],
        torch.randint(0, 10, (size,), generator=g),
        torch.arange(size),
    )


def test_classifier_covers_the_classes(method_config, digits):
    method = build(method_config, digits)
    assert (method.classifier.in_features, method.classifier.out_features) == (method.feature_dim, 10)
    assert method.num_views == 1 and method.needs_labels and method.encoder() is method.backbone


def test_loss_is_cross_entropy_of_the_classifier(method_config, digits):
    method = build(method_config, digits)
    views, labels, idx = batch()
    expected = F.cross_entropy(method.classifier(method.backbone(views[0])), labels)
    torch.testing.assert_close(method.training_loss(views, labels, idx), expected)


def test_labels_are_used(method_config, digits):
    method = build(method_config, digits)
    views, labels, idx = batch()
    wrong = (labels + 1) % 10
    assert not torch.isclose(
        method.training_loss(views, labels, idx), method.training_loss(views, wrong, idx)
    )
    with pytest.raises(ValueError, match="labels"):
        method.training_loss(views, None, idx)


def test_trains_on_tiny_config(tmp_path, method_config):
    trainer = Trainer(METHODS_DIR / "supervised", method_config("supervised"), 0, tmp_path, progress=False)
    # A fixed batch and fixed views: SGD steps must lower the loss.
    losses = fixed_batch_losses(trainer, steps=12, labelled=True)
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0], losses
    # And the engine's loop runs its epochs with finite losses that fall.
    fresh = Trainer(
        METHODS_DIR / "supervised", method_config("supervised"), 0, tmp_path / "run", progress=False
    )
    fresh.fit()
    epoch_losses = [row["loss"] for row in fresh.log_rows]
    assert len(epoch_losses) == 2 and all(math.isfinite(v) for v in epoch_losses)
    assert epoch_losses[1] < epoch_losses[0]
