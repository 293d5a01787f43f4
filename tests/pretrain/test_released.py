"""Released weights: every official format reads back into a timm backbone with identical weights; files
built here with the official key names written out pin the real layouts; mismatches name file and key."""

import argparse
import importlib
import sys
import textwrap

import pytest
import timm
import torch
import torch.nn.functional as F

from sslbench.backbones import create_backbone
from sslbench.pretrain import released
from sslbench.pretrain.official_files import example_heads, write_official
from sslbench.pretrain.released import backbone_state, load_backbone
from sslbench.weightfiles import FORMATS, ReleasedWeightsError

TRACKED = "num_batches_tracked"


def tiny(seed: int = 0, name: str = "test_resnet") -> torch.nn.Module:
    """A timm backbone whose every parameter and BatchNorm statistic is random (so a stale one shows)."""
    torch.manual_seed(seed)
    model = timm.create_model(name, num_classes=0)
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if key.endswith(TRACKED):
                value.fill_(7)
            elif key.endswith("running_var"):
                value.uniform_(0.5, 1.5)
            else:
                value.normal_(0, 0.1)
    return model.eval()


def randomized(model: torch.nn.Module, std: float = 0.2) -> torch.nn.Module:
    """``model`` with every parameter and buffer of its state dict drawn N(0, std), in eval mode."""
    with torch.no_grad():
        for value in model.state_dict().values():
            value.normal_(0, std)
    return model.eval()


def fresh(name: str = "test_resnet") -> torch.nn.Module:
    return timm.create_model(name, num_classes=0)


def assert_same_backbone(loaded, reference, batches_tracked: bool = True):
    got, want = loaded.state_dict(), reference.state_dict()
    assert list(got) == list(want)
    for key in want:
        if key.endswith(TRACKED) and not batches_tracked:
            assert got[key].item() == 0, key  # absent from the file: filled in as torch's BatchNorm does
        else:
            assert torch.equal(got[key], want[key]), key
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x), reference.eval()(x))


def linear(key: str, out: int, into: int, bias: bool = True) -> dict:
    return {f"{key}.weight": torch.randn(out, into)} | ({f"{key}.bias": torch.randn(out)} if bias else {})


def bn(key: str, n: int) -> dict:
    return {
        f"{key}.weight": torch.rand(n),
        f"{key}.bias": torch.randn(n),
        f"{key}.running_mean": torch.randn(n),
        f"{key}.running_var": torch.rand(n),
        f"{key}.num_batches_tracked": torch.tensor(5),
    }


def prefixed(prefix: str, state: dict) -> dict:
    return {prefix + k: v for k, v in state.items()}


# ------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_reads_back_what_it_wrote_with_heads(fmt, tmp_path):
    model = tiny()
    path = tmp_path / "released.pth"
    write_official(
        model.state_dict(), fmt, path, heads=example_heads(fmt, model.state_dict(), model.num_features)
    )

    loaded = load_backbone(fresh(), backbone_state(path, fmt), path, fmt)

    assert_same_backbone(loaded, model, FORMATS[fmt].batches_tracked)


@pytest.mark.parametrize("fmt", [name for name, f in FORMATS.items() if f.backbone_file])
def test_a_backbone_only_release_is_a_bare_state_dict_of_plain_keys(fmt, tmp_path):
    model = tiny()
    path = tmp_path / "resnet50.pth"
    write_official(model.state_dict(), fmt, path)

    on_disk = torch.load(path, weights_only=True)
    assert list(on_disk) == list(
        model.state_dict()
    )  # e.g. dino_resnet50_pretrain.pth, barlowtwins resnet50.pth
    assert_same_backbone(load_backbone(fresh(), backbone_state(path, fmt), path), model)


# ------------------------------------------------------------------ official layouts, written out by hand


def moco_v2_file(model) -> dict:
    """facebookresearch/moco main_moco.py's checkpoint of MoCo v2 (--mlp), keys as DDP writes them."""
    d = model.num_features
    key_encoder = {k: v + 1 if v.is_floating_point() else v for k, v in model.state_dict().items()}
    mlp = lambda encoder: linear(f"module.{encoder}.fc.0", d, d) | linear(f"module.{encoder}.fc.2", 128, d)
    state_dict = (
        prefixed("module.encoder_q.", model.state_dict())
        | mlp("encoder_q")
        | prefixed("module.encoder_k.", key_encoder)
        | mlp("encoder_k")
        | {"module.queue": torch.randn(128, 8), "module.queue_ptr": torch.zeros(1, dtype=torch.long)}
    )
    return {
        "epoch": 200,
        "arch": "resnet18",
        "state_dict": state_dict,
        "optimizer": {"state": {}, "param_groups": []},
    }


