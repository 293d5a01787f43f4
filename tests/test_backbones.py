import pytest
import torch

from sslbench.backbones import BackboneError, create_backbone


@pytest.mark.parametrize("channels", [1, 3])
def test_pooled_features_and_channels(channels):
    model = create_backbone("test_resnet", in_chans=channels)
    out = model(torch.randn(2, channels, 16, 16))
    assert out.shape == (2, model.num_features)


def test_small_stem_is_3x3_stride1_without_maxpool():
    model = create_backbone("test_resnet", in_chans=3, small_stem=True)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)
    # The stem keeps the resolution: the first stage sees the full 8x8 image.
    stem = torch.nn.Sequential(model.conv1, model.bn1, model.act1, model.maxpool)
    assert stem(torch.randn(1, 3, 8, 8)).shape[-2:] == (8, 8)
    plain = create_backbone("test_resnet", in_chans=3)
    plain_stem = torch.nn.Sequential(plain.conv1, plain.bn1, plain.act1, plain.maxpool)
    assert plain_stem(torch.randn(1, 3, 8, 8)).shape[-2:] == (2, 2)


def test_unknown_backbone_is_a_clear_error():
    with pytest.raises(BackboneError, match="resnet_18"):
        create_backbone("resnet_18")


def test_an_mlp_layer_is_named_and_an_unknown_name_is_a_clear_error():
    vit = create_backbone("test_vit", image_size=32, mlp_layer="swiglu_packed", act_layer="silu")
    assert type(vit.blocks[0].mlp).__name__ == "GluMlp" and isinstance(vit.blocks[0].mlp.act, torch.nn.SiLU)
    with pytest.raises(BackboneError, match="mlp_layer` = 'swiglu'.*swiglu_packed"):
        create_backbone("test_vit", mlp_layer="swiglu")


def test_small_stem_on_a_non_resnet_is_refused():
    with pytest.raises(BackboneError, match="small_stem"):
        create_backbone("test_vit", small_stem=True)


def test_cls_avgpool_interleaves_the_class_token_and_the_mean_patch_token_as_dino_does():
    """DINO's eval_linear.py stacks [cls, mean patch] on a last axis and reshapes: channel c of the class
    token, then channel c of the mean patch token, for every c."""
    from sslbench.backbones import feature_reader

    vit = create_backbone(
        "vit_tiny_patch16_224", in_chans=1, img_size=16, patch_size=4, depth=2, embed_dim=24, num_heads=2
    )
    x = torch.randn(3, 1, 16, 16)
    features = feature_reader(vit, {"features": "cls_avgpool"})(x)
    ((patches, prefix),) = vit.get_intermediate_layers(x, n=1, return_prefix_tokens=True, norm=True)
    assert features.shape == (3, 48)
    assert torch.equal(features[:, 0::2], prefix[:, 0]) and torch.equal(features[:, 1::2], patches.mean(1))
