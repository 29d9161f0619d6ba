"""Human views of a bench run: the terminal table and a plain Markdown summary (the full report
with plots is rendered from the records by `salactl.reports`)."""

from __future__ import annotations

from salactl.bench.requests import ESTIMATED_SOURCES
from salactl.output import fmt
from salactl.reports.text_cells import md_text

COLUMNS = [("phase", "phase"), ("conc", "max_concurrency"), ("rate", "request_rate"),
           ("ok", "completed"), ("fail", "failed"), ("duration s", "duration"),
           ("req/s", "request_throughput"), ("out tok/s", "output_throughput"),
           ("TTFT ms", "mean_ttft_ms"), ("p99 TTFT", "p99_ttft_ms"), ("TPOT ms", "mean_tpot_ms"),
           ("ITL ms", "mean_itl_ms"), ("p99 ITL", "p99_itl_ms"), ("E2E ms", "mean_e2e_latency_ms")]


LENGTH_COLUMNS = [("in tok", "input_len"), ("out tok", "output_len")]
GIB_COLUMNS = {"peak_gpu_memory_gib": "peak_gpu_memory_bytes", "cache_pool_gib": "cache_pool_bytes"}


def _prompt_length(rec: dict, key: str) -> int | None:
    """The input/output length every prompt of the phase asked for (a random dataset, after --scale:
    the phase's name keeps the profile's length), None for mixed lengths (SOAR)."""
    return ((rec.get("knobs") or {}).get("dataset") or {}).get(key)


def _cell(rec: dict, key: str):
    if key in ("input_len", "output_len"):
        return _prompt_length(rec, key)
    if key in GIB_COLUMNS:
        v = rec.get(GIB_COLUMNS[key])
        return v / 2 ** 30 if v else None
    v = rec.get(key)
    if key == "max_concurrency" and v is None:
        return "∞"
    if key == "request_rate" and v == "inf":
        return "∞"
    return v


def table_rows(run: dict) -> tuple[list[str], list[list]]:
    cols = list(COLUMNS)
    if any(_prompt_length(p, "input_len") is not None for p in run["phases"]):
        cols[3:3] = LENGTH_COLUMNS          # after the phase's name, concurrency and rate
    if any(p.get("request_goodput") is not None for p in run["phases"]):
        cols.append(("goodput req/s", "request_goodput"))
    if any(p.get("peak_gpu_memory_bytes") for p in run["phases"]):
        cols.append(("peak GiB", "peak_gpu_memory_gib"))
    if any(p.get("cache_pool_bytes") for p in run["phases"]):      # the GPU engine's: part of the peak
        cols.append(("cache pool GiB", "cache_pool_gib"))
    if any(p.get("energy_per_output_token_j") is not None for p in run["phases"]):
        cols += [("W", "mean_power_w"), ("J/out tok", "energy_per_output_token_j")]
    return [c for c, _ in cols], [[_cell(p, k) for _, k in cols] for p in run["phases"]]


def _score(v: float | str) -> str:
    """A score to 2 decimals; one past the float range is the string "inf" once the run is JSON-ready."""
    return v if isinstance(v, str) else f"{v:.2f}"


def score_line(run: dict) -> str | None:
    d = run.get("score_details")
    if not d:
        return None
    tiers = ", ".join(f"{k} {_score(v)}" for k, v in d["tier_scores"].items())
    if d["score"] is None and d.get("score_error"):
        return f"SOAR score: not computed ({d['score_error']})"
    if d["score"] is None:
        return f"SOAR score: incomplete (tiers: {tiers or 'none'})"
    acc = "" if d["accuracy"] is None else f" × C {d['accuracy_coefficient']} (accuracy {d['accuracy']})"
    return f"SOAR score {_score(d['score'])} = Σ w·ref/own·100 ({tiers}){acc}"


def phase_notes(run: dict) -> list[str]:
    """What qualifies a phase's numbers: failed requests first (the exit status stays 0 for them),
    client-side token counts, and a prefix-cache flush that did not happen."""
    notes = []
    for p in run["phases"]:
        name = p["phase"]
        if p.get("failed"):
            notes.append(f"**{p['failed']} of {p['failed'] + p['completed']} requests failed** in phase {name} "
                         "(left out of its statistics; the exit status stays 0, as with SGLang's bench_serving)")
        source = p.get("output_len_source") or ""
        if set(source.split("+")) & set(ESTIMATED_SOURCES):
            capped = p.get("output_len_over_max") or 0
            notes.append(f"phase {name}: output tokens counted by {source} (the server reported no usage)"
                         + (f"; {capped} requests capped at max_tokens" if capped else ""))
        if (p.get("knobs") or {}).get("cache_flushed") is False:
            notes.append(f"phase {name}: the prefix cache was not flushed before it (the flush failed)")
    return notes


def markdown_summary(run: dict) -> str:
    cols, rows = table_rows(run)
    lines = [f"# salactl bench {run['run_id']}", "",
             f"- profile: {md_text(str(run['profile']))}, target: {run['target']}, model: {md_text(str(run['model']))}"]
    if run.get("label"):
        lines.append(f"- label: {md_text(run['label'])}")
    if run.get("interrupted"):
        lines.append("- **interrupted**: only the phases below finished")
    if run.get("stopped"):
        lines.append(f"- **stopped**: {md_text(run['stopped'])}")
    s = score_line(run)
    if s:
        lines.append(f"- {s}")
    lines += [f"- {note}" for note in phase_notes(run)]
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    for sk in run.get("skipped_phases", []):
        lines.append(f"\nskipped {md_text(sk['phase'])}: {md_text(sk['reason'])}")
    from pathlib import Path

    plots = (run.get("files") or {}).get("plots") or []
    if plots:
        lines.append("")
        lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    lines.append("\nMetrics follow SGLang bench_serving except where docs/reference.md (salactl bench) "
                 "notes (TTFT, TPOT, per-token ITL, E2E in ms; duration in s). Records: `records.jsonl` "
                 "(render several runs side by side with `salactl report latency records.jsonl`).")
    return "\n".join(lines) + "\n"