def test_moco_v2_official_layout(tmp_path):
    model = tiny(name="resnet18")
    checkpoint = moco_v2_file(model)
    keys = checkpoint["state_dict"]
    for key in (  # torchvision's names under MoCo's prefix, the v2 MLP head, the key encoder, the queue
        "module.encoder_q.conv1.weight",
        "module.encoder_q.bn1.running_var",
        "module.encoder_q.layer2.0.downsample.0.weight",
        "module.encoder_q.layer4.1.bn2.num_batches_tracked",
        "module.encoder_q.fc.0.weight",
        "module.encoder_q.fc.2.bias",
        "module.encoder_k.conv1.weight",
        "module.queue_ptr",
    ):
        assert key in keys, key
    path = tmp_path / "moco_v2_200ep_pretrain.pth.tar"
    torch.save(checkpoint, path)

    state = backbone_state(path, "moco")

    assert set(state) == set(model.state_dict())  # fc.* dropped, encoder_k and queue left out
    assert_same_backbone(load_backbone(fresh("resnet18"), state, path, "moco"), model)
    assert_same_backbone(load_backbone(fresh("resnet18"), backbone_state(path, "pcl"), path), model)


def test_the_moco_writer_writes_the_official_layout(tmp_path):
    model = tiny(name="resnet18")
    official = moco_v2_file(model)
    heads = {k: v for k, v in official["state_dict"].items() if not k.startswith("module.encoder_q.")} | {
        k: v for k, v in official["state_dict"].items() if k.startswith("module.encoder_q.fc.")
    }
    path = tmp_path / "exported.pth.tar"
    write_official(model.state_dict(), "moco", path, heads=heads, arch="resnet18")

    written = torch.load(path, weights_only=True)
    assert set(written) == {"epoch", "arch", "state_dict", "optimizer"}
    assert written["arch"] == "resnet18"
    assert set(written["state_dict"]) == set(official["state_dict"])
    write_official(model.state_dict(), "moco", path, heads=heads, placeholders=False, arch="resnet18")
    assert set(torch.load(path, weights_only=True)) == {"arch", "state_dict"}  # nothing made up


def dino_head(prefix: str, d: int) -> dict:
    """dino main_dino.py's DINOHead: mlp.{0,2,4} and the weight-normed last layer."""
    return (
        linear(f"{prefix}head.mlp.0", 64, d)
        | linear(f"{prefix}head.mlp.2", 64, 64)
        | linear(f"{prefix}head.mlp.4", 32, 64)
        | {f"{prefix}head.last_layer.weight_g": torch.ones(100, 1)}
        | {f"{prefix}head.last_layer.weight_v": torch.randn(100, 32)}
    )


@pytest.mark.parametrize("teacher_prefix", ["module.", ""])  # DDP-wrapped (ResNets) or not
def test_dino_full_checkpoint_teacher_by_default_student_on_request(teacher_prefix, tmp_path):
    teacher, student = tiny(1), tiny(2)
    d = teacher.num_features
    path = tmp_path / "dino_resnet50_pretrain_full_checkpoint.pth"
    torch.save(
        {
            "student": prefixed("module.backbone.", student.state_dict()) | dino_head("module.", d),
            "teacher": prefixed(f"{teacher_prefix}backbone.", teacher.state_dict())
            | dino_head(teacher_prefix, d),
            "optimizer": {"state": {}, "param_groups": []},
            "epoch": 800,
            "args": argparse.Namespace(arch="resnet50", out_dim=100),
            "dino_loss": {"center": torch.zeros(1, 100)},
        },
        path,
    )

    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "dino"), path), teacher)
    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "dino", part="student"), path), student)
    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "dino", part="teacher"), path), teacher)


def test_dino_backbone_only_file_has_no_parts(tmp_path):
    path = tmp_path / "dino_resnet50_pretrain.pth"
    torch.save(tiny().state_dict(), path)
    with pytest.raises(ReleasedWeightsError, match=r"dino_resnet50_pretrain\.pth.*no `student` entry"):
        backbone_state(path, "dino", part="student")
    with pytest.raises(ReleasedWeightsError, match=r"part 'teacher' of format 'moco'.*none"):
        backbone_state(path, "moco", part="teacher")


def swav_heads(d: int, prototypes: int) -> dict:
    """swav src/resnet50.py's projection_head (Linear, BN, ReLU, Linear) and prototypes."""
    head = linear("module.projection_head.0", d, d) | bn("module.projection_head.1", d)
    head |= linear("module.projection_head.3", 128, d)
    if prototypes == 1:  # SwAV: one nn.Linear(128, 3000, bias=False)
        return head | {"module.prototypes.weight": torch.randn(300, 128)}
    return head | {
        f"module.prototypes.prototypes{i}.weight": torch.randn(300, 128) for i in range(prototypes)
    }


