"""Properties of sslbench.kit.losses on random inputs: reductions to known cases,
hand-written formulas, naive loops, invariants."""

import math

import pytest
import torch
import torch.nn.functional as F

from sslbench.kit.losses import (
    PROTO_NCE_FORMS,
    cross_view_cross_entropy,
    gram_loss,
    info_nce,
    koleo,
    masked_patch_cross_entropy,
    me_max,
    proto_nce,
    relational,
    sample_negative_prototypes,
    soft_cross_entropy,
    supcon,
)

SEEDS = [0, 1, 2]


def unit_rows(generator, *shape):
    return F.normalize(torch.randn(*shape, generator=generator, dtype=torch.float64), dim=-1)


# --------------------------------------------------------------------------- info_nce


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("temperature", [0.07, 0.2, 1.0])
def test_info_nce_equals_hand_written_log_softmax(seed, temperature):
    g = torch.Generator().manual_seed(seed)
    query, key, negatives = unit_rows(g, 6, 16), unit_rows(g, 6, 16), unit_rows(g, 11, 16)

    loss = info_nce(query, key, negatives, temperature)

    expected = 0.0
    for i in range(6):
        positive = math.exp(float(query[i] @ key[i]) / temperature)
        negative = sum(math.exp(float(query[i] @ n) / temperature) for n in negatives)
        expected += -math.log(positive / (positive + negative))
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(expected / 6, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_info_nce_without_negatives_is_zero(seed):
    g = torch.Generator().manual_seed(seed)
    query, key = unit_rows(g, 5, 8), unit_rows(g, 5, 8)
    loss = info_nce(query, key, torch.empty(0, 8, dtype=torch.float64), 0.1)
    assert loss.item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_info_nce_gradients_flow_to_query_and_key(seed):
    g = torch.Generator().manual_seed(seed)
    query = unit_rows(g, 4, 8).requires_grad_()
    key = unit_rows(g, 4, 8).requires_grad_()
    info_nce(query, key, unit_rows(g, 7, 8), 0.2).backward()
    for tensor in (query, key):
        assert torch.isfinite(tensor.grad).all() and tensor.grad.abs().sum() > 0


def test_info_nce_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="key shape"):
        info_nce(torch.zeros(4, 8), torch.zeros(3, 8), torch.zeros(5, 8), 0.1)


# --------------------------------------------------------------------------- relational (ReSSL)


