"""The SOAR score (reference/benchmarks.md §1, participants' formula):
per tier S_N = reference_duration / own_duration × 100; performance = Σ w_N · S_N
(0.4 / 0.3 / 0.3 for S1 / S8 / Smax); final = performance × C, where C comes from the normalized
accuracy: ≤ 97 → 0, (97, 98] → 0.92, (98, 99] → 0.96, (99, 100] → 1.0. The official reference
durations (the best player's) are unknown, so the user gives them."""

from __future__ import annotations


from salactl.bench.pairs import parse_positive_pairs
from salactl.errors import UsageError


def parse_reference(text: str | None) -> dict[str, float]:
    """`S1=426.1,S8=620.7,Smax=1169.8` (seconds)."""
    return parse_positive_pairs(text, "--reference", "seconds", "S1=400,S8=600,Smax=1100")


def accuracy_coefficient(accuracy: float | None) -> float:
    """C from the normalized accuracy in percent (`overall_accuracy`, capped at 100)."""
    if accuracy is None:
        return 1.0
    if not 0 <= accuracy <= 100:
        raise UsageError(f"--accuracy is the normalized accuracy in percent (0-100), got {accuracy}")
    if accuracy <= 97:
        return 0.0
    if accuracy <= 98:
        return 0.92
    if accuracy <= 99:
        return 0.96
    return 1.0


def check_reference(reference: dict[str, float], weights: dict[str, float]) -> None:
    if not reference:
        return
    unknown = sorted(set(reference) - set(weights))
    if unknown:
        raise UsageError(f"--reference names {unknown[0]!r}, which is not a scored phase; "
                         f"scored phases: {', '.join(weights)}")
    missing = [k for k in weights if k not in reference]
    if missing:
        raise UsageError(f"--reference lacks {', '.join(missing)}; give a duration for every scored "
                         f"phase ({', '.join(weights)})")


def tier_score(reference_s: float, own_s: float) -> float:
    return reference_s / own_s * 100.0


def soar_score(durations: dict[str, float], reference: dict[str, float], weights: dict[str, float],
               accuracy: float | None = None, problems: dict[str, str] | None = None) -> dict:
    """Score of a run; None when a scored phase has no duration (interrupted or skipped) or has a
    problem (failed requests, short answers: its duration is not the workload's), which
    `score_error` then names."""
    problems = {k: v for k, v in (problems or {}).items() if k in weights}
    tiers = {k: tier_score(reference[k], durations[k]) for k in weights if k in durations and k not in problems}
    perf = sum(weights[k] * tiers[k] for k in tiers) if len(tiers) == len(weights) else None
    c = accuracy_coefficient(accuracy)
    return {
        # C = 0 eliminates: 0, also for a performance past the float range (inf × 0 would be nan)
        "score": None if perf is None else (perf * c if c else 0.0),
        "score_error": "; ".join(f"{k}: {problems[k]}" for k in weights if k in problems) or None,
        "performance": perf,
        "tier_scores": tiers,
        "accuracy": accuracy,
        "accuracy_coefficient": c,
        "reference": dict(reference),
        "weights": dict(weights),
    }
