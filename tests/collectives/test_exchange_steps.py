"""The exchange's step tags: waits from different steps are never compared."""

import numpy as np

from jaxpace.collectives import exchange as _exchange


def payload(waits, tags, steps_s=None):
    n = len(waits)
    p = np.zeros(3 * n, np.float32)
    p[:n] = waits
    p[n : 2 * n] = tags
    if steps_s is not None:
        p[2 * n :] = steps_s
    return p


def test_waits_of_another_step_are_dropped_and_counted():
    # Ranks 0-2 report step 9 (tag 11), rank 3 an older step 8 (tag 10): its wait is not
    # compared with theirs.
    view = _exchange.decode(payload([0.004, 0.001, 0.002, 0.0], [11, 11, 11, 10]), 4, 1.0)
    assert view.mismatched == 1
    np.testing.assert_allclose(view.earliness_s[:3], [0.003, 0.0, 0.001], atol=1e-7)
    assert np.isnan(view.earliness_s[3])


def test_same_step_or_untagged_waits_are_all_kept():
    view = _exchange.decode(payload([0.004, 0.001, 0.0], [7, 7, 7]), 3, 1.0)
    assert view.mismatched == 0 and np.isfinite(view.earliness_s).all()
    view = _exchange.decode(payload([0.004, 0.001, 0.0], [1, 1, 1]), 3, 1.0)  # no tags
    assert view.mismatched == 0 and np.isfinite(view.earliness_s).all()


def test_a_tie_keeps_the_newer_step():
    view = _exchange.decode(payload([0.003, 0.001, 0.002, 0.0], [5, 5, 6, 6]), 4, 1.0)
    assert view.mismatched == 2
    assert np.isnan(view.earliness_s[:2]).all() and np.isfinite(view.earliness_s[2:]).all()


def test_tags_survive_a_pmean_division_at_large_steps():
    n = 3
    tag = 2.0 + (_exchange.STEP_TAG_MOD - 1)  # the largest tag
    p = payload([0.004, 0.001, 0.0], [tag, tag, tag])
    mean = (p.astype(np.float32) / np.float32(n)).astype(np.float32)  # what pmean hands back
    view = _exchange.decode(mean, n, _exchange.reduction_scale("pmean", n))
    assert view.mismatched == 0 and np.isfinite(view.earliness_s).all()


def test_stats_probe_line_names_every_loss():
    from jaxpace.native import driver

    assert driver._lost_text(0, 0, 0, 0, 0) == []
    text = " ".join(driver._lost_text(3, 17, 16, 1, 2))
    assert "3 records dropped" in text
    assert "17 CUDA calls failed, 16 steps not recorded" in text and "disabled" in text
    assert "2 exchanged waits of another step dropped" in text