def test_relational_on_two_anchors_by_hand():
    # q on anchor 1, k on anchor 2, both temperatures 1: the target is softmax([0, 1]) = [1, e] / (1 + e),
    # the prediction's log-softmax of [1, 0] is [1, 0] - log(1 + e), so the loss is log(1 + e) - 1 / (1 + e).
    anchors = torch.eye(2, dtype=torch.float64)
    q, k = anchors[:1], anchors[1:]
    e = math.e
    assert relational(q, k, anchors, 1.0, 1.0).item() == pytest.approx(
        math.log(1 + e) - 1 / (1 + e), rel=1e-12
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_relational_with_a_sharp_teacher_is_cross_entropy_to_the_key_s_nearest_anchor(seed):
    g = torch.Generator().manual_seed(seed)
    q, k, anchors = unit_rows(g, 6, 8), unit_rows(g, 6, 8), unit_rows(g, 10, 8)
    nearest = (k @ anchors.T).argmax(dim=1)
    expected = F.cross_entropy(q @ anchors.T / 0.1, nearest)
    torch.testing.assert_close(relational(q, k, anchors, 0.1, 1e-6), expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_relational_of_a_query_equal_to_its_key_at_one_temperature_is_the_relation_s_entropy_and_a_minimum(
    seed,
):
    g = torch.Generator().manual_seed(seed)
    k, anchors = unit_rows(g, 5, 8), unit_rows(g, 12, 8)
    # relations as logits: the cross-entropy of a distribution with itself is its entropy, and its minimum
    logits = k @ anchors.T / 0.2
    p = F.softmax(logits, dim=1)
    entropy = -(p * p.log()).sum(dim=1).mean()
    loss = relational(k, k, anchors, 0.2, 0.2)
    torch.testing.assert_close(loss, entropy.detach())
    q = k.clone().requires_grad_()
    relational(q, k, anchors, 0.2, 0.2).backward()
    torch.testing.assert_close(q.grad, torch.zeros_like(q), atol=1e-12, rtol=0)


def test_relational_gives_the_key_no_gradient_and_the_query_some():
    g = torch.Generator().manual_seed(0)
    q, k = unit_rows(g, 4, 8).requires_grad_(), unit_rows(g, 4, 8).requires_grad_()
    relational(q, k, unit_rows(g, 9, 8), 0.1, 0.04).backward()
    assert k.grad is None and q.grad.abs().sum() > 0


def test_relational_rejects_bad_input():
    with pytest.raises(ValueError, match="key shape"):
        relational(torch.zeros(4, 8), torch.zeros(3, 8), torch.zeros(5, 8), 0.1, 0.04)
    with pytest.raises(ValueError, match="anchors"):
        relational(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(0, 8), 0.1, 0.04)
    with pytest.raises(ValueError, match="teacher_temperature"):
        relational(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(5, 8), 0.1, 0.0)


# --------------------------------------------------------------------------- supcon


def naive_supcon(features, labels, temperature, base_temperature, first_view_only=False):
    """Per-anchor double loop, straight from the paper's definition."""
    batch, views, _ = features.shape
    items = [(i, v) for i in range(batch) for v in range(views)]
    anchors = [(i, v) for (i, v) in items if v == 0 or not first_view_only]
    label = (lambda i: i) if labels is None else (lambda i: int(labels[i]))
    total = 0.0
    for i, v in anchors:
        anchor = features[i, v]
        others = [(j, w) for (j, w) in items if (j, w) != (i, v)]
        denominator = sum(math.exp(float(anchor @ features[j, w]) / temperature) for j, w in others)
        positives = [(j, w) for (j, w) in others if label(j) == label(i)]
        if positives:
            log_probs = [
                float(anchor @ features[j, w]) / temperature - math.log(denominator) for j, w in positives
            ]
            total += -(temperature / base_temperature) * sum(log_probs) / len(positives)
    return total / len(anchors)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("views", [1, 2, 3])
@pytest.mark.parametrize("temperature,base_temperature", [(0.07, 0.07), (0.1, 0.07), (0.5, 1.0)])
def test_supcon_matches_naive_loop(seed, views, temperature, base_temperature):
    g = torch.Generator().manual_seed(seed)
    features = unit_rows(g, 6, views, 5)
    labels = torch.randint(0, 3, (6,), generator=g)
    loss = supcon(features, labels, temperature, base_temperature)
    expected = naive_supcon(features, labels, temperature, base_temperature)
    assert loss.item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("use_labels", [False, True])
def test_supcon_mode_one_matches_naive_first_view_anchors(seed, use_labels):
    g = torch.Generator().manual_seed(seed)
    features = unit_rows(g, 5, 3, 4)
    labels = torch.randint(0, 2, (5,), generator=g) if use_labels else None
    loss = supcon(features, labels, temperature=0.1, contrast_mode="one")
    expected = naive_supcon(features, labels, 0.1, 0.07, first_view_only=True)
    assert loss.item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("contrast_mode", ["all", "one"])
def test_supcon_with_distinct_labels_is_nt_xent(seed, contrast_mode):
    g = torch.Generator().manual_seed(seed)
    features = unit_rows(g, 7, 2, 6)
    distinct = torch.randperm(7, generator=g) * 3
    with_labels = supcon(features, distinct, 0.2, contrast_mode=contrast_mode)
    without = supcon(features, None, 0.2, contrast_mode=contrast_mode)
    assert with_labels.item() == pytest.approx(without.item(), rel=1e-12)


@pytest.mark.parametrize("batch", [2, 5, 16])
@pytest.mark.parametrize("temperature,base_temperature", [(0.07, 0.07), (0.5, 0.07)])
@pytest.mark.parametrize("use_labels", [False, True])
def test_supcon_on_collapsed_features_is_log_of_contrast_count(
    batch, temperature, base_temperature, use_labels
):
    g = torch.Generator().manual_seed(batch)
    one_point = unit_rows(g, 1, 1, 8)
    features = one_point.expand(batch, 2, 8).contiguous()
    labels = torch.randint(0, 3, (batch,), generator=g) if use_labels else None
    loss = supcon(features, labels, temperature, base_temperature)
    expected = temperature / base_temperature * math.log(2 * batch - 1)
    assert loss.item() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("contrast_mode", ["all", "one"])
def test_supcon_is_invariant_to_batch_permutation(seed, contrast_mode):
    g = torch.Generator().manual_seed(seed)
    features = unit_rows(g, 8, 2, 6)
    labels = torch.randint(0, 3, (8,), generator=g)
    order = torch.randperm(8, generator=g)
    loss = supcon(features, labels, 0.1, contrast_mode=contrast_mode)
    permuted = supcon(features[order], labels[order], 0.1, contrast_mode=contrast_mode)
    assert permuted.item() == pytest.approx(loss.item(), rel=1e-12)


def test_supcon_anchors_without_positives_give_zero_not_nan():
    features = unit_rows(torch.Generator().manual_seed(0), 4, 1, 5).requires_grad_()
    loss = supcon(features, torch.arange(4))  # one view, distinct labels: no anchor has a positive
    loss.backward()
    assert loss.item() == 0.0
    assert torch.isfinite(features.grad).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_supcon_is_stable_at_small_temperature_and_differentiable(seed):
    g = torch.Generator().manual_seed(seed)
    features = unit_rows(g, 6, 2, 8).float().requires_grad_()
    loss = supcon(features, torch.randint(0, 2, (6,), generator=g), temperature=0.005)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(features.grad).all()
    assert features.grad.abs().sum() > 0


def test_supcon_rejects_bad_input():
    with pytest.raises(ValueError, match="batch, views, dim"):
        supcon(torch.zeros(4, 8))
    with pytest.raises(ValueError, match="contrast_mode"):
        supcon(torch.zeros(4, 2, 8), contrast_mode="both")
    with pytest.raises(ValueError, match="labels"):
        supcon(torch.zeros(4, 2, 8), torch.arange(3))


# --------------------------------------------------------------------------- proto_nce


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("temperature", [0.1, 0.3])
@pytest.mark.parametrize("form", PROTO_NCE_FORMS)
def test_proto_nce_with_each_point_its_own_cluster_is_in_batch_info_nce(seed, temperature, form):
    g = torch.Generator().manual_seed(seed)
    query, key = unit_rows(g, 8, 6), unit_rows(g, 8, 6)
    phi = torch.full((8,), temperature, dtype=torch.float64)
    loss = proto_nce(query, key, torch.arange(8), phi, form=form)
    in_batch = F.cross_entropy(query @ key.T / temperature, torch.arange(8))
    assert loss.item() == pytest.approx(in_batch.item(), rel=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_proto_nce_paper_eq10_lists_every_prototype_once_each_divided_by_its_phi(seed):
    g = torch.Generator().manual_seed(seed)
    query, prototypes = unit_rows(g, 6, 5), unit_rows(g, 4, 5)
    assignments = torch.randint(0, 4, (6,), generator=g)
    phi = 0.05 + torch.rand(4, generator=g, dtype=torch.float64)
    loss = proto_nce(query, prototypes, assignments, phi, form="paper_eq10")
    expected = 0.0
    for i in range(6):
        scores = [math.exp(float(query[i] @ prototypes[j]) / float(phi[j])) for j in range(4)]
        expected += -math.log(scores[assignments[i]] / sum(scores))
    assert loss.item() == pytest.approx(expected / 6, rel=1e-9)


def test_proto_nce_forms_differ_by_hand_when_two_images_share_a_prototype():
    # Two images, both assigned to prototype 0 = e1 and both with q = e1; prototype 1 = e2 is
    # nobody's positive; phi = 1. pcl/builder.py's row is [q.c0, q.c0, q.c1] = [1, 1, 0], target the
    # image's own column: log(2e + 1) - 1. Eq. 10's row is [1, 0]: log(e + 1) - 1.
    e1, e2 = torch.eye(2, dtype=torch.float64)
    query, prototypes = torch.stack([e1, e1]), torch.stack([e1, e2])
    assignments, phi = torch.tensor([0, 0]), torch.ones(2, dtype=torch.float64)
    official = proto_nce(query, prototypes, assignments, phi)
    eq10 = proto_nce(query, prototypes, assignments, phi, form="paper_eq10")
    assert official.item() == pytest.approx(math.log(2 * math.e + 1) - 1, rel=1e-12)
    assert eq10.item() == pytest.approx(math.log(math.e + 1) - 1, rel=1e-12)


def pcl_builder_loss(q, im2cluster, index, prototypes, density):
    """salesforce/PCL pcl/builder.py's prototypical logits and targets for one clustering, with r = all
    the prototypes no image of the batch is assigned to, re-derived line by line (then its
    CrossEntropyLoss). The negatives are a set there (drawn by random.sample); their order does not
    change a softmax."""
    pos_proto_id = im2cluster[index]
    pos_prototypes = prototypes[pos_proto_id]
    all_proto_id = [i for i in range(im2cluster.max() + 1)]
    neg_proto_id = sorted(set(all_proto_id) - set(pos_proto_id.tolist()))
    neg_prototypes = prototypes[neg_proto_id]
    proto_selected = torch.cat([pos_prototypes, neg_prototypes], dim=0)
    logits_proto = torch.mm(q, proto_selected.t())
    labels_proto = torch.linspace(0, q.size(0) - 1, steps=q.size(0)).long()
    temp_proto = density[torch.cat([pos_proto_id, torch.LongTensor(neg_proto_id)], dim=0)]
    logits_proto /= temp_proto
    return F.cross_entropy(logits_proto, labels_proto)


@pytest.mark.parametrize("seed", SEEDS)
def test_proto_nce_default_is_pcl_builders_loss_with_every_other_prototype(seed):
    g = torch.Generator().manual_seed(seed)
    k, n = 9, 40
    im2cluster = torch.cat([torch.arange(k), torch.randint(0, k, (n - k,), generator=g)])  # none empty
    index = torch.randperm(n, generator=g)[:12]  # a batch of 12 images: several share a cluster
    q, prototypes = unit_rows(g, 12, 5), unit_rows(g, k, 5)
    density = 0.05 + torch.rand(k, generator=g, dtype=torch.float64)
    assert len(set(im2cluster[index].tolist())) < min(12, k)  # repeats, and some prototypes left out
    loss = proto_nce(q, prototypes, im2cluster[index], density)
    expected = pcl_builder_loss(q, im2cluster, index, prototypes, density)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    eq10 = proto_nce(q, prototypes, im2cluster[index], density, form="paper_eq10")
    assert abs(loss.item() - eq10.item()) > 0.05


@pytest.mark.parametrize("seed", SEEDS)
def test_proto_nce_paper_eq10_with_r_negatives_lists_each_candidate_once(seed):
    g = torch.Generator().manual_seed(seed)
    k = 12
    query, prototypes = unit_rows(g, 7, 5), unit_rows(g, k, 5)
    assignments = torch.tensor([0, 3, 3, 5, 0, 0, 8])
    phi = 0.05 + torch.rand(k, generator=g, dtype=torch.float64)
    loss = proto_nce(
        query, prototypes, assignments, phi, 3, torch.Generator().manual_seed(seed), form="paper_eq10"
    )
    negatives = sample_negative_prototypes(assignments, k, 3, torch.Generator().manual_seed(seed))
    candidates = [0, 3, 5, 8] + negatives.tolist()
    expected = 0.0
    for i in range(7):
        scores = [math.exp(float(query[i] @ prototypes[j]) / float(phi[j])) for j in candidates]
        expected += -math.log(scores[candidates.index(int(assignments[i]))] / sum(scores))
    assert loss.item() == pytest.approx(expected / 7, rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("r", [1, 5, 9])
def test_sampled_negative_prototypes_are_r_unique_ids_outside_the_positives(seed, r):
    g = torch.Generator().manual_seed(seed)
    assignments = torch.randint(0, 20, (12,), generator=g)
    negatives = sample_negative_prototypes(assignments, 20, r, generator=g)
    assert negatives.dtype == torch.long and negatives.shape == (r,)
    assert len(set(negatives.tolist())) == r
    assert set(negatives.tolist()).isdisjoint(assignments.tolist())
    assert all(0 <= n < 20 for n in negatives.tolist())


def test_sampled_negative_prototypes_cover_every_candidate_and_follow_the_generator():
    assignments = torch.tensor([0, 3, 3, 7])
    candidates = set(range(10)) - {0, 3, 7}
    seen = set()
    for seed in range(30):
        seen |= set(
            sample_negative_prototypes(assignments, 10, 2, torch.Generator().manual_seed(seed)).tolist()
        )
    assert seen == candidates
    first = sample_negative_prototypes(assignments, 10, 4, torch.Generator().manual_seed(5))
    again = sample_negative_prototypes(assignments, 10, 4, torch.Generator().manual_seed(5))
    assert torch.equal(first, again)


def test_sampling_more_negatives_than_available_is_a_clear_error():
    with pytest.raises(ValueError, match="num_negatives=3"):
        sample_negative_prototypes(torch.tensor([0, 1, 2]), 5, 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_proto_nce_with_all_remaining_negatives_matches_hand_computation(seed):
    g = torch.Generator().manual_seed(seed)
    k = 12
    query, prototypes = unit_rows(g, 7, 5), unit_rows(g, k, 5)
    assignments = torch.randint(0, k, (7,), generator=g)
    phi = 0.05 + torch.rand(k, generator=g, dtype=torch.float64)
    positives = set(assignments.tolist())
    outside = [j for j in range(k) if j not in positives]

    loss = proto_nce(query, prototypes, assignments, phi, num_negatives=len(outside), generator=g)

    # facebookresearch/PCL: the candidates are every query's positive prototype (repeats kept),
    # then the negatives; query i's target is the i-th candidate.
    candidates = [int(c) for c in assignments] + outside
    expected = 0.0
    for i in range(7):
        scores = [math.exp(float(query[i] @ prototypes[j]) / float(phi[j])) for j in candidates]
        expected += -math.log(scores[i] / sum(scores))
    assert loss.item() == pytest.approx(expected / 7, rel=1e-9)


@pytest.mark.parametrize("form", PROTO_NCE_FORMS)
@pytest.mark.parametrize("num_negatives", [None, 3])
def test_proto_nce_on_row_blocks_of_a_batch_averages_to_the_whole_batch_loss(form, num_negatives):
    """Under DDP each rank passes its rows and the whole batch's assignments: the mean of the
    blocks' losses is the one-process loss (every block sees the same candidates)."""
    g = torch.Generator().manual_seed(3)
    k = 16
    query, prototypes = unit_rows(g, 8, 5), unit_rows(g, k, 5)
    assignments = torch.tensor([0, 1, 1, 2, 4, 4, 4, 7])
    phi = 0.05 + torch.rand(k, generator=g, dtype=torch.float64)

    def loss(rows, **batch):
        return proto_nce(
            query[rows],
            prototypes,
            assignments[rows],
            phi,
            num_negatives,
            torch.Generator().manual_seed(9),
            form=form,
            **batch,
        )

    whole = loss(slice(0, 8))
    blocks = [loss(slice(i, i + 4), batch_assignments=assignments, first_row=i) for i in (0, 4)]
    assert float(sum(blocks) / 2) == pytest.approx(float(whole), rel=1e-12)
    if form == "official" or num_negatives is not None:  # eq. 10 over all prototypes ignores the batch
        alone = loss(slice(4, 8))  # a block's own candidates make another loss
        assert float(alone) != pytest.approx(float(blocks[1]), rel=1e-6)


@pytest.mark.parametrize("num_negatives", [None, 3])
def test_proto_nce_gradients_flow_to_query(num_negatives):
    g = torch.Generator().manual_seed(0)
    query = unit_rows(g, 5, 6).requires_grad_()
    loss = proto_nce(
        query,
        unit_rows(g, 10, 6),
        torch.tensor([0, 1, 1, 2, 4]),
        torch.full((10,), 0.1, dtype=torch.float64),
        num_negatives=num_negatives,
        generator=g,
    )
    loss.backward()
    assert torch.isfinite(query.grad).all() and query.grad.abs().sum() > 0


def test_proto_nce_rejects_bad_input():
    query, prototypes = torch.zeros(3, 4), torch.zeros(5, 4)
    with pytest.raises(ValueError, match="concentration"):
        proto_nce(query, prototypes, torch.tensor([0, 1, 2]), torch.ones(4))
    with pytest.raises(ValueError, match="prototype ids"):
        proto_nce(query, prototypes, torch.tensor([0, 1, 5]), torch.ones(5))
    with pytest.raises(ValueError, match="paper_eq10"):
        proto_nce(query, prototypes, torch.tensor([0, 1, 2]), torch.ones(5), form="eq10")


def test_me_max_by_hand_zero_for_a_uniform_mean_assignment_and_log_k_at_collapse():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1]])
    mean = [0.3, 0.55, 0.15]
    assert float(me_max(probs)) == pytest.approx(sum(m * math.log(m) for m in mean) + math.log(3), rel=1e-6)
    spread = torch.eye(4) * 0.96 + 0.01  # each row sums to 1; their mean is uniform
    assert float(me_max(spread)) == pytest.approx(0.0, abs=1e-6)
    collapsed = torch.tensor([[1 - 3e-7, 1e-7, 1e-7, 1e-7]]).repeat(4, 1)  # every row on prototype 0
    assert float(me_max(collapsed)) == pytest.approx(math.log(4), abs=1e-5)


# --------------------------------------------------------------------------- soft_cross_entropy


def test_soft_cross_entropy_with_one_hot_targets_is_cross_entropy_and_its_mean_is_over_every_row():
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(7, (3, 5), generator=torch.Generator().manual_seed(1))
    one_hot = F.one_hot(labels, 7).float()
    expected = F.cross_entropy(logits.flatten(0, 1) / 0.5, labels.flatten())
    torch.testing.assert_close(soft_cross_entropy(one_hot, logits, 0.5), expected)
    # uniform targets over 2 classes of equal logits: log 2 per row
    assert float(soft_cross_entropy(torch.full((4, 2), 0.5), torch.zeros(4, 2), 0.1)) == pytest.approx(
        math.log(2)
    )


# --------------------------------------------------------------------------- masked_patch_cross_entropy


def test_the_masked_patch_loss_by_hand_an_image_without_masked_patches_counts_zero():
    teacher = torch.tensor([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [1.0, 0.0]]])  # [2 images, 2 patches, 2]
    logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0]], [[1.0, 0.0], [0.0, 3.0]]])
    mask = torch.tensor([[1, 1], [0, 0]]).bool()  # the second image has no masked patch
    log_p = F.log_softmax(logits, dim=-1)
    first = (-(teacher[0, 0] * log_p[0, 0]).sum() - (teacher[0, 1] * log_p[0, 1]).sum()) / 2
    expected = (first + 0.0) / 2  # the mean over both images
    # the masked patches' rows, as a method passes them
    assert float(masked_patch_cross_entropy(teacher[mask], logits[mask], mask)) == pytest.approx(
        float(expected)
    )
    one = torch.tensor([[0, 1], [0, 0]]).bool()
    expected_one = -(teacher[0, 1] * log_p[0, 1]).sum() / 2
    assert float(masked_patch_cross_entropy(teacher[one], logits[one], one)) == pytest.approx(
        float(expected_one)
    )