@pytest.mark.parametrize(("fmt", "prototypes"), [("swav", 1), ("deepclusterv2", 3), ("selav2", 1)])
@pytest.mark.parametrize(
    "wrapped", [False, True]
)  # hubconf.py reads the file itself, eval_linear.py also a wrapper
def test_swav_family_official_layout(fmt, prototypes, wrapped, tmp_path):
    model = tiny()
    weights = prefixed("module.", model.state_dict()) | swav_heads(model.num_features, prototypes)
    assert "module.conv1.0.weight" in weights and "module.projection_head.1.running_var" in weights
    path = tmp_path / f"{fmt}_800ep_pretrain.pth.tar"
    torch.save({"epoch": 800, "state_dict": weights, "optimizer": {}} if wrapped else weights, path)

    assert_same_backbone(load_backbone(fresh(), backbone_state(path, fmt), path, fmt), model)


def test_barlowtwins_and_vicreg_full_checkpoints(tmp_path):
    model = tiny()
    d = model.num_features
    projector = linear("module.projector.0", 64, d, bias=False) | bn("module.projector.1", 64)
    bt_bn = {"module.bn.running_mean": torch.zeros(64), "module.bn.running_var": torch.ones(64)}
    path = tmp_path / "checkpoint.pth"
    model_entry = prefixed("module.backbone.", model.state_dict()) | projector | bt_bn
    torch.save({"epoch": 1000, "model": model_entry, "optimizer": {}}, path)
    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "barlowtwins"), path), model)

    model_entry = prefixed("module.backbone.", model.state_dict()) | projector
    torch.save({"epoch": 1000, "model": model_entry, "optimizer": {}}, path)
    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "vicreg"), path), model)


def test_ressl_model_entry_as_linear_eval_reads_it(tmp_path):
    model = tiny()
    d = model.num_features
    head = linear("module.encoder_q.head.linear1", 64, d) | linear("module.encoder_q.head.linear2", 32, 64)
    key_net = prefixed("module.encoder_k.net.", tiny(seed=1).state_dict())
    queue = {"module.queue": torch.randn(32, 16), "module.queue_ptr": torch.zeros(1, dtype=torch.long)}
    model_entry = prefixed("module.encoder_q.net.", model.state_dict()) | head | key_net | queue
    path = tmp_path / "ressl-200.pth"
    torch.save({"model": model_entry, "optimizer": {}, "epoch": 200}, path)
    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "ressl"), path), model)


def tiny_vit(seed: int = 0) -> torch.nn.Module:
    """A timm ViT (deit.py's key names) with every parameter random, on 32-px inputs."""
    torch.manual_seed(seed)
    model = fresh_vit()
    with torch.no_grad():
        for value in model.state_dict().values():
            value.normal_(0, 0.1)
    return model.eval()


def fresh_vit() -> torch.nn.Module:
    args = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 48, "num_heads": 3, "num_classes": 0}
    return timm.create_model("vit_tiny_patch16_224", **args)


def test_msn_checkpoint_target_encoder_by_default_the_online_encoder_on_request(tmp_path):
    target, online = tiny_vit(1), tiny_vit(2)
    head = (
        linear("module.fc.fc1", 64, 48)
        | bn("module.fc.bn1", 64)
        | linear("module.fc.fc2", 64, 64)
        | bn("module.fc.bn2", 64)
        | linear("module.fc.fc3", 32, 64)
    )
    path = tmp_path / "vits16_800ep.pth.tar"
    torch.save(
        {
            "encoder": prefixed("module.", online.state_dict()) | head,
            "target_encoder": prefixed("module.", target.state_dict()) | head,
            "prototypes": torch.randn(100, 32),
            "opt": {"state": {}, "param_groups": []},
            "epoch": 800,
            "lr": 0.001,
        },
        path,
    )
    assert "module.blocks.1.attn.qkv.weight" in torch.load(path)["target_encoder"]

    assert_same_backbone(load_backbone(fresh_vit(), backbone_state(path, "msn"), path), target)
    assert_same_backbone(
        load_backbone(fresh_vit(), backbone_state(path, "msn", part="encoder"), path), online
    )


