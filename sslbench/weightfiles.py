"""How each official release of pretrained weights lays out its file, as data (no torch): the table the
importers (``sslbench.pretrain.released``) read and the planner checks a config's ``released.<name>.format``
against. Key names are torchvision's, which timm's ResNets share.
"""

from __future__ import annotations

from dataclasses import dataclass

from sslbench.errors import SslbenchError


class ReleasedWeightsError(SslbenchError, ValueError):
    """A released file that is not the format named, or does not fit the backbone: the message names
    the file, the keys and the fix."""


@dataclass(frozen=True)
class Format:
    """How one repository's released file holds a ResNet backbone. Keys are matched as prefixes."""

    source: str  # the file whose loader this follows
    wrapper: str | None  # the top-level entry holding the weights; None: the file is the state dict
    prefix: str = ""  # of the backbone's keys in the file, stripped
    also_strips: tuple[str, ...] = ()  # other prefixes the loader strips (the first a key starts with)
    drop: tuple[str, ...] = ()  # keys (as in the file) of heads and other networks, dropped
    prefixed_only: bool = False  # the loader reads the keys with `prefix` alone, and ignores the others
    renames: tuple[
        tuple[str, str], ...
    ] = ()  # (regex, replacement) on each key, after the prefix is stripped
    convert: str | None = None  # a conversion of values after the renaming (released.CONVERSIONS)
    also_reads: tuple[str, ...] = ()  # other top-level entries the loader accepts, tried after `wrapper`
    parts: tuple[str, ...] = ()  # entries `part` may select, the first by default
    backbone_file: bool = False  # also released as a bare state dict of the backbone, plain keys
    batches_tracked: bool = True  # the file has BatchNorm's num_batches_tracked (else filled with 0)
    legacy_file: bool = False  # written by pytorch < 1.6 (not a zip file)
    foreign_suffix: str | None = None  # files with this suffix are a release this format does not read
    note: str = ""


MOCO = dict(
    wrapper="state_dict",
    prefix="module.encoder_q.",
    drop=("module.encoder_q.fc.", "module.encoder_k.", "module.queue", "module.queue_ptr"),
)


SWAV = dict(
    wrapper=None,
    also_reads=("state_dict",),
    prefix="module.",
    drop=("module.projection_head.", "module.prototypes.", "projection_head.", "prototypes."),
)


TORCHVISION_CLASSIFIER = ("fc.",)