# --------------------------------------------------------------------------- koleo


def test_koleo_by_hand_on_four_points_of_the_circle():
    # unit vectors at 0, 90, 100 and 180 degrees: nearest neighbours 90 <-> 100 (10 degrees apart), 0 -> 90
    # and 180 -> 100
    angles = torch.tensor([0.0, 90.0, 100.0, 180.0], dtype=torch.float64).deg2rad()
    x = torch.stack([angles.cos(), angles.sin()], dim=1) * torch.tensor(
        [[3.0], [1.0], [2.0], [0.5]], dtype=torch.float64
    )
    chord = lambda degrees: 2 * math.sin(math.radians(degrees) / 2)  # noqa: E731
    nearest = [chord(90), chord(10), chord(10), chord(80)]
    expected = -sum(math.log(d + 1e-8) for d in nearest) / 4
    assert koleo(x).item() == pytest.approx(expected, rel=1e-6)  # the norms do not matter


def test_koleo_grows_as_two_embeddings_meet_and_pushes_them_apart():
    spread = torch.eye(4)
    close = spread.clone()
    close[1] = torch.tensor([1.0, 0.01, 0.0, 0.0])
    assert koleo(close).item() > koleo(spread).item() + 1.0
    x = close.clone().requires_grad_(True)
    koleo(x).backward()
    step = F.normalize(x - 0.01 * x.grad, dim=1)
    assert torch.dot(step[0], step[1]) < torch.dot(F.normalize(close, dim=1)[0], F.normalize(close, dim=1)[1])


