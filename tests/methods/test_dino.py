"""DINO (methods/dino): the loss against DINOLoss's formula, the centre, the teacher (no gradient, global
crops only, EMA), the teacher-temperature warm-up, the last-layer freeze and the gradient clipping, on
tiny inputs. Under 2 processes the centre and loss are those of one process:
tests/methods/test_distributed.py."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR, random_views, tiny_suite_config, tiny_vit

from sslbench.errors import ConfigError
from sslbench.kit.method import EpochContext
from sslbench.plan.settings import resolve_method_config
from sslbench.pretrain.trainer import Trainer, build_method

BATCH = 16
OUT = 32  # the tiny head's output dim


def dino_config(**overrides) -> dict:
    suite = tiny_suite_config(batch_size=BATCH)
    small = {"out_dim": OUT, "hidden_dim": 24, "bottleneck_dim": 12}
    suite["method_overrides"] = {"dino": {**small, **overrides}}
    return resolve_method_config(suite, METHODS_DIR, "dino")


def build_dino(digits, **overrides):
    return build_method(METHODS_DIR / "dino", dino_config(**overrides), digits, 0)


def outputs_of(module):
    """(inputs, outputs) of module's forward calls, in order (a real forward hook)."""
    calls = []
    module.register_forward_hook(lambda m, args, out: calls.append((args[0].detach(), out.detach())))
    return calls


