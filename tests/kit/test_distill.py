"""sslbench.kit.distill: DINOv3's weight schedule against linear_warmup_cosine_decay written out with numpy.
The rest of the step (masks, targets, terms, groups, clipping) is pinned through DINOv2's method:
tests/methods/test_dinov2.py."""

import numpy as np
import pytest

from sslbench.kit.distill import warmup_cosine_value


def official_schedule(start, peak, end, warmup, total, cosine):
    """cosine_lr_scheduler.py's linear_warmup_cosine_decay, as its docstring and code define it."""
    linear = np.linspace(start, peak, warmup, endpoint=False)
    cos = (np.cos(np.linspace(0, np.pi, cosine)) + 1) / 2
    return np.concatenate([linear, (peak - end) * cos + end, np.full(total - warmup - cosine, end)])


@pytest.mark.parametrize(
    "start,peak,end,warmup,cosine",
    [
        (
            0.0,
            0.0,
            2.0,
            83,
            1,
        ),  # the Gram weight of the 7B's gram-anchor config, 1200 epochs scaled to 100 steps
        (1.0, 1.0, 0.5, 50, 10),  # the local crops' DINO weight, with a ramp of 10 steps
        (0.0, 1.0, 0.1, 5, 7),  # a warm-up that climbs, then a cosine down
        (3.0, 3.0, 1.0, 0, 4),  # no warm-up
    ],
)
def test_warmup_cosine_value_is_linear_warmup_cosine_decay_at_every_step(start, peak, end, warmup, cosine):
    total = 100
    official = official_schedule(start, peak, end, warmup, total, cosine)
    ours = [warmup_cosine_value(step, start, peak, end, warmup, cosine) for step in range(total)]
    assert ours == pytest.approx(list(official), abs=1e-12)
    assert warmup_cosine_value(10 * total, start, peak, end, warmup, cosine) == end  # past the array: its end


def test_a_ramp_of_no_step_jumps_to_the_end_value():
    assert [warmup_cosine_value(s, 0.0, 0.0, 2.0, 3, 0) for s in range(5)] == [0.0, 0.0, 0.0, 2.0, 2.0]
