"""SimCLR (Chen et al., 2020): two views, a projection head with batch norm, NT-Xent.

z_i = normalize(g(f(aug_i(x))))   for the two views i = 1, 2 (one concatenated batch through f, g)
loss = loss_a + loss_b            # each view's anchors against the 2B - 1 others, each a mean over B
                                  # (google-research/simclr objective.py add_contrastive_loss)
"""

from torch import nn

from sslbench.distributed import gather_with_grad
from sslbench.kit.losses import supcon
from sslbench.kit.method import Method, embed_views


class SimCLR(Method):
    num_views = 2

    def __init__(self, backbone, info, cfg):
        super().__init__(backbone, info, cfg)
        p = cfg["params"]
        self.projector = projection_head(
            self.feature_dim, p["proj_hidden_dim"] or self.feature_dim, p["proj_dim"]
        )
        self.temperature = p["temperature"]

    def training_loss(self, views, labels, indices):
        z = embed_views(self.backbone, self.projector, views)  # [B, 2, D]
        z = gather_with_grad(z)  # under DDP: negatives from every rank, as SimCLR's cross-replica loss
        return nt_xent_sum(z, self.temperature)

    def projection_head(self):  # SimCLR v2 fine-tunes from its first layer
        return self.projector


def nt_xent_sum(z, temperature: float):
    """SimCLR's loss on z [B, 2, D]: loss_a + loss_b, each view's anchors (B of them) contrasted with
    the 2B - 1 other views and averaged. supcon with no labels (and base_temperature = temperature, so
    no rescaling) averages over all 2B anchors, i.e. (loss_a + loss_b) / 2."""
    return 2 * supcon(z, labels=None, temperature=temperature, base_temperature=temperature)


def projection_head(in_dim: int, hidden_dim: int, out_dim: int) -> nn.Sequential:
    """The non-linear head of google-research/simclr (model_util.py projection_head, two layers as in
    the paper): each layer is a bias-free dense layer followed by batch norm (linear_layer with
    use_bn); the hidden layer's batch norm has a learnt scale and shift and a ReLU follows, the output
    layer's has a learnt scale only (center=False: its shift stays 0). Dense weights ~ N(0, 0.01²) as
    there; BN momentum 0.1 and eps 1e-5 are torch's defaults and the official decay 0.9 and eps 1e-5."""
    hidden, output = nn.Linear(in_dim, hidden_dim, bias=False), nn.Linear(hidden_dim, out_dim, bias=False)
    for layer in (hidden, output):
        nn.init.normal_(layer.weight, std=0.01)
    output_bn = nn.BatchNorm1d(out_dim)
    output_bn.bias.requires_grad_(False)  # center=False: the optimiser never sees it, it stays 0
    return nn.Sequential(hidden, nn.BatchNorm1d(hidden_dim), nn.ReLU(inplace=True), output, output_bn)
