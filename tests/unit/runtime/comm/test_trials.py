"""The trial schedule of measured `auto`: what runs when, what is timed, what is picked."""

from __future__ import annotations

import pytest

from trainwave.runtime.comm.trials import TrialOptions, Trials, pick_fastest, prune, trial_order

ONE_AND_TWO = TrialOptions(warmup_steps=1, timed_steps=2)


def make_trials(candidates, *, options=ONE_AND_TWO, not_before=None) -> Trials:
    return Trials(list(candidates), options, not_before=not_before or {})


def run(trials: Trials, seconds: dict[str, float], steps: int) -> list[str]:
    """Drive `steps` steps, each taking its strategy's time; agree the way the driver does."""
    ran = []
    for _ in range(steps):
        ran.append(trials.current)
        trials.finished(seconds[trials.current])
        if trials.due:
            names = trials.pending()
            trials.agree(names, trials.local_medians(names))
    return ran


@pytest.mark.parametrize(
    ("candidates", "not_before", "expected"),
    [
        pytest.param(
            ["flat", "fp16", "hierarchical"],
            {},
            ["flat", "fp16", "hierarchical"] * 3,
            id="round-robin",
        ),
        pytest.param(
            ["flat", "powersgd"],
            {"powersgd": 2},
            ["flat"] * 3 + ["powersgd"] * 3,
            id="powersgd-start-already-passed",
        ),
        pytest.param(
            ["flat", "fp16", "powersgd"],
            {"powersgd": 9},
            ["flat", "fp16"] * 3 + ["<interim>"] * 3 + ["powersgd"] * 3,
            id="powersgd-waits-for-its-start",
        ),
    ],
)
def test_schedule(candidates, not_before, expected):
    trials = make_trials(candidates, not_before=not_before)
    trials.interim = "<interim>"  # stands in for the interim agreement
    assert [trials.strategy_at(s) for s in range(len(expected))] == expected
    assert trials.end == len(expected)


def test_warmup_steps_are_not_timed():
    trials = make_trials(["flat", "fp16"])
    run(trials, {"flat": 1.0, "fp16": 0.5}, 6)
    assert trials.samples == {"flat": [1.0, 1.0], "fp16": [0.5, 0.5]}


def test_a_burst_of_load_hits_every_candidate():
    """Steps 2-3 are slow for whatever runs then; round-robin spreads that over both."""
    trials = make_trials(["flat", "fp16"])
    for step in range(trials.end):
        base = {"flat": 1.0, "fp16": 0.8}[trials.current]
        trials.finished(base + (5.0 if step in (2, 3) else 0.0))
    assert trials.samples == {"flat": [6.0, 1.0], "fp16": [5.8, 0.8]}


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        pytest.param({"flat": 1.0, "fp16": 0.5}, "fp16", id="lossy-2x-faster"),
        pytest.param({"flat": 1.0, "fp16": 0.95}, "flat", id="lossy-within-margin"),
        pytest.param({"flat": 0.5, "fp16": 1.0}, "flat", id="exact-faster"),
    ],
)
def test_final_pick_runs_after_the_trials(seconds, expected):
    trials = make_trials(["flat", "fp16"])
    ran = run(trials, seconds, 10)
    assert trials.chosen == expected
    assert ran[6:] == [expected] * 4
    assert not trials.measuring


def test_interim_pick_runs_until_the_deferred_trial_then_the_final_pick():
    trials = make_trials(["flat", "fp16", "powersgd"], not_before={"powersgd": 10})
    ran = run(trials, {"flat": 1.0, "fp16": 2.0, "powersgd": 0.5}, 16)
    assert ran[:6] == ["flat", "fp16"] * 3
    assert ran[6:10] == ["flat"] * 4  # measured faster than fp16 so far
    assert ran[10:13] == ["powersgd"] * 3
    assert trials.chosen == "powersgd"
    assert ran[13:] == ["powersgd"] * 3


def test_every_candidate_deferred_runs_the_first_until_its_start():
    trials = make_trials(["powersgd", "fp16"], not_before={"powersgd": 4, "fp16": 4})
    ran = run(trials, {"fp16": 1.0, "powersgd": 0.5}, 12)
    assert ran[:4] == ["powersgd"] * 4
    assert trials.chosen == "powersgd"


