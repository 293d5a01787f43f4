"""The nearest-neighbour lookup in a support set (sslbench.kit.queue.nearest_neighbour, NNCLR's NN(z, Q))."""

import pytest
import torch
import torch.nn.functional as F

from sslbench.kit.queue import nearest_neighbour


def test_nearest_neighbour_by_hand():
    support = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.6, 0.8]])
    # cosines of [0.5, 0.9] with the rows: 0.49, 0.87, -0.49, 0.99 (row 3); [3, 0]: row 0 exactly;
    # [-1, 0.1]: -0.995, 0.0995, 0.995, -0.517 (row 2)
    query = torch.tensor([[0.5, 0.9], [3.0, 0.0], [-1.0, 0.1]])
    assert torch.equal(nearest_neighbour(query, support), support[[3, 0, 2]])


def test_it_is_the_smallest_distance_between_unit_vectors_and_returns_the_support_s_own_rows():
    g = torch.Generator().manual_seed(0)
    query, support = torch.randn(50, 8, generator=g), torch.randn(300, 8, generator=g)
    nearest = torch.cdist(F.normalize(query, dim=1), F.normalize(support, dim=1)).argmin(dim=1)
    scale = torch.rand(300, 1, generator=g) + 0.5  # a row's length never changes which row is nearest
    assert torch.equal(nearest_neighbour(query, support * scale), (support * scale)[nearest])
    assert torch.equal(nearest_neighbour(query * 7.0, support), support[nearest])


def test_ties_go_to_the_first_row_and_no_gradient_flows():
    support = torch.tensor([[0.0, 2.0], [0.0, 1.0], [1.0, 0.0]], requires_grad=True)
    found = nearest_neighbour(torch.tensor([[0.0, 5.0]], requires_grad=True), support)
    assert torch.equal(found, torch.tensor([[0.0, 2.0]])) and not found.requires_grad


def test_a_dimension_mismatch_is_refused():
    with pytest.raises(ValueError, match="share D"):
        nearest_neighbour(torch.zeros(2, 3), torch.zeros(4, 5))
