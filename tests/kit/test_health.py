"""The label-free measures of a method's heads (sslbench.kit.health) by hand."""

import math

import pytest
import torch

from sslbench.kit.health import effective_usage, entropy


def test_entropy_of_a_uniform_row_is_log_k_and_of_a_one_hot_row_zero():
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.0, 1.0, 0.0, 0.0], [0.5, 0.25, 0.25, 0.0]])
    assert entropy(p).tolist() == pytest.approx([math.log(4), 0.0, 1.5 * math.log(2)], abs=1e-6)


def test_usage_is_the_effective_number_of_outputs_the_images_fall_on():
    assert effective_usage(torch.zeros(50), 10) == pytest.approx(1.0)
    assert effective_usage(torch.arange(40) % 4, 10) == pytest.approx(4.0)
    # counts 2, 1, 1 of 3 outputs: exp(-(0.5 ln 0.5 + 2 x 0.25 ln 0.25)) = 2^1.5
    assert effective_usage(torch.tensor([2, 0, 2, 1]), 3) == pytest.approx(2**1.5)