def test_an_ibot_checkpoint_s_teacher_by_default_the_student_on_request_and_the_teacher_s_file(tmp_path):
    # checkpoint.pth: main_ibot.py's save_dict, the student DDP-wrapped and the teacher not (a ViT has no
    # batch norm), each a MultiCropWrapper (backbone., head.) whose backbone keeps masked_embed;
    # checkpoint_teacher.pth: extract_backbone_weights.py's file, the teacher's backbone under state_dict
    teacher, student = tiny_vit(1), tiny_vit(2)
    heads = {"head.mlp.0.weight": torch.randn(64, 48), "head.last_layer.weight_v": torch.randn(60, 32)}
    masked = {"backbone.masked_embed": torch.zeros(1, 48)}
    path = tmp_path / "checkpoint.pth"
    torch.save(
        {
            "student": prefixed("module.", prefixed("backbone.", student.state_dict()) | masked | heads),
            "teacher": prefixed("backbone.", teacher.state_dict()) | masked | heads,
            "optimizer": {"state": {}, "param_groups": []},
            "epoch": 800,
            "ibot_loss": {"center": torch.zeros(1, 60), "center2": torch.zeros(1, 1, 60)},
        },
        path,
    )
    assert_same_backbone(load_backbone(fresh_vit(), backbone_state(path, "ibot"), path), teacher)
    assert_same_backbone(
        load_backbone(fresh_vit(), backbone_state(path, "ibot", part="student"), path), student
    )
    backbone_file = tmp_path / "checkpoint_teacher.pth"
    torch.save({"state_dict": teacher.state_dict() | {"masked_embed": torch.zeros(1, 48)}}, backbone_file)
    assert_same_backbone(
        load_backbone(fresh_vit(), backbone_state(backbone_file, "ibot"), backbone_file), teacher
    )


def test_an_ijepa_checkpoint_s_target_encoder_by_default_the_context_encoder_on_request(tmp_path):
    # IN1K-vit.h.14-300e.pth.tar: src/train.py's save_checkpoint, three DDP-wrapped networks and the rest;
    # a ViT without a class token, its patch tokens averaged (4 x 4 patches of 8 px here)
    args = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 48, "num_heads": 3, "num_classes": 0}
    args |= {"class_token": False, "global_pool": "avg", "fc_norm": False}
    networks = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        networks.append(timm.create_model("vit_tiny_patch16_224", **args).eval())
        with torch.no_grad():
            for value in networks[-1].state_dict().values():
                value.normal_(0, 0.1)
    target, online = networks
    path = write_official(target.state_dict(), "ijepa", tmp_path / "IN1K-vit.h.14-300e.pth.tar")
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["encoder"] = prefixed("module.", online.state_dict())
    torch.save(checkpoint, path)
    assert checkpoint["target_encoder"]["module.pos_embed"].shape == (1, 16, 48)  # no class token's row
    assert "module.predictor_embed.weight" in checkpoint["predictor"]

    def fresh():
        return timm.create_model("vit_tiny_patch16_224", **args)

    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "ijepa"), path), target)
    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "ijepa", part="encoder"), path), online)
    with pytest.raises(
        ReleasedWeightsError, match="cls_token"
    ):  # a ViT with a class token: its key is missing
        load_backbone(fresh_vit(), backbone_state(path, "ijepa"), path)


SIMMIM_VIT = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 48, "num_heads": 3, "num_classes": 0}
SIMMIM_VIT |= {"use_abs_pos_emb": False, "use_rel_pos_bias": False, "use_shared_rel_pos_bias": True}
SIMMIM_VIT |= {"init_values": 0.1, "global_pool": "token"}  # beit_base_patch16_224 has a bias per block


def simmim_relative_position_index(side: int) -> torch.Tensor:
    """RelativePositionBias's index in SimMIM's models/vision_transformer.py, written out: each pair of
    patches by its row and column offsets, and three more entries for the class token's pairs."""
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    span = 2 * side - 1
    distances = span * span
    index = torch.empty(side * side + 1, side * side + 1, dtype=torch.long)
    index[1:, 1:] = (rows[:, None] - rows[None, :] + side - 1) * span + (
        cols[:, None] - cols[None, :] + side - 1
    )
    index[0, :] = distances  # class token to patch
    index[:, 0] = distances + 1  # patch to class token
    index[0, 0] = distances + 2
    return index


