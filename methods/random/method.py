"""The untrained backbone: randomly initialised, never trained. The floor every method must beat."""

from sslbench.kit.method import Method


class RandomInit(Method):
    num_views = 1

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        for p in self.backbone.parameters():
            p.requires_grad_(False)  # the engine skips training for a method with nothing to train

    def training_loss(self, views, labels, indices):
        raise RuntimeError("the untrained backbone has no loss: it is never trained")
