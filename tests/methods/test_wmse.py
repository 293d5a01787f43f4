"""W-MSE (methods/wmse): the loss by hand (whitened views, 2 - 2 cos, averaged over pairs and w_iter), its
independence of the random sub-batches when one sub-batch is the whole batch, and the settings it refuses.
tests/methods/test_distributed.py runs it under 2 real gloo processes against one on the whole batch."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from support import random_views

from sslbench.errors import ConfigError
from sslbench.kit.whitening import whiten, whiten_sub_batches

SMALL = {"proj_dim": 4, "w_size": 8}  # two sub-batches of the 16 images of random_views


def embeddings(method, views):
    return method.head(torch.cat([method.backbone(v) for v in views])).chunk(len(views))


def two_minus_two_cos(a, b):
    return (2 - 2 * F.cosine_similarity(a, b, dim=1)).mean()


def test_loss_by_hand_with_the_sub_batches_the_global_generator_draws(build):
    method = build("wmse", **SMALL)
    views = random_views()
    torch.manual_seed(5)
    loss = method.training_loss(views, None, torch.arange(16))
    torch.manual_seed(5)
    order = torch.randperm(16)
    with torch.no_grad():
        h1, h2 = embeddings(method, views)
    expected = two_minus_two_cos(whiten_sub_batches(h1, order, 8), whiten_sub_batches(h2, order, 8))
    torch.testing.assert_close(loss, expected)


def test_one_sub_batch_of_the_whole_batch_makes_the_draw_irrelevant_and_w_iter_a_plain_mean(build):
    method = build("wmse", proj_dim=4, w_size=16, w_iter=3)
    views = random_views(seed=1)
    losses = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        losses.append(method.training_loss(views, None, torch.arange(16)))
    with torch.no_grad():
        h1, h2 = embeddings(method, views)
    torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(losses[0], two_minus_two_cos(whiten(h1), whiten(h2)))


def test_four_views_average_the_six_pairs(build):
    method = build("wmse", num_views=4, proj_dim=4, w_size=16)
    views = random_views(seed=2) + random_views(seed=3)
    loss = method.training_loss(views, None, torch.arange(16))
    with torch.no_grad():
        z = [whiten(h) for h in embeddings(method, views)]
    pairs = list(itertools.combinations(range(4), 2))
    expected = sum(two_minus_two_cos(z[i], z[j]) for i, j in pairs) / len(pairs)
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("settings", [{"proj_dim": 64, "w_size": 64}, {"proj_dim": 4, "w_size": 48}])
def test_a_sub_batch_that_cannot_be_whitened_or_split_is_refused(build, settings):
    with pytest.raises(ConfigError, match="w_size"):
        build("wmse", **settings)