def test_agreed_numbers_decide_not_local_ones():
    """Two ranks with opposite local timings pick the same, from the agreed means."""
    picks = []
    for local in ({"flat": 1.0, "hierarchical": 3.0}, {"flat": 3.0, "hierarchical": 1.2}):
        trials = make_trials(["flat", "hierarchical"])
        for _ in range(trials.end):
            trials.finished(local[trials.current])
        assert trials.due
        names = trials.pending()
        trials.agree(names, [2.0, 2.1])  # what the allreduce would give both
        picks.append(trials.chosen)
    assert picks == ["flat", "flat"]


def test_single_candidate_needs_no_trials():
    trials = make_trials(["hierarchical"])
    assert (trials.chosen, trials.end, trials.measuring) == ("hierarchical", 0, False)
    assert trials.strategy_at(0) == "hierarchical"


@pytest.mark.parametrize(
    ("times", "margin", "expected"),
    [
        pytest.param({"flat": 1.0, "hierarchical": 0.9}, 1.1, "hierarchical", id="exact-vs-exact"),
        pytest.param({"flat": 1.0, "powersgd": 0.5}, 1.1, "powersgd", id="lossy-clear-win"),
        pytest.param({"flat": 1.0, "powersgd": 0.95}, 1.1, "flat", id="lossy-small-win"),
        pytest.param({"fp16": 1.0, "powersgd": 0.9}, 1.1, "powersgd", id="no-exact-allowed"),
        pytest.param({"flat": 1.0, "hierarchical": 1.0}, 1.1, "flat", id="tie-goes-first"),
    ],
)
def test_pick_fastest(times, margin, expected):
    assert pick_fastest(times, margin)[0] == expected


ESTIMATES_1G = {  # the cost model at 1 Gbit/s in bench_comm: powersgd far too cheap
    "powersgd": 0.055,
    "hierarchical+fp16": 0.128,
    "fp16": 0.13,
    "hierarchical": 0.218,
    "flat": 0.222,
}


@pytest.mark.parametrize(
    ("estimates", "options", "kept", "left_out"),
    [
        pytest.param(
            ESTIMATES_1G,
            TrialOptions(max_candidates=4),
            ["flat", "hierarchical", "hierarchical+fp16", "powersgd"],
            ["fp16"],
            id="flat-and-best-exact-always-kept",
        ),
        pytest.param(
            ESTIMATES_1G,
            TrialOptions(),
            ["flat", "hierarchical", "fp16", "hierarchical+fp16", "powersgd"],
            [],
            id="default-keeps-all-but-hopeless",
        ),
        pytest.param(
            {"powersgd": 0.01, "fp16": 0.5, "flat": 1.0},
            TrialOptions(max_candidates=4, prune_factor=10.0),
            ["flat", "powersgd"],
            ["fp16"],
            id="hopeless-by-the-factor",
        ),
        pytest.param(
            {"hierarchical": 0.5, "hierarchical+fp16": 0.4},
            TrialOptions(max_candidates=1),
            ["hierarchical"],
            ["hierarchical+fp16"],
            id="no-flat-allowed",
        ),
    ],
)
def test_prune(estimates, options, kept, left_out):
    assert prune(estimates, options) == (kept, left_out)


def test_trial_order_puts_exact_first_and_powersgd_last():
    assert trial_order(["powersgd", "fp16", "hierarchical", "flat"]) == [
        "flat",
        "hierarchical",
        "fp16",
        "powersgd",
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"warmup_steps": 0}, "warmup_steps=0: must be >= 1", id="no-warmup"),
        pytest.param({"timed_steps": 0}, "timed_steps must be >= 1, got 0", id="no-timed"),
        pytest.param({"lossy_margin": 0.9}, "lossy_margin must be >= 1.0, got 0.9", id="margin"),
    ],
)
def test_options_reject(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrialOptions(**kwargs)


def test_candidates_must_be_distinct():
    with pytest.raises(ValueError, match=r"distinct and non-empty, got \['flat', 'flat'\]"):
        make_trials(["flat", "flat"])