def simmim_features(state: dict, index: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """SimMIM's VisionTransformer.forward_features (USE_MEAN_POOLING False) on the file's encoder keys: the
    class token after the final norm. q and v have biases, k none; the shared bias is added to every
    block's attention logits; gamma_1 and gamma_2 scale the two branches."""
    dim, heads, patch = 48, 3, 8
    norm = lambda x, key: F.layer_norm(x, (dim,), state[f"{key}.weight"], state[f"{key}.bias"], eps=1e-6)
    x = F.conv2d(images, state["patch_embed.proj.weight"], state["patch_embed.proj.bias"], stride=patch)
    x = torch.cat([state["cls_token"].expand(len(images), -1, -1), x.flatten(2).transpose(1, 2)], dim=1)
    b, n, _ = x.shape
    bias = (
        state["rel_pos_bias.relative_position_bias_table"][index.flatten()].view(n, n, heads).permute(2, 0, 1)
    )
    for i in range(2):
        p = {key.removeprefix(f"blocks.{i}."): value for key, value in state.items()}
        qkv_bias = torch.cat([p["attn.q_bias"], torch.zeros(dim), p["attn.v_bias"]])
        qkv = F.linear(norm(x, f"blocks.{i}.norm1"), p["attn.qkv.weight"], qkv_bias)
        q, k, v = qkv.reshape(b, n, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
        attn = ((q * (dim // heads) ** -0.5) @ k.transpose(-2, -1) + bias).softmax(dim=-1)
        out = F.linear(
            (attn @ v).transpose(1, 2).reshape(b, n, dim), p["attn.proj.weight"], p["attn.proj.bias"]
        )
        x = x + p["gamma_1"] * out
        hidden = F.gelu(F.linear(norm(x, f"blocks.{i}.norm2"), p["mlp.fc1.weight"], p["mlp.fc1.bias"]))
        x = x + p["gamma_2"] * F.linear(hidden, p["mlp.fc2.weight"], p["mlp.fc2.bias"])
    return norm(x, "norm")[:, 0]


def test_a_simmim_checkpoint_s_encoder_loads_into_timm_s_beit_and_gives_the_official_vit_s_features(tmp_path):
    # simmim_pretrain__vit_base__img224__800ep.pth: save_checkpoint's `model`, SimMIM(encoder, decoder)'s
    # state dict: BEiT's ViT (shared relative position bias, layer scale) as `encoder.`, with its mask
    # token and the index buffer, and the 1x1-conv decoder
    torch.manual_seed(0)
    encoder = randomized(timm.create_model("beit_base_patch16_224", **SIMMIM_VIT))
    path = write_official(
        encoder.state_dict(), "simmim", tmp_path / "simmim.pth", heads=example_heads("simmim", {}, 48)
    )
    checkpoint = torch.load(path, weights_only=False)
    index = checkpoint["model"]["encoder.rel_pos_bias.relative_position_index"]
    assert torch.equal(index, simmim_relative_position_index(4))  # timm's Beit indexes as SimMIM does

    loaded = load_backbone(
        timm.create_model("beit_base_patch16_224", **SIMMIM_VIT), backbone_state(path, "simmim"), path
    )

    assert_same_backbone(loaded, encoder)
    images = torch.randn(2, 3, 32, 32)
    file_state = {k.removeprefix("encoder."): v for k, v in checkpoint["model"].items()}
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(images), simmim_features(file_state, index, images))
    with pytest.raises(ReleasedWeightsError, match="rel_pos_bias"):  # a plain ViT has no shared bias
        load_backbone(fresh_vit(), backbone_state(path, "simmim"), path)


def test_a_capi_hub_file_s_backbone_keys_load_into_the_suite_s_capi_vit_the_others_ignored(tmp_path):
    # capi_vitl14_*.pth: a state dict whose `backbone.` keys are EncoderDecoder's; __model_loader__ reads
    # those alone (a key without the prefix stands for whatever else the file holds)
    args = {"patch_size": 4, "embed_dim": 24, "depth": 2, "num_heads": 2, "n_registers": 8}
    torch.manual_seed(0)
    encoder = randomized(create_backbone("capi_vit_large_patch14", image_size=16, **args))
    path = write_official(
        encoder.state_dict(), "capi", tmp_path / "capi.pth", heads=example_heads("capi", {}, 24)
    )
    checkpoint = torch.load(path, weights_only=True)
    assert "backbone.encoder.blocks.1.residual1.fn.rope.freqs" in checkpoint
    torch.save(checkpoint | {"clustering.weight": torch.randn(16, 24)}, path)

    loaded = load_backbone(
        create_backbone("capi_vit_large_patch14", image_size=16, **args), backbone_state(path, "capi"), path
    )

    assert_same_backbone(loaded, encoder)
    with pytest.raises(ReleasedWeightsError, match="registers"):  # timm's ViT has none
        load_backbone(fresh_vit(), backbone_state(path, "capi"), path)


def dinov3_file(state: dict, k_mask: float = 0.0) -> dict:
    """A DINOv3 hub file (dinov3_vits16_pretrain_lvd1689m-*.pth) for a timm Eva's weights, its keys written
    out as DinoVisionTransformer names them: storage_tokens, ls1/ls2.gamma, each qkv bias whole (its k
    third random) with its bias_mask (1 on q and v, ``k_mask`` on k), RoPE's periods and the mask token."""
    out = {}
    for key, value in state.items():
        if key.endswith("attn.q_bias"):
            qkv = key.replace("q_bias", "qkv.bias")
            out[qkv] = torch.cat([value, torch.randn_like(value), state[key.replace("q_bias", "v_bias")]])
            ones = torch.ones_like(value)
            out[f"{qkv}_mask"] = torch.cat([ones, k_mask * ones, ones])
        elif not key.endswith("attn.v_bias"):
            key = key.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma")
            out[key.replace("reg_token", "storage_tokens")] = value
    return out | {
        "rope_embed.periods": torch.rand(4),
        "mask_token": torch.zeros(1, state["cls_token"].shape[-1]),
    }


def test_a_dinov3_hub_file_loads_into_timm_s_eva_its_masked_qkv_bias_as_q_and_v_biases(tmp_path):
    args = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 2, "num_heads": 3, "num_classes": 0}
    args["global_pool"] = "token"
    torch.manual_seed(0)
    model = randomized(timm.create_model("vit_small_patch16_dinov3_qkvb", **args))
    path = tmp_path / "dinov3_vits16_pretrain_lvd1689m.pth"
    torch.save(dinov3_file(model.state_dict()), path)
    assert "blocks.1.ls2.gamma" in torch.load(path) and "reg_token" not in torch.load(path)

    fresh_eva = lambda: timm.create_model("vit_small_patch16_dinov3_qkvb", **args)
    assert_same_backbone(load_backbone(fresh_eva(), backbone_state(path, "dinov3"), path), model)

    torch.save(dinov3_file(model.state_dict(), k_mask=1.0), path)  # a k bias the official layer would add
    with pytest.raises(ReleasedWeightsError, match="blocks.0.attn.qkv.bias_mask leaves a k bias"):
        backbone_state(path, "dinov3")


def test_a_franca_file_s_chunked_swiglu_teacher_loads_into_timm_s_dinov2_vit(tmp_path):
    # franca_vitb14_In21k.pth: {"teacher": ...} as DINOv2's code saves a ViT with block_chunks (here 2 chunks
    # of 2 blocks: BlockChunk 1 holds blocks 2 and 3 after two Identity slots) and SwiGLUFFNFused (w12, w3;
    # hidden (int(4 x 48 x 2 / 3) + 7) // 8 x 8 = 128), beside its heads and mask token
    args = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 4, "num_heads": 3}
    args |= {"mlp_layer": "swiglu_packed", "act_layer": "silu", "mlp_ratio": 5.334}
    torch.manual_seed(0)
    model = randomized(create_backbone("vit_small_patch14_dinov2", **args))
    assert model.blocks[0].mlp.fc1.out_features == 2 * 128
    teacher = {}
    for key, value in model.state_dict().items():
        if key.startswith("blocks."):
            block = int(key.split(".")[1])
            key = f"blocks.{block // 2}.{key.removeprefix('blocks.')}"
        teacher["backbone." + key.replace(".mlp.fc1.", ".mlp.w12.").replace(".mlp.fc2.", ".mlp.w3.")] = value
    assert "backbone.blocks.1.3.mlp.w12.weight" in teacher
    path = tmp_path / "franca_vitb14_In21k.pth"
    torch.save({"teacher": teacher | example_heads("franca", {}, 48)}, path)

    loaded = load_backbone(
        create_backbone("vit_small_patch14_dinov2", **args), backbone_state(path, "franca"), path
    )

    assert_same_backbone(loaded, model)
    x = torch.randn(5, 48)
    w12, w3 = (teacher[f"backbone.blocks.1.3.mlp.{w}.weight"] for w in ("w12", "w3"))
    b12, b3 = (teacher[f"backbone.blocks.1.3.mlp.{w}.bias"] for w in ("w12", "w3"))
    x1, x2 = F.linear(x, w12, b12).chunk(2, dim=-1)  # SwiGLUFFN: w3(silu(x1) * x2)
    with torch.no_grad():
        torch.testing.assert_close(loaded.blocks[3].mlp(x), F.linear(F.silu(x1) * x2, w3, b3))


def test_a_dinov2_hub_file_loads_into_timm_s_vit_with_layer_scale_and_518_px_positions(tmp_path):
    # dinov2_vits14_pretrain.pth: DinoVisionTransformer's state dict, timm's names, its mask token beside
    # them, position embeddings of 37 x 37 patches; a small one here (4 x 4 patches of 8 px, 32-px inputs)
    args = {"patch_size": 8, "depth": 2, "embed_dim": 48, "num_heads": 3, "num_classes": 0}
    args["init_values"] = 1e-5  # layer scale
    torch.manual_seed(0)
    released_vit = timm.create_model("vit_tiny_patch16_224", img_size=32, **args)
    with torch.no_grad():
        for value in released_vit.state_dict().values():
            value.normal_(0, 0.1)
    path = tmp_path / "dinov2_vits14_pretrain.pth"
    torch.save(released_vit.state_dict() | {"mask_token": torch.zeros(1, 48)}, path)
    assert "blocks.1.ls2.gamma" in torch.load(path) and "mask_token" in torch.load(path)

    # at the images' own 16 px, the 32-px positions resampled on the fly (dynamic_img_size)
    into = timm.create_model("vit_tiny_patch16_224", img_size=32, dynamic_img_size=True, **args)
    loaded = load_backbone(into, backbone_state(path, "dinov2"), path)
    assert_same_backbone(loaded, released_vit.eval())
    assert loaded(torch.randn(2, 3, 16, 16)).shape == (2, 48)
    smaller = timm.create_model("vit_tiny_patch16_224", img_size=16, **args)  # positions of 2 x 2 patches
    with pytest.raises(ReleasedWeightsError, match="pos_embed"):
        load_backbone(smaller, backbone_state(path, "dinov2"), path)


def test_densecl_extracted_backbone_file(tmp_path):
    model = (
        tiny()
    )  # tools/extract_backbone_weights.py: {"state_dict": the backbone's keys, "author": "DenseCL"}
    path = tmp_path / "densecl_r50_imagenet_200ep.pth"
    torch.save({"state_dict": dict(model.state_dict()), "author": "DenseCL"}, path)
    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "densecl"), path), model)


