from mbridge_ep_overlap.lab.numerics import BF16_RTOL, compare_losses, losses_from_summary


def test_equal_and_within_tolerance_pass():
    a = {1: 10.61, 2: 10.37}
    assert compare_losses(a, dict(a)).ok
    assert compare_losses(a, {1: 10.61 * (1 + BF16_RTOL / 2), 2: 10.37}).ok


def test_each_failure_is_reported():
    a = {1: 10.0, 2: 9.0, 3: 8.0}
    r = compare_losses(a, {1: 10.0, 2: 9.5, 3: float("nan")}, skipped={1})
    assert not r.ok
    text = " ".join(r.problems)
    assert "iteration 2" in text and "iteration 3: non-finite" in text and "iteration 1 was skipped" in text
    assert not compare_losses(a, {1: 10.0, 2: 9.0}).ok  # missing iteration
    assert not compare_losses({}, {}).ok


def test_losses_from_summary():
    summary = {"steps": [{"iteration": 1, "loss": 1.0, "skipped": False}, {"iteration": 2, "loss": 2.0, "skipped": True}]}
    assert losses_from_summary(summary) == ({1: 1.0, 2: 2.0}, {2})
