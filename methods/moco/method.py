"""MoCo v1 / v2 (He et al., CVPR 2020; Chen et al., 2020): momentum contrast with a queue.

    f_q = head(backbone)              # v1: linear head; v2: MLP head
    f_k = copy(f_q), no gradient      # the momentum (key) encoder
    for x in loader:
        q = normalize(f_q(aug(x)))
        k = normalize(f_k(aug(x)))    # on a shuffled batch, split BN: no batch-statistics leak
        loss = InfoNCE(q, k, queue, T)
        enqueue(queue, k)             # after the loss: a batch's keys are never its own negatives
        SGD step on f_q
        f_k = m f_k + (1 - m) f_q     # the engine's momentum update of momentum_pairs()

The building blocks (split BN, key encoder, version table) are in sslbench/kit/moco.py and the
queue in sslbench/kit/queue.py, shared with PCL. The evaluated encoder is the query backbone.
"""

import torch.nn.functional as F

from sslbench.kit.losses import info_nce
from sslbench.kit.method import Method
from sslbench.kit.moco import check_version, query_head_and_key_encoder, temperature_of
from sslbench.kit.queue import KeyQueue, fit_queue_size


class MoCo(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        check_version(cfg)
        self.projector, self.key_encoder = query_head_and_key_encoder(
            self.backbone, p["version"], p["dim"], p["bn_splits"], info.batch_size
        )
        # K: every step enqueues the global batch's keys (moco/builder.py asserts K % batch == 0).
        self.queue = KeyQueue(fit_queue_size(p["queue_size"], info.batch_size, info.num_train), p["dim"])
        self.temperature = temperature_of(p)

    def training_loss(self, views, labels, indices):
        q = F.normalize(self.projector(self.backbone(views[0])), dim=1)
        k = F.normalize(self.key_encoder(views[1]), dim=1)
        loss = info_nce(q, k, self.queue.negatives(), self.temperature)
        self.queue.push(k)
        return loss

    def on_epoch_start(self, ctx):
        ctx.log["queue_size"] = len(self.queue)  # the effective K (shrunk on small datasets)

    def momentum_pairs(self):  # f_k = m f_k + (1 - m) f_q after every step (the engine's EMA)
        return [([self.backbone, self.projector], self.key_encoder)]