@pytest.mark.parametrize("encoder", ["module.encoder.", "encoder.module.", "encoder."])
def test_supcon_model_entry(encoder, tmp_path):
    model = tiny()
    d = model.num_features
    head_prefix = "module." if encoder == "module.encoder." else ""
    model_entry = prefixed(encoder, model.state_dict()) | linear(f"{head_prefix}head.0", d, d)
    path = tmp_path / "supcon.pth"
    torch.save(
        {"opt": argparse.Namespace(), "model": model_entry | linear(f"{head_prefix}head.2", 128, d)}, path
    )
    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "supcon"), path), model)


def test_torchvision_and_timm_classifiers_are_dropped(tmp_path):
    model = tiny(name="resnet18")
    path = tmp_path / "resnet18-f37072fd.pth"
    torch.save(model.state_dict() | linear("fc", 1000, model.num_features), path)
    for fmt in ("torchvision", "timm", "byol"):  # byol: chigur/byol-convert keeps the online classifier as fc
        assert_same_backbone(load_backbone(fresh("resnet18"), backbone_state(path, fmt), path), model)


# -------------------------------------------------------------------------------------------- mismatches


def moco_file(tmp_path, change) -> tuple:
    model = tiny()
    checkpoint = moco_v2_file(model)
    change(checkpoint["state_dict"])
    path = tmp_path / "moco_v2_800ep_pretrain.pth.tar"
    torch.save(checkpoint, path)
    return path, backbone_state(path, "moco")


