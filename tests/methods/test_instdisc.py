"""InstDisc / NPID (methods/instdisc): the NCE loss by hand, the loss of a batch against the memory bank,
the normalisation constant Z, and the bank update, on tiny inputs."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import METHODS_DIR

from sslbench.errors import ConfigError
from sslbench.kit.losses import instance_nce
from sslbench.pretrain.trainer import Trainer


def test_nce_loss_by_hand():
    # B = 1, K = 1, N = 2: K P_n = 1/2. P = 1/2 for the positive and the noise row: h = 1/2 for both, so the
    # loss is -[ln(1/2) + ln(1 - 1/2)] = 2 ln 2 (less the 1e-7 of the official denominators).
    assert instance_nce(torch.tensor([[0.5, 0.5]]), 2).item() == pytest.approx(2 * math.log(2), abs=1e-6)
    # B = 2, K = 2, N = 4: K P_n = 1/2, h = P / (P + 1/2); a sum over the noise, a mean over the batch.
    probabilities = torch.tensor([[1.0, 0.25, 0.5], [0.1, 2.0, 0.0]])
    first = math.log(1 / 1.5) + math.log(0.5 / 0.75) + math.log(0.5 / 1.0)
    second = math.log(0.1 / 0.6) + math.log(0.5 / 2.5) + math.log(0.5 / 0.5)
    assert instance_nce(probabilities, 4).item() == pytest.approx(-(first + second) / 2, abs=1e-6)


def test_nce_loss_is_the_logistic_loss_of_log_p_against_log_k_p_n():
    # The paper's h(i, v) = P / (P + K P_n) is sigmoid(ln P - ln(K P_n)): NCE is a binary classifier of data
    # against noise. Checked on random P, K = 5, N = 40.
    probabilities = torch.rand(6, 6, dtype=torch.float64) * 0.3 + 0.01
    logit = probabilities.log() - math.log(5 / 40)
    expected = -(F.logsigmoid(logit[:, 0]).sum() + F.logsigmoid(-logit[:, 1:]).sum()) / 6
    assert instance_nce(probabilities, 40).item() == pytest.approx(expected.item(), rel=1e-6)


def trainer(tmp_path, method_config, **overrides) -> Trainer:
    return Trainer(
        METHODS_DIR / "instdisc", method_config("instdisc", **overrides), 0, tmp_path, progress=False
    )


def batch(t: Trainer, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(t.labels), generator=g)[: t.batch_size]
    return t.make_views(t.data.train.images[idx], g), idx


@pytest.mark.parametrize("num_negatives", [16, 0])
def test_a_batch_s_loss_z_and_bank_update_follow_the_paper(tmp_path, method_config, num_negatives):
    # NCE with 16 noise rows, or (0) the softmax over the whole bank. Memory momentum 0.3 (the paper: 0.5) so
    # that m and 1 - m cannot be swapped unseen.
    t = trainer(tmp_path, method_config, memory_momentum=0.3, num_negatives=num_negatives)
    method = t.method
    num_train, temperature = len(t.labels), method.temperature
    assert method.memory.shape == (num_train, 128) and not method.memory.requires_grad
    bound = 1 / math.sqrt(128 / 3)  # NCEAverage's and LinearAverage's init
    assert method.memory.abs().max() <= bound and method.z.item() < 0
    for step, seed in enumerate((0, 1)):
        views, idx = batch(t, seed)
        before = method.memory.clone()
        torch.manual_seed(100 + step)
        loss = method.training_loss(views, None, idx)
        v = F.normalize(
            method.head(method.backbone(views[0])), dim=1
        ).detach()  # the same forward (train mode)
        if num_negatives:
            torch.manual_seed(100 + step)  # the same draw of noise rows: K uniform indices per image
            rows = torch.cat([idx[:, None], torch.randint(num_train, (len(idx), 16))], dim=1)  # own row first
            scores = torch.exp((before[rows] @ v[:, :, None]).squeeze(2) / temperature)
            if step == 0:  # Z = N x the mean over the first batch's B (1 + K) scores ...
                assert method.z.item() == pytest.approx(num_train * scores.mean().item(), rel=1e-5)
                z = method.z.item()
            assert method.z.item() == z  # ... and fixed afterwards
            expected = instance_nce(scores / z, num_train)
        else:  # P(i | v) = softmax over the N rows of the bank; no Z
            expected = F.cross_entropy(v @ before.T / temperature, idx)
            assert method.z.item() < 0
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        # The bank: each row of the batch moves to normalise(m w + (1 - m) v), every other row stays.
        torch.testing.assert_close(method.memory[idx], F.normalize(0.3 * before[idx] + 0.7 * v, dim=1))
        others = torch.ones(num_train, dtype=torch.bool)
        others[idx] = False
        assert torch.equal(method.memory[others], before[others])
        loss.backward()
        assert method.memory.grad is None and method.head.weight.grad is not None  # no gradient to the bank
        method.zero_grad()


def test_bad_settings_are_config_errors(tmp_path, method_config):
    for setting in ({"num_negatives": -1}, {"temperature": 0.0}, {"memory_momentum": 1.0}):
        with pytest.raises(ConfigError, match="methods/instdisc/config.yaml"):
            trainer(tmp_path, method_config, **setting)
