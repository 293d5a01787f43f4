"""The raw-input floor: the features are the input pixels themselves, never trained."""

from sslbench.kit.method import Method


class Pixels(Method):
    num_views = 1

    def training_loss(self, views, labels, indices):
        raise RuntimeError("the pixels baseline has no loss: it has no weights and is never trained")