def dino_loss_by_the_formula(student, teacher, center, teacher_temp, student_temp=0.1):
    """DINOLoss.forward written out: the teacher's 2 chunks centred and sharpened, every student crop
    but the same view, -sum q log softmax(s / tau_s) averaged over the batch, then over the pairs."""
    s = [x / student_temp for x in student.chunk(len(student) // BATCH)]
    t = F.softmax((teacher - center) / teacher_temp, dim=-1).chunk(2)
    terms = [
        (-q * F.log_softmax(s[v], dim=-1)).sum(dim=-1).mean()
        for i, q in enumerate(t)
        for v in range(len(s))
        if v != i
    ]
    return sum(terms) / len(terms), len(terms)


# --- the loss and the centre ------------------------------------------------------------------------


def test_the_loss_is_dinoloss_with_the_old_centre_which_then_moves_by_the_ema_of_teacher_means(digits):
    method = build_dino(digits).eval()  # eval: batch norm per sample, so the hooked outputs are the loss's
    teacher_calls, student_calls = outputs_of(method.teacher), outputs_of(method.head)
    centre = torch.zeros(1, OUT)
    for step in range(3):
        views = random_views(step, BATCH, local=3)
        loss = method.training_loss(views, None, torch.arange(BATCH))
        (t_in, t_out), (_, s_out) = teacher_calls[-1], student_calls[-1]
        assert t_in.shape == (2 * BATCH, 1, 8, 8)  # the teacher sees the 2 global crops only
        expected, pairs = dino_loss_by_the_formula(s_out, t_out, centre, method.teacher_temp)
        assert pairs == 2 * (len(views) - 1)  # a crop never predicts its own view
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        centre = 0.9 * centre + 0.1 * t_out.mean(dim=0, keepdim=True)
        torch.testing.assert_close(method.center, centre)
    assert len(teacher_calls) == 3


def test_the_teacher_gets_no_gradient_and_starts_as_the_student(digits):
    method = build_dino(digits)
    for s, t in zip([*method.backbone.parameters(), *method.head.parameters()], method.teacher.parameters()):
        assert torch.equal(s, t) and not t.requires_grad
    method.training_loss(random_views(0, BATCH, local=3), None, torch.arange(BATCH)).backward()
    assert all(p.grad is None for p in method.teacher.parameters())
    assert all(p.grad is not None for p in method.head.mlp.parameters())


def test_the_last_layer_has_unit_rows_with_norm_last_layer(digits):
    head = build_dino(digits).head
    weight = head.last_layer.weight  # v / ||v|| x g, g fixed at 1
    torch.testing.assert_close(weight.norm(dim=1), torch.ones(OUT))
    assert not head.last_layer.parametrizations.weight.original0.requires_grad
    assert build_dino(
        digits, norm_last_layer=False
    ).head.last_layer.parametrizations.weight.original0.requires_grad


# --- schedules ----------------------------------------------------------------------------------


def test_teacher_temperature_warms_up_linearly_per_epoch_then_stays(digits):
    method = build_dino(digits, warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_epochs=4)
    # np.linspace(0.04, 0.07, 4) for epochs 0..3, then 0.07
    assert [method.teacher_temperature(e) for e in range(6)] == pytest.approx(
        [0.04, 0.05, 0.06, 0.07, 0.07, 0.07]
    )
    assert (
        build_dino(digits, teacher_temp=0.07, warmup_teacher_temp_epochs=0).teacher_temperature(0) == 0.07
    )  # no warm-up


def test_each_epoch_s_temperature_reaches_the_loss_and_the_log(tmp_path):
    trainer = Trainer(
        METHODS_DIR / "dino",
        dino_config(teacher_temp=0.07, warmup_teacher_temp_epochs=3),
        0,
        tmp_path,
        progress=False,
    )
    trainer.state.epoch = 1
    ctx = trainer.epoch_context()
    trainer.method.on_epoch_start(ctx)
    assert ctx.log["teacher_temp"] == pytest.approx(0.055) == trainer.method.teacher_temp


def step_changes(tmp_path, epoch: int, **overrides) -> dict[str, bool]:
    """Which student tensors one engine step at `epoch` moves, and the teacher's EMA check. Without the
    warm-up, whose first step has lr 0 (utils.cosine_scheduler's linspace from 0)."""
    cfg = dino_config(train={"warmup_epochs": 0}, **overrides)
    trainer = Trainer(METHODS_DIR / "dino", cfg, 0, tmp_path, progress=False)
    method = trainer.method
    student = dict([*method.backbone.named_parameters("backbone"), *method.head.named_parameters("head")])
    before = {n: p.detach().clone() for n, p in student.items()}
    teacher = [p.detach().clone() for p in method.teacher.parameters()]
    trainer.state.epoch = epoch
    idx = torch.arange(BATCH)
    views = trainer.make_views(trainer.data.train.images[idx], torch.Generator().manual_seed(0))
    trainer.train_step(views, idx, trainer.epoch_context())
    tau = 0.996  # the cosine schedule's first step
    for t_new, t_old, s_new in zip(method.teacher.parameters(), teacher, student.values()):
        torch.testing.assert_close(t_new, tau * t_old + (1 - tau) * s_new)
    return {n: not torch.equal(p, before[n]) for n, p in student.items()}


def test_the_last_layer_is_frozen_in_the_first_epoch_only(tmp_path):
    last = "head.last_layer.parametrizations.weight.original1"  # v; g is fixed anyway
    first = step_changes(tmp_path / "0", epoch=0)
    assert not first[last] and first["head.mlp.0.weight"] and first["backbone.conv1.0.weight"]
    assert step_changes(tmp_path / "1", epoch=1)[last]


def test_gradient_clipping_caps_each_tensor_s_norm_and_leaves_small_ones(digits):
    method = build_dino(digits)
    params = [*method.backbone.parameters(), *method.head.parameters()]
    trainable = [p for p in params if p.requires_grad]
    for i, p in enumerate(trainable):
        p.grad = torch.full_like(p, 1.0) * (10.0 if i % 2 else 1e-3)
    small = [p.grad.clone() for i, p in enumerate(trainable) if not i % 2]
    method.on_before_step(EpochContext(5, 30, 50, 10, torch.device("cpu"), forward_train_set=None))
    for i, p in enumerate(trainable):
        if i % 2:  # each tensor on its own: norm 3 (up to the 1e-6 of utils.clip_gradients)
            assert p.grad.norm().item() == pytest.approx(3.0, rel=1e-4)
    assert all(torch.equal(a, p.grad) for a, p in zip(small, trainable[::2]))
    assert math.isclose(method.clip_grad, 3.0)


def test_a_one_layer_head_is_a_config_error(digits):
    with pytest.raises(ConfigError, match="methods/dino/config.yaml: num_layers"):
        build_dino(digits, num_layers=1)


# --- the ViT form -------------------------------------------------------------------------------------------


def test_on_a_vit_the_student_drops_paths_and_the_teacher_none(digits):
    """main_dino.py: the student ViT with --drop_path_rate 0.1, the teacher built without drop path; and
    utils.get_params_groups decays the class token, position embedding and patch projection (ndim > 1)."""
    from timm.layers import DropPath

    from sslbench.kit.method import DataInfo
    from sslbench.plugins import load_method_class

    torch.manual_seed(0)
    vit = tiny_vit(drop_path_rate=0.5, dynamic_img_size=True)
    info = DataInfo(num_classes=10, num_train=64, channels=3, image_size=16, batch_size=8, epochs=1)
    method = load_method_class(METHODS_DIR / "dino")(vit, info, dino_config())
    student = [m.drop_prob for m in method.backbone.modules() if isinstance(m, DropPath)]
    teacher = [m.drop_prob for m in method.teacher.modules() if isinstance(m, DropPath)]
    # timm spaces the rates over the blocks: block 0 of 2 has none, block 1 rate 0.5 (two DropPath layers)
    assert student == pytest.approx([0.5, 0.5]) and teacher == [0.0, 0.0]
    method.train()
    x = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(method.teacher(x), method.teacher(x))  # train mode, yet deterministic
    torch.manual_seed(1)
    first = method.backbone(x)
    assert not torch.equal(first, method.backbone(x))  # the student's paths are dropped at random
    views = [x, x.flip(-1), torch.randn(8, 3, 8, 8)]  # 2 global crops and a local one (dynamic_img_size)
    method.training_loss(views, None, torch.arange(8)).backward()
    decayed, excluded = method.param_groups()
    names = {id(p): n for n, p in method.named_parameters()}
    assert {"backbone.cls_token", "backbone.pos_embed", "backbone.patch_embed.proj.weight"} <= {
        names[id(p)] for p in decayed["params"]
    }
    assert excluded["weight_decay"] == 0.0 and all(p.ndim <= 1 for p in excluded["params"])


# --- the monitors' measures of the teacher -----------------------------------------------------------


def test_a_teacher_collapsed_to_uniform_has_entropy_log_k_and_uses_one_output(digits):
    """With the last layer's norms zero the teacher gives every image the same uniform distribution;
    measuring it changes no tensor of the method and draws no random number."""
    method = build_dino(digits).eval()  # as forward_train_set runs it: batch norm keeps its statistics
    method.on_epoch_start(EpochContext(0, 2, 0, 1, torch.device("cpu"), lambda fn: None))
    images = digits.train.images[:40].float()
    on_images = lambda fn: fn(images)  # noqa: E731 (forward_train_set on 40 images)
    spread = method.health(on_images)
    assert 0 < spread["teacher_entropy"] < math.log(OUT) and 1 < spread["teacher_usage"] <= OUT
    with torch.no_grad():
        method.teacher[1].last_layer.parametrizations.weight.original0.zero_()  # g = 0: w = 0
    before, rng = {k: v.clone() for k, v in method.state_dict().items()}, torch.get_rng_state()
    collapsed = method.health(on_images)
    assert collapsed["teacher_entropy"] == pytest.approx(math.log(OUT), rel=1e-5)
    assert collapsed["teacher_usage"] == pytest.approx(1.0)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in method.state_dict().items())
