"""`jaxpace.diagnosis.stats`: Student's t from `scipy.special`, checked against `scipy.stats.t`."""

import numpy as np
import pytest
from scipy import stats as sps

from jaxpace.diagnosis.stats import t_isf, t_sf

DFS = (0.5, 1, 2.5, 7.5, 10, 29, 31, 255.5, 1e6)


@pytest.mark.parametrize("df", DFS)
def test_t_sf_is_students_upper_tail(df):
    t = np.array([-50.0, -2.0, 0.0, 0.5, 2.228, 7.0, 40.0, np.inf, -np.inf])
    np.testing.assert_allclose(t_sf(t, df), sps.t.sf(t, df), rtol=1e-12, atol=0)


def test_t_sf_of_nan_is_no_evidence():
    assert t_sf(np.array([np.nan, 0.0]), 5.0).tolist() == [1.0, 0.5]


@pytest.mark.parametrize("df", DFS)
@pytest.mark.parametrize("p", (0.5, 0.025, 1e-3, 1e-6, 1e-9, 0.999))
def test_t_isf_inverts_the_upper_tail(p, df):
    # The family-wise thresholds ask for p = alpha / R: far tails at few degrees of freedom
    # (t beyond 1e6 at df 1, p 1e-9), which a bounded search cannot reach.
    assert t_isf(p, df) == pytest.approx(sps.t.isf(p, df), rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("p", (0.0, 1.0, -0.1, float("nan")))
def test_t_isf_names_a_bad_p(p):
    with pytest.raises(ValueError, match="`p` must be in"):
        t_isf(p, 3.0)


def test_a_rank_late_in_every_block_is_consistent_and_an_episode_is_not():
    from jaxpace.diagnosis.persistence import consistent

    # Ten steps, a rank 46-49 ms late in each (the accuracy benchmark's 1.5x rank at 8
    # ranks): its blocks of 5 differ by 3 ms on SDs of 0.5-1 ms, significant but not
    # material; it was "late in part of this short run only".
    rank = np.array([48.9, 50.3, 49.2, 47.6, 48.8, 46.6, 46.6, 46.8, 47.8, 46.5]) * 1e-3
    others = np.zeros((10, 3))
    assert consistent(np.column_stack([rank, others]), 1e-3, centre=False)[0]
    # Late 40 ms in the first 5 steps and on time after: an episode.
    episode = np.r_[np.full(5, 0.04), np.full(5, 0.0005)] + np.linspace(0, 1e-4, 10)
    assert not consistent(np.column_stack([episode, others]), 1e-4, centre=False)[0]
    # Late in both blocks, but 40 ms in one and 4 ms in the other: less late by 90%.
    half = np.r_[np.full(5, 0.04), np.full(5, 0.004)] + np.tile([0, 1e-4], 5)
    assert not consistent(np.column_stack([half, others]), 1e-4, centre=False)[0]
