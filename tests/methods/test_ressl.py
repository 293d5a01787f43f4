"""ReSSL (methods/ressl): its loss by hand from the queue before the step (the student on view 0, the teacher
on view 1), the queue taking the teacher's keys after the loss, the teacher's weak view, and the projector.
The loss itself is pinned in tests/kit/test_losses.py (relational); tests/methods/test_distributed.py runs
the method under 2 real gloo processes against one on the whole batch."""

import torch
import torch.nn.functional as F
from support import METHODS_DIR, random_views, tiny_suite_config
from torch import nn

from sslbench.augment.views import view_groups
from sslbench.plan.settings import resolve_method_config


def relation_loss(method, views, seed):
    """-sum softmax(k Q^T / t_t) log softmax(q Q^T / t_s), the batch mean, written out."""
    queue = method.queue.keys.clone()
    with torch.no_grad():
        q = F.normalize(method.projector(method.backbone(views[0])), dim=1)
        torch.manual_seed(seed)  # the key encoder's shuffle (split BN): the draw training_loss makes
        k = F.normalize(method.key_encoder(views[1]), dim=1)
    target = F.softmax(k @ queue.T / method.teacher_temperature, dim=1)
    log_prediction = F.log_softmax(q @ queue.T / method.student_temperature, dim=1)
    return -(target * log_prediction).sum(dim=1).mean(), k


def test_loss_by_hand_with_the_student_on_the_strong_view_and_the_teacher_on_the_weak_one(build):
    method = build("ressl", bn_splits=2)
    views = random_views()
    expected, _ = relation_loss(method, views, seed=3)
    torch.manual_seed(3)
    torch.testing.assert_close(method.training_loss(views, None, torch.arange(16)), expected)
    swapped, _ = relation_loss(method, views[::-1], seed=3)
    assert not torch.allclose(swapped, expected)  # the two views' roles are not symmetric


def test_the_queue_takes_the_teacher_s_keys_after_the_loss(build):
    method = build("ressl", bn_splits=2)
    views = random_views(seed=1)
    before = method.queue.keys.clone()
    _, k = relation_loss(method, views, seed=4)
    torch.manual_seed(4)
    method.training_loss(views, None, torch.arange(16))
    torch.testing.assert_close(method.queue.keys[:16], k)
    assert torch.equal(method.queue.keys[16:], before[16:]) and int(method.queue.pointer) == 16


def test_the_teacher_s_view_is_crop_and_flip_only_and_the_student_s_moco_v2():
    cfg = resolve_method_config(tiny_suite_config(), METHODS_DIR, "ressl")
    student, teacher = (group.config for group in view_groups(cfg["augment"], 16, 2))
    assert (teacher.jitter_p, teacher.gray_p, teacher.blur_p) == (0.0, 0.0, 0.0)
    assert teacher.crop_scale == student.crop_scale == (0.2, 1.0)  # data/augmentation.py: both (0.2, 1)
    assert (student.jitter_p, student.gray_p, student.blur_p) == (0.8, 0.2, 0.5)


def test_the_projector_is_linear_relu_linear_without_batch_norm(build):
    method = build("ressl", proj_hidden_dim=24, dim=12)
    layers = list(method.projector)
    assert [type(m) for m in layers] == [nn.Linear, nn.ReLU, nn.Linear]
    assert (layers[0].out_features, layers[2].out_features) == (24, 12)
    assert method.projection_head() is method.projector