def test_a_missing_key_names_the_file_and_the_key(tmp_path):
    path, state = moco_file(tmp_path, lambda sd: sd.pop("module.encoder_q.layer1.0.bn1.running_mean"))
    with pytest.raises(ReleasedWeightsError) as err:
        load_backbone(fresh(), state, path, "moco")
    message = str(err.value)
    assert str(path) in message and "1 missing keys (layer1.0.bn1.running_mean)" in message
    assert "unexpected" not in message


def test_an_unexpected_key_names_the_file_and_the_key(tmp_path):
    path, state = moco_file(tmp_path, lambda sd: sd.update({"module.encoder_q.proj.weight": torch.ones(2)}))
    with pytest.raises(ReleasedWeightsError) as err:
        load_backbone(fresh(), state, path, "moco")
    message = str(err.value)
    assert str(path) in message and "1 unexpected keys (proj.weight)" in message
    assert "missing" not in message


def test_a_shape_mismatch_names_the_file_the_key_and_both_shapes(tmp_path):
    def widen(sd):
        sd["module.encoder_q.conv1.0.weight"] = torch.zeros(5, 3, 3, 3)

    path, state = moco_file(tmp_path, widen)
    with pytest.raises(ReleasedWeightsError) as err:
        load_backbone(fresh(), state, path, "moco")
    message = str(err.value)
    assert str(path) in message and "1 shape mismatches (conv1.0.weight (5, 3, 3, 3) in the file" in message
    assert "`backbone`" in message  # the fix names the backbone setting


def test_the_wrong_format_is_named_with_the_formats_that_fit(tmp_path):
    path = tmp_path / "moco.pth.tar"
    torch.save(moco_v2_file(tiny()), path)
    with pytest.raises(
        ReleasedWeightsError, match=r"moco\.pth\.tar.*'simsiam'.*missing keys.*fit format 'moco' or 'pcl'"
    ):
        load_backbone(fresh(), backbone_state(path, "simsiam"), path, "simsiam")


