"""Edges of the sweep's Pareto front and plot, and of the SOAR score (salactl.bench.pareto,
salactl.bench.scoring): ties on one objective, the plot's log axis, and accuracies at the ends of
the range."""

import matplotlib
import matplotlib.axes
import pytest

from salactl.bench.pareto import pareto_front, plot_front
from salactl.bench.scoring import accuracy_coefficient, parse_reference, soar_score
from salactl.errors import UsageError


def _pts(*xy):
    return [{"phase": f"p{i}", "x": x, "y": y} for i, (x, y) in enumerate(xy)]


def test_a_point_with_the_same_latency_and_a_lower_loss_dominates():
    pts = _pts((1.0, 2.0), (1.0, 1.0), (2.0, 0.5))
    assert [p["phase"] for p in pareto_front(pts, "x", "y")] == ["p1", "p2"]


def test_a_point_with_the_same_loss_and_a_lower_latency_dominates():
    pts = _pts((2.0, 1.0), (1.0, 1.0))
    assert [p["phase"] for p in pareto_front(pts, "x", "y")] == ["p1"]


def test_a_point_missing_either_objective_is_left_out():
    pts = _pts((1.0, None), (None, 1.0), (3.0, 3.0))
    assert [p["phase"] for p in pareto_front(pts, "x", "y")] == ["p2"]


@pytest.fixture
def yscales(monkeypatch):
    """The scales plot_front puts on its y axis (matplotlib's own method, still called)."""
    calls = []
    original = matplotlib.axes.Axes.set_yscale

    def spy(self, value, **kw):
        calls.append(value)
        return original(self, value, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_yscale", spy)
    return calls


@pytest.mark.parametrize("ys, scales", [
    ((0.5, 2.0), ["log"]),          # every loss positive, below 1 too
    ((0.0, 2.0), []),               # a loss of exactly 0 (dense attention) has no log
    ((-1.0, 2.0), []),
])
def test_the_loss_axis_is_logarithmic_only_when_every_loss_is_positive(tmp_path, yscales, ys, scales):
    pts = _pts((1.0, ys[0]), (2.0, ys[1]))
    out = plot_front(pts, pareto_front(pts, "x", "y"), "x", "y", tmp_path / "front.png")
    assert out == tmp_path / "front.png" and out.stat().st_size > 0
    assert yscales == scales


def test_the_plot_is_a_png(tmp_path):
    pts = _pts((1.0, 1.0), (2.0, 0.5))
    head = plot_front(pts, pareto_front(pts, "x", "y"), "x", "y", tmp_path / "front.png").read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n"


def test_a_plot_without_any_usable_point_is_still_written(tmp_path, yscales):
    pts = _pts((1.0, "nan"), (2.0, None))
    assert plot_front(pts, pareto_front(pts, "x", "y"), "x", "y", tmp_path / "front.png").is_file()
    assert yscales == []


@pytest.mark.parametrize("accuracy, c", [(0.0, 0.0), (0.5, 0.0), (97.0, 0.0), (100.0, 1.0)])
def test_the_accuracy_range_is_0_to_100_inclusive(accuracy, c):
    assert accuracy_coefficient(accuracy) == c


@pytest.mark.parametrize("accuracy", [-0.01, 100.01])
def test_an_accuracy_outside_0_to_100_is_a_usage_error(accuracy):
    with pytest.raises(UsageError, match="normalized accuracy in percent"):
        accuracy_coefficient(accuracy)


def test_a_problem_outside_the_scored_phases_does_not_block_the_score():
    w = {"A": 0.5, "B": 0.5}
    d = soar_score({"A": 1.0, "B": 2.0}, {"A": 2.0, "B": 2.0}, w, problems={"warmup": "2 failed"})
    assert d["score"] == pytest.approx(150.0) and d["score_error"] is None
    d = soar_score({"A": 1.0, "B": 2.0}, {"A": 2.0, "B": 2.0}, w, problems={"B": "2 failed"})
    assert d["score"] is None and d["tier_scores"] == {"A": 200.0} and d["score_error"] == "B: 2 failed"


def test_a_malformed_reference_shows_the_scored_phases_as_the_example():
    with pytest.raises(UsageError, match=r"^--reference takes NAME=SECONDS pairs, e\.g\. S1=400,S8=600,Smax=1100; "
                                         r"got 'S1'$"):
        parse_reference("S1")
