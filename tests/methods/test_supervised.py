"""Supervised cross-entropy: the loss is CE of the linear classifier on the backbone, with the true labels."""

import pytest
import torch
import torch.nn.functional as F
from support import assert_trains


def batch(seed=0, size=16):
    g = torch.Generator().manual_seed(seed)
    return (
        [torch.randn(size, 1, 8, 8, generator=g)],
        torch.randint(0, 10, (size,), generator=g),
        torch.arange(size),
    )


def test_classifier_covers_the_classes(build):
    method = build("supervised")
    assert (method.classifier.in_features, method.classifier.out_features) == (method.feature_dim, 10)
    assert method.num_views == 1 and method.needs_labels and method.encoder() is method.backbone


def test_loss_is_cross_entropy_of_the_classifier(build):
    method = build("supervised")
    views, labels, idx = batch()
    expected = F.cross_entropy(method.classifier(method.backbone(views[0])), labels)
    torch.testing.assert_close(method.training_loss(views, labels, idx), expected)


def test_labels_are_used(build):
    method = build("supervised")
    views, labels, idx = batch()
    wrong = (labels + 1) % 10
    assert not torch.isclose(
        method.training_loss(views, labels, idx), method.training_loss(views, wrong, idx)
    )
    with pytest.raises(ValueError, match="labels"):
        method.training_loss(views, None, idx)


def test_trains_on_tiny_config(tmp_path, method_config):
    epoch_losses = assert_trains(method_config, "supervised", tmp_path, shrink=0.8)
    assert epoch_losses[1] < epoch_losses[0]