FORMATS: dict[str, Format] = {
    "moco": Format("facebookresearch/moco main_lincls.py (`if args.pretrained`)", **MOCO),
    "pcl": Format("salesforce/PCL eval_cls_imagenet.py (`if args.pretrained`)", **MOCO),
    "mocov3": Format(
        "facebookresearch/moco-v3 main_lincls.py (`if args.pretrained`)",
        wrapper="state_dict",
        prefix="module.base_encoder.",
        drop=("module.base_encoder.fc.", "module.momentum_encoder.", "module.predictor."),
    ),
    "simsiam": Format(
        "facebookresearch/simsiam main_lincls.py (`if args.pretrained`)",
        wrapper="state_dict",
        prefix="module.encoder.",
        drop=("module.encoder.fc.", "module.predictor."),
    ),
    "swav": Format("facebookresearch/swav hubconf.py, eval_linear.py", **SWAV),
    "deepclusterv2": Format("facebookresearch/swav hubconf.py, eval_linear.py", **SWAV),
    "selav2": Format("facebookresearch/swav hubconf.py, eval_linear.py", **SWAV),
    "dino": Format(
        "facebookresearch/dino utils.py load_pretrained_weights (eval_linear.py, eval_knn.py)",
        wrapper="teacher",
        parts=("teacher", "student"),
        backbone_file=True,  # dino_resnet50_pretrain.pth; the full checkpoint holds teacher and student
        prefix="module.backbone.",
        also_strips=("backbone.",),
        drop=("module.head.", "head."),
    ),
    "ibot": Format(
        "bytedance/ibot utils.py load_pretrained_weights (evaluation/eval_knn.py, eval_linear.py)",
        wrapper="teacher",
        parts=("teacher", "student"),  # checkpoint.pth, the "full ckpt"
        # checkpoint_teacher.pth, "backbone (t)": extract_backbone_weights.py's {"state_dict": the backbone}
        also_reads=("state_dict",),
        prefix="module.backbone.",
        also_strips=("backbone.",),
        # the heads, and masked_embed: the backbone's token for masked patches in pretraining
        drop=(
            "module.head.",
            "head.",
            "module.backbone.masked_embed",
            "backbone.masked_embed",
            "masked_embed",
        ),
        note="the encoder is models/vision_transformer.py's ViT (DINO's), whose key names are timm's",
    ),
    "barlowtwins": Format(
        "facebookresearch/barlowtwins evaluate.py (resnet50.pth), main.py (checkpoint.pth)",
        wrapper="model",
        backbone_file=True,
        prefix="module.backbone.",
        drop=("module.projector.", "module.bn."),
    ),
    "vicreg": Format(
        "facebookresearch/vicreg hubconf.py (resnet50.pth), evaluate.py (resnet50_fullckpt.pth)",
        wrapper="model",
        backbone_file=True,
        prefix="module.backbone.",
        drop=("module.projector.",),
    ),
    "supcon": Format(
        "third-party loaders of HobbitLong/SupContrast's supcon.pth (deeplearning-wisc/knn-ood "
        "util/model_loader.py); the repository itself has no ImageNet loader",
        wrapper="model",
        prefix="module.encoder.",
        also_strips=("encoder.module.", "encoder."),
        drop=("module.head.", "head."),
        note="the layout of supcon.pth comes from third-party loaders, not from the official repository",
    ),
    "instdisc": Format(
        "zhirongw/lemniscate.pytorch main.py (`--resume`)",
        wrapper="state_dict",
        prefix="module.",
        drop=("module.fc.",),
        batches_tracked=False,
        legacy_file=True,
        note="the file also pickles lemniscate's memory bank object (read as a placeholder)",
    ),
    "byol": Format(
        "chigur/byol-convert convert.py (of deepmind-research byol's pretrain_res50x1.pkl)",
        wrapper=None,
        also_reads=("state_dict",),  # linusericsson/ssl-transfer's conversion wraps it
        drop=TORCHVISION_CLASSIFIER,  # BYOL's online linear probe (`classifier`)
        batches_tracked=False,
        foreign_suffix=".pkl",
        note=(
            "BYOL's official pretrain_res50x1.pkl is a dill pickle of JAX/Haiku trees, which this does not "
            "read: convert it with chigur/byol-convert (convert.py writes pretrain_res50x1.pth.tar) and "
            "import that file"
        ),
    ),
    "ressl": Format(
        "mingkai-zheng/ReSSL linear_eval.py (ressl-200.pth)",
        wrapper="model",
        prefix="module.encoder_q.net.",
        drop=("module.encoder_q.head.", "module.encoder_k.", "module.queue"),
    ),
    "densecl": Format(
        "WXinlong/DenseCL tools/extract_backbone_weights.py, the layout of the README's released files",
        wrapper="state_dict",
        note="the released files hold the backbone alone, extracted from a training checkpoint",
    ),
    "msn": Format(
        "facebookresearch/msn linear_eval.py load_pretrained (the 'target_encoder' entry, 'module.' removed)",
        wrapper="target_encoder",
        parts=("target_encoder", "encoder"),  # the momentum target (evaluated) or the online encoder
        prefix="module.",
        drop=("module.fc.",),  # the projection head (fc1, bn1, fc2, bn2, fc3); the prototypes are top-level
        note="the encoder is deit.py's ViT, whose key names are timm's (cls_token, blocks.0.attn.qkv, norm)",
    ),
    "ijepa": Format(
        "facebookresearch/ijepa src/helper.py load_checkpoint ('target_encoder', 'module.' removed)",
        wrapper="target_encoder",
        parts=("target_encoder", "encoder"),  # the momentum target (evaluated) or the context encoder
        prefix="module.",
        note=(
            "the encoder is vision_transformer.py's ViT without a class token, whose key names are timm's "
            "(pos_embed: its fixed sin-cos table); load it into timm's ViT with `args: {class_token: false, "
            "global_pool: avg, fc_norm: false}` (ViT-H/14: vit_huge_patch14_224); the predictor is not read"
        ),
    ),
    "simmim": Format(
        "microsoft/SimMIM utils.py load_pretrained (the 'model' entry, 'encoder.' removed, "
        "remap_pretrained_keys_vit's relative_position_index dropped)",
        wrapper="model",
        prefix="encoder.",
        drop=("decoder.", "encoder.mask_token", "encoder.rel_pos_bias.relative_position_index"),
        note=(
            "the encoder is models/vision_transformer.py's ViT (BEiT's: a shared relative position bias, "
            "layer scale gamma_1/gamma_2, q and v biases), whose key names are timm's Beit's: load the ViT-B "
            "into timm's beit_base_patch16_224 with `args: {use_rel_pos_bias: false, "
            "use_shared_rel_pos_bias: true, global_pool: token}` (its own defaults: no absolute positions, "
            "layer scale 0.1); the decoder and the mask token are not read"
        ),
    ),
    "capi": Format(
        "facebookresearch/capi model.py __model_loader__ (hubconf.py's capi_vitl14_*.pth: 'backbone.' keys)",
        wrapper=None,
        prefix="backbone.",
        prefixed_only=True,
        drop=("backbone.decoder.", "backbone.mask_token"),
        note=(
            "the encoder of CAPI's EncoderDecoder (registers, RoPE, RMSNorm, no biases), which timm's ViTs "
            "cannot hold: load it into the suite's capi_vit_large_patch14 (sslbench/capi_vit.py); the "
            "decoder and its mask token are not read"
        ),
    ),
    "dinov2": Format(
        "facebookresearch/dinov2 dinov2/hub/backbones.py (the README's `*_pretrain.pth` backbone files)",
        wrapper=None,
        drop=("mask_token",),  # the masked patches' token of pretraining
        note=(
            "the backbone of DINOv2's ViT-S/14, B/14 or L/14 (timm's key names, layer scale ls1/ls2.gamma), "
            "its position embeddings of 518 px (37 x 37 patches): load it into timm's vit_*_patch14_dinov2 "
            "with `args: {img_size: 518}`, which resamples them to the images' size; the registers' files "
            "(register_tokens) and ViT-g/14's SwiGLU blocks (w12, w3) are not read"
        ),
    ),
    "dinov3": Format(
        "facebookresearch/dinov3 dinov3/hub/backbones.py (the `*_pretrain_lvd1689m-*.pth` backbone files)",
        wrapper=None,
        # the masked patches' token; the 7B's local-crop norm; RoPE's periods (a function of the settings)
        drop=("mask_token", "local_cls_norm.", "rope_embed.periods"),
        renames=(
            (r"\.ls1\.gamma$", ".gamma_1"),
            (r"\.ls2\.gamma$", ".gamma_2"),
            (r"^storage_tokens$", "reg_token"),
        ),
        convert="dinov3",
        note=(
            "DinoVisionTransformer's state dict (4 storage tokens, RoPE, layer scale, a k-masked qkv "
            "bias) as timm's Eva names it: load ViT-S/16, S+/16, B/16 or L/16 into timm's "
            "vit_*_patch16_dinov3_qkvb with `args: {global_pool: token}`; the RoPE periods follow from "
            "the model's settings, and the SwiGLU blocks of H+/16 and 7B are not read"
        ),
    ),
    "franca": Format(
        "valeoai/Franca franca/hub/backbones.py _make_franca_model (the 'teacher' entry, 'module.' and "
        "'backbone.' removed)",
        wrapper="teacher",
        prefix="backbone.",
        also_strips=("module.backbone.",),
        drop=(
            *("backbone.mask_token", "dino_head.", "ibot_head."),
            *("module.backbone.mask_token", "module.dino_head.", "module.ibot_head."),
        ),
        renames=(  # DINOv2's code: BlockChunk c's block i (blocks.c.i.), the fused SwiGLU's w12 and w3
            (r"^blocks\.\d+\.(\d+)\.", r"blocks.\1."),
            (r"\.mlp\.w12\.", ".mlp.fc1."),
            (r"\.mlp\.w3\.", ".mlp.fc2."),
        ),
        note=(
            "DINOv2's ViT as its training code saves it (blocks in chunks, the fused SwiGLU's w12 and w3): "
            "load ViT-B/14 or L/14 into timm's vit_*_patch14_dinov2 with `args: {mlp_layer: swiglu_packed, "
            "act_layer: silu, mlp_ratio: 5.334}` (L/14: 5.34375) and the hub's img_size (B/14's IN-21K "
            "file: 518, resampled to the images' size; L/14's: 224); the heads are not read"
        ),
    ),
    "torchvision": Format(
        "pytorch/vision torchvision/models/resnet.py", wrapper=None, drop=TORCHVISION_CLASSIFIER
    ),
    "timm": Format(
        "huggingface/pytorch-image-models timm/models/_helpers.py load_checkpoint",
        wrapper=None,
        also_reads=("state_dict_ema", "state_dict", "model"),
        also_strips=("module.",),
        drop=("fc.", "head.fc.", "head.weight", "head.bias", "classifier."),
    ),
}


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise ReleasedWeightsError(f"unknown released-weights format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]
