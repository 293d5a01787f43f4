"""MMCR (methods/mmcr): the loss (sslbench.kit.losses.mmcr) by hand and by its reductions, and the method's
loss as the negative nuclear norm of its views' centroids. tests/methods/test_distributed.py runs it under 2
real gloo processes against one on the whole batch."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import random_views

from sslbench.kit.losses import mmcr
from sslbench.kit.method import embed_views


def test_orthogonal_centroids_give_minus_the_batch_size():
    # three images whose views all point along e_1, e_2, e_3 (any length): centroids = I, nuclear norm 3
    z = torch.eye(3).unsqueeze(1).repeat(1, 4, 1) * torch.tensor([1.0, 2.0, 5.0, 0.5]).view(1, 4, 1)
    assert mmcr(z).item() == pytest.approx(-3.0)


def test_centroids_by_hand_and_views_that_cancel():
    # image 1: views e1, e2 -> centroid (1/2, 1/2, 0); image 2: e3, e3 -> (0, 0, 1): orthogonal rows of
    # lengths 1/sqrt 2 and 1, nuclear norm 1 + 1/sqrt 2. Opposite views have centroid 0.
    z = torch.tensor([[[1.0, 0, 0], [0, 1, 0]], [[0, 0, 1], [0, 0, 1]]])
    assert mmcr(z).item() == pytest.approx(-(1 + 1 / math.sqrt(2)))
    assert mmcr(torch.tensor([[[1.0, 0], [-1.0, 0]]])).item() == pytest.approx(0.0, abs=1e-7)


def test_one_view_reduces_to_the_nuclear_norm_of_the_normalised_embeddings():
    z = torch.randn(10, 1, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = -torch.linalg.matrix_norm(F.normalize(z[:, 0], dim=1), ord="nuc")
    torch.testing.assert_close(mmcr(z), expected)


def test_the_local_term_is_lmbda_times_the_mean_nuclear_norm_of_each_image_s_views():
    z = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    unit = F.normalize(z, dim=-1)
    local = sum(torch.linalg.matrix_norm(unit[b].T, ord="nuc") for b in range(5)) / 5
    torch.testing.assert_close(mmcr(z, lmbda=0.7) - mmcr(z), 0.7 * local)


def test_the_method_s_loss_is_minus_the_nuclear_norm_of_its_views_centroids(build):
    method = build("mmcr", num_views=3)
    views = random_views() + random_views(seed=1)[:1]
    loss = method.training_loss(views, None, torch.arange(16))
    with torch.no_grad():
        z = embed_views(method.backbone, method.projector, views)  # one batch: the BN statistics of all views
    assert z.shape == (16, 3, 128)
    torch.testing.assert_close(loss, -torch.linalg.matrix_norm(z.mean(dim=1), ord="nuc"))
