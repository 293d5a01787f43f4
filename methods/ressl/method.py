"""ReSSL (Zheng, You, Wang, Qian, Zhang, Wang, Xu, NeurIPS 2021): relational self-supervised learning with
weak augmentation. MoCo's two encoders and queue, with InfoNCE replaced by a relation: the query's
similarities to the queue are pulled to the key's, sharpened by a lower temperature.

    f_q = projector(backbone)             # Linear-ReLU-Linear, no batch norm
    f_k = copy(f_q), no gradient          # the momentum (teacher) encoder
    for x in loader:
        q = normalize(f_q(strong_aug(x)))  # MoCo v2's augmentation
        k = normalize(f_k(weak_aug(x)))    # crop and flip only; shuffle-BN as MoCo
        p = softmax(k Q^T / t_t)           # the teacher's relation to the queue, sharpened (t_t < t_s)
        loss = -sum(p log softmax(q Q^T / t_s))
        enqueue(Q, k)                      # after the loss
        SGD step on f_q
        f_k = m f_k + (1 - m) f_q

mingkai-zheng/ReSSL ressl.py and network/ressl.py. The key encoder is MoCo's (sslbench/kit/moco.py), so
under torch.distributed its batch is shuffled across ranks as network/ressl.py does; each rank's loss is
a mean over its own images against the shared queue, and the queue takes every rank's keys. The
evaluated encoder is the query backbone.
"""

import torch.nn.functional as F
from torch import nn

from sslbench.kit.losses import relational
from sslbench.kit.method import Method, exclude_bias_and_norm, projection_mlp
from sslbench.kit.moco import key_encoder_of
from sslbench.kit.queue import KeyQueue, fit_queue_size


class ReSSL(Method):
    num_views = 2  # views[0]: the student's strong view, views[1]: the teacher's weak one

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.projector = projection_mlp(self.feature_dim, p["proj_hidden_dim"], p["dim"])
        self.key_encoder = key_encoder_of(self.backbone, self.projector, p["bn_splits"], info.batch_size)
        self.queue = KeyQueue(fit_queue_size(p["queue_size"], info.batch_size, info.num_train), p["dim"])
        self.student_temperature = float(p["student_temperature"])
        self.teacher_temperature = float(p["teacher_temperature"])

    def training_loss(self, views, labels, indices):
        q = F.normalize(self.projector(self.backbone(views[0])), dim=1)
        k = F.normalize(self.key_encoder(views[1]), dim=1)
        loss = relational(q, k, self.queue.negatives(), self.student_temperature, self.teacher_temperature)
        self.queue.push(k)
        return loss

    def param_groups(self):  # ressl.py: no weight decay on batch norm and biases
        return exclude_bias_and_norm(nn.ModuleList([self.backbone, self.projector]))

    def on_epoch_start(self, ctx):
        ctx.log["queue_size"] = len(self.queue)  # the effective K (shrunk on small datasets)

    def momentum_pairs(self):
        return [([self.backbone, self.projector], self.key_encoder)]

    def projection_head(self):
        return self.projector