def test_koleo_needs_a_batch_of_two_or_more():
    with pytest.raises(ValueError, match="at least 2"):
        koleo(torch.ones(1, 3))


# ------------------------------------------------------------------- cross_view_cross_entropy's weights


def test_view_weights_scale_each_student_view_s_pairs_and_the_mean_stays_over_the_pairs():
    g = torch.Generator().manual_seed(0)
    targets = [F.softmax(torch.randn(5, 7, generator=g, dtype=torch.float64), dim=1) for _ in range(2)]
    logits = [torch.randn(5, 7, generator=g, dtype=torch.float64) for _ in range(4)]  # 2 global, 2 local
    pair = {
        (i, v): -(targets[i] * F.log_softmax(logits[v] / 0.1, dim=1)).sum(dim=1).mean()
        for i in range(2)
        for v in range(4)
        if v != i
    }
    local = sum(term for (i, v), term in pair.items() if v >= 2)
    glob = sum(term for (i, v), term in pair.items() if v < 2)
    weighted = cross_view_cross_entropy(targets, logits, 0.1, [1.0, 1.0, 0.5, 0.5])
    assert torch.allclose(weighted, (glob + 0.5 * local) / len(pair))
    assert torch.equal(
        cross_view_cross_entropy(targets, logits, 0.1, [1.0] * 4),
        cross_view_cross_entropy(targets, logits, 0.1),
    )
    with pytest.raises(ValueError, match="3 view weights for 4 views"):
        cross_view_cross_entropy(targets, logits, 0.1, [1.0] * 3)


