"""CAPI's encoder as a timm model: its RoPE frequencies and register coordinates by hand, RoPE on the diagonal
a rotation whose logits depend on coordinate differences alone, and the whole forward against model.py's
EncoderDecoder written out."""

import math

import pytest
import timm
import torch
import torch.nn.functional as F

from sslbench.backbones import create_backbone
from sslbench.capi_vit import Rope, edge_coordinates, rope_frequencies
from sslbench.errors import SslbenchError

TINY = {"patch_size": 4, "embed_dim": 24, "depth": 2, "num_heads": 2, "n_registers": 8}


def test_rope_frequencies_by_hand():
    # dim 8: two frequencies, 7 and 7e-4 (7 x (7 / 7e-4) ** -1), each on a pair of channels; rows turn the
    # first half of the channels, columns the second
    f = [7.0, 7e-4]
    expected = torch.tensor([f + f + [0, 0, 0, 0], [0, 0, 0, 0] + f + f]) * 2 * math.pi
    torch.testing.assert_close(rope_frequencies(8), expected)


def test_registers_sit_on_the_edges_clockwise():
    corners = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert torch.equal(edge_coordinates(4), corners)
    halves = torch.tensor([[0, 0], [0.5, 0], [1, 0], [1, 0.5], [1, 1], [0.5, 1], [0, 1], [0, 0.5]])
    assert torch.equal(edge_coordinates(8), halves)


def test_on_the_diagonal_rope_keeps_norms_and_its_logits_depend_on_coordinate_differences_alone():
    # channel c is paired with c + dim / 2, which turns with the other coordinate: each pair turns by one
    # angle, a rotation, only where row = column (elsewhere model.py's map is not a rotation: below)
    torch.manual_seed(0)
    rope = Rope(8)
    q, k, coords = (
        torch.randn(1, 1, 5, 8),
        torch.randn(1, 1, 5, 8),
        torch.rand(1, 1, 5, 1).expand(-1, -1, -1, 2),
    )
    shift = torch.tensor([0.3, 0.3])
    torch.testing.assert_close(rope(q, coords).norm(dim=-1), q.norm(dim=-1))
    logits = rope(q, coords) @ rope(k, coords).transpose(-2, -1)
    shifted = rope(q, coords + shift) @ rope(k, coords + shift).transpose(-2, -1)
    torch.testing.assert_close(shifted, logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits, q @ k.transpose(-2, -1), atol=1e-2)  # it does turn them
    off_diagonal = torch.tensor([0.9, 0.1])
    assert not torch.allclose(rope(q, off_diagonal).norm(dim=-1), q.norm(dim=-1), atol=1e-3)


def official_features(state: dict, images: torch.Tensor) -> torch.Tensor:
    """model.py's EncoderDecoder.forward_features (every patch visible, the last encoder layer), its patch
    tokens then averaged: coordinates from linspace and cartesian_prod, edge registers scaled to the
    patches' range, RoPE with rotate_half, RMSNorm pre-norm blocks, the final RMSNorm without weights."""
    dim, heads, patch, registers = 24, 2, 4, 8
    b = len(images)
    x = F.conv2d(images, state["patch_embed.weight"], state["patch_embed.bias"], stride=patch)
    side = x.shape[-1]
    x = torch.cat([state["registers"].expand(b, -1, -1), x.flatten(2).transpose(1, 2)], dim=1)
    grid = torch.cartesian_prod(torch.linspace(0, 1, side), torch.linspace(0, 1, side))
    edge = torch.zeros(registers, 2)
    c = torch.arange(registers // 4) / (registers // 4)
    quarter = registers // 4
    edge[:quarter, 0], edge[quarter : 2 * quarter, 0], edge[quarter : 2 * quarter, 1] = c, 1, c
    edge[2 * quarter : 3 * quarter, 0], edge[2 * quarter : 3 * quarter, 1] = 1 - c, 1
    edge[3 * quarter :, 1] = 1 - c
    coords = torch.cat([grid.min(0).values + edge * (grid.max(0).values - grid.min(0).values), grid])
    n = x.shape[1]

    def rotate(t, freqs):
        angle = coords @ freqs
        half = t.shape[-1] // 2
        return t * angle.cos() + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * angle.sin()

    for i in range(2):
        p = {key.removeprefix(f"encoder.blocks.{i}."): value for key, value in state.items()}
        h = F.rms_norm(x, (dim,), p["residual1.norm.weight"], eps=1e-5)
        q, k, v = (
            (h @ p[f"residual1.fn.{name}_proj.weight"].T).reshape(b, n, heads, dim // heads).transpose(1, 2)
            for name in "qkv"
        )
        freqs = p["residual1.fn.rope.freqs"]
        attn = (rotate(q, freqs) @ rotate(k, freqs).transpose(-2, -1) / math.sqrt(dim // heads)).softmax(-1)
        x = x + (attn @ v).transpose(1, 2).reshape(b, n, dim) @ p["residual1.fn.proj.weight"].T
        h = F.rms_norm(x, (dim,), p["residual2.norm.weight"], eps=1e-5)
        x = x + F.gelu(h @ p["residual2.fn.fc1.weight"].T) @ p["residual2.fn.fc2.weight"].T
    return F.rms_norm(x, (dim,), eps=1e-5)[:, registers:].mean(1)


def test_the_backbone_computes_model_py_s_encoder_written_out():
    torch.manual_seed(0)
    vit = create_backbone("capi_vit_large_patch14", in_chans=3, image_size=16, **TINY).eval()
    with torch.no_grad():
        for key, value in vit.state_dict().items():
            if not key.endswith("rope.freqs"):  # the official initial frequencies stay
                value.normal_(0, 0.3)
        images = torch.randn(2, 3, 16, 16)
        torch.testing.assert_close(vit(images), official_features(vit.state_dict(), images))
    assert vit.num_features == 24
    assert "capi_vit_large_patch14" in timm.list_models()


def test_a_register_count_off_the_four_edges_is_refused():
    with pytest.raises(SslbenchError, match="n_registers = 6"):
        create_backbone("capi_vit_large_patch14", **(TINY | {"n_registers": 6}))
