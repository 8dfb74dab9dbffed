"""`jaxpace.diagnosis.culprit.decide_groups`: the one culprit decision, for groups of ranks.

The report's stage (`report.stages.culprit.late_groups`) only names what this decides.
"""

import numpy as np

from jaxpace.diagnosis.culprit import decide, decide_groups, group_partitions
from jaxpace.report import analyze, synthetic_records
from jaxpace.report.stages.culprit import late_groups

R, STEPS, STEP_S = 32, 200, 0.012
RANKS = np.arange(R)
HOST = {r: f"h{r // 8}" for r in range(R)}
NUMA = {r: f"h{r // 8}/{(r // 4) % 2}" for r in range(R)}


def _lateness(late: dict[int, float], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lat = rng.exponential(3e-4, (STEPS, R)) + rng.normal(0, 2e-5, R)  # noise + static spread
    for r, s in late.items():
        lat[:, r] += s
    return lat


def _decide(lat: np.ndarray, groups: dict) -> tuple:
    parts = group_partitions(RANKS, RANKS, groups)  # one rank per process
    return decide_groups(lat, parts, decide(lat, STEP_S).floor_s, STEP_S)


def test_a_late_numa_node_is_named_with_its_members():
    found = _decide(_lateness({r: 3e-3 for r in (12, 13, 14, 15)}), {"host": HOST, "numa": NUMA})
    assert [(g.kind, g.label) for g in found] == [
        ("numa", "h1/1")
    ]  # not its host: half its ranks are on time
    g = found[0]
    assert g.members.tolist() == [12, 13, 14, 15] and g.late_members.tolist() == [12, 13, 14, 15]
    assert 2.5e-3 < g.effect_s < 3.5e-3 and g.ci_low_s < g.effect_s < g.ci_high_s
    assert g.p_adjusted < 1e-3 and g.fleet_sd > 5


def test_a_whole_late_host_is_named_instead_of_its_numa_halves():
    found = _decide(_lateness({r: 2e-3 for r in range(16, 24)}), {"host": HOST, "numa": NUMA})
    assert [(g.kind, g.label) for g in found] == [("host", "h2")]


def test_healthy_ranks_and_one_straggler_make_no_late_group():
    assert _decide(_lateness({}), {"host": HOST, "numa": NUMA}) == ()
    # One late rank does not make its NUMA node (or host) late: the group's typical
    # member is on time, and without its latest member the group is no outlier.
    assert _decide(_lateness({5: 5e-3}), {"host": HOST, "numa": NUMA}) == ()


def test_partitions_skip_untestable_and_repeated_groupings():
    parts = group_partitions(RANKS, RANKS // 8, {"host": HOST, "numa": NUMA, "one": {0: "x"}})
    # Processes of 8 ranks equal the hosts: tested once, as processes; "one" leaves ranks out.
    assert [kind for kind, _, _ in parts] == ["process", "numa"]


def test_the_report_names_what_the_diagnosis_decides():
    recs = synthetic_records(R, 120, groups=NUMA, group_late_s={"h3/0": 0.003}, seed=2)
    rep = analyze(recs, topology_groups={"host": HOST, "numa": NUMA})
    data = rep.data
    rows = slice(rep.num_steps - rep.analyzed_steps, None)  # no periodic steps in this run
    lat = data.lateness[rows]
    direct = decide_groups(
        lat, group_partitions(data.ranks, data.processes, {"host": HOST, "numa": NUMA}),
        rep.noise_floor_s, rep.iteration.p50_s,
    )  # fmt: skip
    staged = late_groups(data, lat, {"host": HOST, "numa": NUMA}, rep.noise_floor_s,
                         rep.iteration.p50_s)  # fmt: skip
    assert [(g.kind, g.label) for g in rep.late_groups] == [("numa", "h3/0")]
    assert [(g.kind, g.label, g.p_adjusted) for g in staged] == [
        (g.kind, g.label, g.p_adjusted) for g in direct
    ]
    assert rep.late_groups[0].ranks == tuple(int(r) for r in data.ranks[direct[0].members])
