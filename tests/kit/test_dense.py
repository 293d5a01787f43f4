"""sslbench/kit/dense.py: the dense correspondence by hand and as a recovered permutation, its invariance to
the scale of each position's feature, the gather of matched positions, and the feature map of a CNN and of a
ViT against the backbone's own pooled output."""

import timm
import torch

from sslbench.kit.dense import dense_correspondence, feature_map, gather_positions


def test_each_query_position_matches_the_key_position_of_largest_cosine_by_hand():
    query = torch.tensor([[[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]])  # positions (1, 0), (0, 1), (1, 1)
    key = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 0.0, 1.1]]])  # positions (0, 2), (3, 0), (1, 1.1)
    # (1, 0) is closest in angle to (3, 0); (0, 1) to (0, 2); (1, 1) to (1, 1.1), though (3, 0) has the
    # largest dot product with it: cosine, not dot product
    assert dense_correspondence(query, key).tolist() == [[1, 0, 2]]


def test_a_permuted_copy_of_the_map_is_matched_back_to_each_position():
    g = torch.Generator().manual_seed(0)
    query = torch.randn(3, 16, 9, generator=g)
    perm = torch.randperm(9, generator=g)
    key = query[:, :, perm] * torch.rand(3, 1, 9, generator=g).add(0.5)  # positions scaled: cosine ignores it
    expected = torch.argsort(perm).expand(3, -1)  # query position i sits at key position j with perm[j] = i
    assert torch.equal(dense_correspondence(query, key), expected)


def test_matched_positions_are_gathered_image_by_image():
    key_grid = torch.arange(2 * 2 * 3, dtype=torch.float32).view(2, 2, 3)  # [B 2, D 2, P 3]
    index = torch.tensor([[2, 2, 0], [1, 0, 1]])
    out = gather_positions(key_grid, index)
    assert out.shape == (2, 2, 3)
    assert torch.equal(out[0], key_grid[0][:, [2, 2, 0]]) and torch.equal(out[1], key_grid[1][:, [1, 0, 1]])


def test_a_cnn_s_feature_map_is_the_grid_its_own_pooling_averages():
    net = timm.create_model("test_resnet", num_classes=0, in_chans=1).eval()
    x = torch.randn(2, 1, 64, 64)
    pooled, fmap = feature_map(net, x)
    assert fmap.shape == (2, net.num_features, 4)  # 2 x 2 at 64 px
    torch.testing.assert_close(pooled, net(x))
    torch.testing.assert_close(fmap.mean(dim=2), pooled)


def test_a_vit_s_feature_map_is_its_patch_tokens_without_the_class_token():
    net = timm.create_model(
        "vit_tiny_patch16_224",
        num_classes=0,
        in_chans=1,
        img_size=16,
        patch_size=4,
        depth=1,
        embed_dim=32,
        num_heads=2,
    ).eval()
    x = torch.randn(2, 1, 16, 16)
    pooled, fmap = feature_map(net, x)
    tokens = net.forward_features(x)
    assert fmap.shape == (2, 32, 16)  # 4 x 4 patches
    torch.testing.assert_close(fmap, tokens[:, 1:].transpose(1, 2))
    torch.testing.assert_close(pooled, net(x))
