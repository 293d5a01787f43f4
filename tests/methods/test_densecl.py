"""DenseCL (methods/densecl): its loss by hand (the global InfoNCE and the dense one over matched positions,
weighted by lambda), its reduction to MoCo's loss at lambda 0, the two queues' keys, and the neck. The dense
maths is pinned in tests/kit/test_dense.py; tests/methods/test_distributed.py runs the method under 2 real
gloo processes against one on the whole batch."""

import torch
import torch.nn.functional as F
from support import random_views
from torch import nn

from sslbench.kit.losses import info_nce


def step_by_hand(method, views, seed):
    """The two losses written out from the method's networks and its queues before the step, and the
    matched positions."""
    queue, dense_queue = method.queue.keys.clone(), method.dense_queue.keys.clone()
    with torch.no_grad():
        fmap_q = method.backbone.forward_features(views[0]).flatten(2)  # [B, C, P]
        q = F.normalize(method.neck.mlp(method.backbone(views[0])), dim=1)
        q_grid = F.normalize(method.neck.dense_mlp(fmap_q.transpose(1, 2)).transpose(1, 2), dim=1)
        torch.manual_seed(seed)  # the key encoder's shuffle: the draw training_loss makes
        k, k_grid, k2, fmap_k = method.key_encoder(views[1])
    match = (F.normalize(fmap_q, dim=1).transpose(1, 2) @ fmap_k).argmax(dim=2)  # fmap_k: normalised already
    rows_q, rows_k = [], []
    for b in range(q.shape[0]):
        for i in range(q_grid.shape[2]):
            rows_q.append(q_grid[b, :, i])
            rows_k.append(k_grid[b, :, match[b, i]])
    single = info_nce(q, k, queue, method.temperature)
    dense = info_nce(torch.stack(rows_q), torch.stack(rows_k), dense_queue, method.temperature)
    return single, dense, match


def test_loss_by_hand_global_and_dense_weighted_by_lambda(build):
    method = build("densecl", bn_splits=2, loss_lambda=0.3)
    x = torch.randn(16, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    views = [x, x.flip(-1)]  # the key view mirrored: its matches are mostly the mirrored positions
    assert method.backbone.forward_features(x).shape[-2:] == (2, 2)  # 4 positions (the small stem)
    single, dense, match = step_by_hand(method, views, seed=5)
    assert not torch.equal(match, torch.arange(4).expand(16, -1))  # the correspondence is not the identity
    torch.manual_seed(5)
    loss = method.training_loss(views, None, torch.arange(16))
    torch.testing.assert_close(loss, 0.7 * single + 0.3 * dense)
    assert abs(float(single - dense)) > 1e-3  # the two terms differ: lambda is seen


def test_at_lambda_zero_it_is_moco_s_loss_on_the_global_embedding(build):
    method = build("densecl", bn_splits=2, loss_lambda=0.0)
    views = random_views(seed=1)
    single, _, _ = step_by_hand(method, views, seed=6)
    torch.manual_seed(6)
    torch.testing.assert_close(method.training_loss(views, None, torch.arange(16)), single)


def test_the_queues_take_the_global_keys_and_the_dense_keys_mean_after_the_loss(build):
    method = build("densecl", bn_splits=2)
    views = random_views(seed=2)
    before = method.dense_queue.keys.clone()
    torch.manual_seed(7)
    with torch.no_grad():
        k, _, k2, _ = method.key_encoder(views[1])
    torch.manual_seed(7)
    method.training_loss(views, None, torch.arange(16))
    torch.testing.assert_close(method.queue.keys[:16], k)
    torch.testing.assert_close(method.dense_queue.keys[:16], k2)
    assert torch.equal(method.dense_queue.keys[16:], before[16:])


def test_the_dense_keys_mean_is_the_normalised_average_of_the_dense_embeddings(build):
    method = build("densecl", bn_splits=1)
    x = random_views(seed=3)[0]
    _, grid, mean, _ = method.key_encoder.embed(x)
    with torch.no_grad():
        fmap = method.key_encoder.net[0].forward_features(x).flatten(2)
        raw = method.key_encoder.net[1].dense_mlp(fmap.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(mean, F.normalize(raw.mean(dim=2), dim=1))
    torch.testing.assert_close(grid, F.normalize(raw, dim=1))


def test_the_neck_global_mlp_is_kaiming_initialised_and_the_dense_one_is_not(build):
    method = build("densecl", hidden_dim=512, dim=64)
    first, last = method.neck.mlp[0], method.neck.mlp[2]
    dense_bias = method.neck.dense_mlp[2].bias.detach()
    assert [type(m) for m in method.neck.mlp] == [nn.Linear, nn.ReLU, nn.Linear] and last.out_features == 64
    assert not first.bias.detach().any() and not last.bias.detach().any()
    assert (
        abs(float(last.weight.detach().std()) - (2 / 512) ** 0.5) < 0.1 * (2 / 512) ** 0.5
    )  # Kaiming, fan in 512
    assert dense_bias.abs().max() > 0  # torch's default init (uniform bias)
    assert method.projection_head() is method.neck.mlp


def test_the_key_encoder_returns_each_of_its_outputs_in_the_batch_s_order(build):
    method = build("densecl", bn_splits=2)
    method.key_encoder.eval()  # batch norm per image: the shuffle is then invisible in the outputs
    x = random_views(seed=4)[1]
    for shuffled, plain in zip(method.key_encoder(x), method.key_encoder.embed(x), strict=True):
        torch.testing.assert_close(shuffled, plain)