def test_the_wrong_backbone_lists_shapes_and_missing_keys(tmp_path):
    path = tmp_path / "resnet18.pth"
    write_official(tiny(name="resnet18").state_dict(), "torchvision", path)
    with pytest.raises(ReleasedWeightsError, match=r"resnet18\.pth.*backbone test_resnet: \d+ missing keys"):
        load_backbone(fresh(), backbone_state(path, "torchvision"), path)


def test_a_file_without_the_formats_entry_names_the_keys_it_has(tmp_path):
    path = tmp_path / "dino_full.pth"
    model = tiny()
    write_official(model.state_dict(), "dino", path, heads=example_heads("dino", {}, model.num_features))
    with pytest.raises(ReleasedWeightsError) as err:
        backbone_state(path, "moco")
    message = str(err.value)
    assert str(path) in message and "student" in message and "teacher" in message
    assert "expects a `state_dict` entry" in message and "fits dino" in message


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"not a pickle at all\n", "not a torch checkpoint"),
        (None, "not found"),
        ("tensor", "not a checkpoint: it holds a Tensor"),
    ],
)
def test_a_file_that_is_not_a_checkpoint(content, problem, tmp_path):
    path = tmp_path / "weights.pth"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "tensor":
        torch.save(torch.zeros(3), path)
    with pytest.raises(ReleasedWeightsError, match=f"{path.name}: {problem}"):
        backbone_state(path, "moco")


def test_byol_official_pkl_is_refused_with_the_file_to_use(tmp_path):
    path = tmp_path / "pretrain_res50x1.pkl"
    path.write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(ReleasedWeightsError, match=r"pretrain_res50x1\.pkl.*chigur/byol-convert"):
        backbone_state(path, "byol")


def test_an_unknown_format_lists_the_known_ones(tmp_path):
    for call in (
        lambda: backbone_state(tmp_path / "x.pth", "mocov2"),
        lambda: write_official({}, "mocov2", tmp_path / "x.pth"),
    ):
        with pytest.raises(
            ReleasedWeightsError, match=r"unknown released-weights format 'mocov2'; known: moco, pcl"
        ):
            call()


def test_a_head_the_format_does_not_declare_is_not_written(tmp_path):
    with pytest.raises(ReleasedWeightsError, match=r"'module.encoder_q.head.weight'.*module.encoder_q.fc."):
        write_official({}, "moco", tmp_path / "x.pth", heads={"module.encoder_q.head.weight": torch.ones(1)})


# ----------------------------------------------------------------------------- lemniscate's pickled class

LEMNISCATE_LIB = """
import torch
from torch import nn

class AliasMethod:
    def __init__(self, probs):
        self.prob = probs

class NCEAverage(nn.Module):
    def __init__(self, size, dim):
        super().__init__()
        self.register_buffer("memory", torch.randn(size, dim))
        self.multinomial = AliasMethod(torch.ones(size))
"""


def test_instdisc_file_with_a_class_that_no_longer_imports(tmp_path, monkeypatch):
    package = tmp_path / "lemniscate_lib_gone"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "NCEAverage.py").write_text(textwrap.dedent(LEMNISCATE_LIB))
    monkeypatch.syspath_prepend(str(tmp_path))
    memory_bank = importlib.import_module("lemniscate_lib_gone.NCEAverage").NCEAverage(10, 8)
    model = tiny()
    path = tmp_path / "lemniscate_resnet50.pth.tar"
    state_dict = prefixed("module.", model.state_dict()) | linear("module.fc", 128, model.num_features)
    checkpoint = {"epoch": 200, "arch": "resnet50", "state_dict": state_dict, "lemniscate": memory_bank}
    torch.save(checkpoint | {"best_prec1": 46.8, "optimizer": {}}, path, _use_new_zipfile_serialization=False)
    for name in [m for m in sys.modules if m.startswith("lemniscate_lib_gone")]:
        del sys.modules[name]
    for file in package.iterdir():
        file.unlink()
    package.rmdir()
    importlib.invalidate_caches()
    with pytest.raises(ModuleNotFoundError):  # what plain torch.load does with it
        torch.load(path, weights_only=False)

    assert_same_backbone(load_backbone(fresh(), backbone_state(path, "instdisc"), path), model)
    stand_in = released.read_file(path)["lemniscate"]
    assert isinstance(stand_in, released.Unimported)
    assert type(stand_in).__module__ == "lemniscate_lib_gone.NCEAverage"
    assert torch.equal(stand_in.state["_buffers"]["memory"], memory_bank.memory)