# --------------------------------------------------------------------------- gram_loss


def test_gram_loss_is_zero_for_the_same_features_at_any_scale_and_by_hand_on_two_patches():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    assert gram_loss(x, 2.5 * x).item() == pytest.approx(0.0, abs=1e-12)  # normalised: the scale is gone
    # student patches (1, 0), (0, 1): Gram [[1, 0], [0, 1]]; teacher (1, 0), (1, 1) / sqrt 2: [[1, r],
    # [r, 1]], r = 1 / sqrt 2; the mean of the squared differences over the 4 entries: 2 r^2 / 4 = 0.25
    student = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    teacher = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]], dtype=torch.float64)
    assert gram_loss(student, teacher).item() == pytest.approx(0.25)


def test_gram_loss_is_per_image_not_across_the_batch():
    g = torch.Generator().manual_seed(1)
    s, t = torch.randn(2, 6, 4, generator=g), torch.randn(2, 6, 4, generator=g)
    each = (gram_loss(s[:1], t[:1]) + gram_loss(s[1:], t[1:])) / 2
    assert torch.allclose(gram_loss(s, t), each)


@pytest.mark.parametrize(
    "student_sim,teacher_sim,expected",
    [  # keep, clip, clip_teacher: the off-diagonal similarity of two patches, squared error x 2 / 4 entries
        (0.0, -1.0, (0.5, 0.0, 0.0)),  # the teacher's negative: dropped by both clippings
        (-0.6, -1.0, (0.08, 0.0, 0.0)),  # both negative: clip_teacher zeroes the student's too
        (-0.6, 0.5, (0.605, 0.125, 0.605)),  # only the student's negative: clip_teacher keeps it
    ],
)
def test_gram_loss_s_negative_similarities_by_hand(student_sim, teacher_sim, expected):
    def pair(cos):
        return torch.tensor([[[1.0, 0.0], [cos, math.sqrt(1 - cos**2)]]], dtype=torch.float64)

    got = [
        gram_loss(pair(student_sim), pair(teacher_sim), mode).item()
        for mode in ("keep", "clip", "clip_teacher")
    ]
    assert got == pytest.approx(list(expected))
    with pytest.raises(ValueError, match="negatives must be one of"):
        gram_loss(pair(0.0), pair(0.0), "drop")
