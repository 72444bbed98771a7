"""Turn bench_comm's raw runs into the summary and the Markdown table it publishes."""

from __future__ import annotations

from typing import Any

# The strategies `auto` chooses among (accumulation is the user's choice, not auto's).
AUTO_CHOICES = ("flat", "hierarchical", "fp16", "hierarchical+fp16", "powersgd")
EXACT = ("flat", "hierarchical")


def _per_sample(s: dict) -> float:
    return s["step_s_median"] / s["micro_batches_per_step"]


def summarize(runs: dict[str, dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, run in runs.items():
        strategies, grad = run["strategies"], run["grad_bytes"]
        flat = strategies.get("flat")
        rows = {}
        for name, s in strategies.items():
            rows[name] = {
                "step_s": round(s["step_s_median"], 4),
                "per_micro_batch_s": round(_per_sample(s), 4),
                "speedup_vs_flat_per_micro_batch": round(_per_sample(flat) / _per_sample(s), 2)
                if flat
                else None,
                "cross_node_bytes_per_step_x_grad": round(s["node0_tx_bytes_per_step"] / grad, 3),
            }
        timed = {n: strategies[n]["step_s_median"] for n in AUTO_CHOICES if n in strategies}
        best = min(timed, key=timed.__getitem__) if timed else None
        exact = {n: t for n, t in timed.items() if n in EXACT}
        best_exact = min(exact, key=exact.__getitem__) if exact else None
        auto = run["auto"]
        pick = auto["strategy"]
        out[label] = {
            "rows": rows,
            "fastest": best,
            "fastest_exact": best_exact,
            "auto_pick": pick,
            # The chosen strategy's time in its own run: did auto pick the right one?
            "auto_pick_time_over_fastest": round(timed[pick] / timed[best], 2)
            if best and pick in timed
            else None,
            # auto's own steps after its trials, against the fastest separate run.
            "auto_step_s_after": round(auto["step_s_median_after"], 4),
            "auto_after_over_fastest": round(auto["step_s_median_after"] / timed[best], 2)
            if best
            else None,
            "auto_reason": auto["reason"],
            "auto_measured_ms": {k: round(v * 1000) for k, v in auto["measured_s"].items()},
            "auto_pruned_by_model": auto["pruned_by_model"],
            "model_alone_would_pick": auto["model_pick"],
            "auto_trial": {
                "steps": auto["trial_steps"],
                "seconds": round(auto["trial_seconds"], 1),
            },
            "calibration": {k: round(v, 6) for k, v in run["calibration"].items()},
        }
    return out


def render_markdown(doc: dict) -> str:
    cond, summary = doc["conditions"], doc["summary"]
    lines = ["# Gradient communication across two emulated nodes", "", "Conditions:", ""]
    lines += [f"- {k}: {v}" for k, v in cond.items()]
    lines += ["", "## Does `auto` pick right?", ""]
    lines += ["| link | fastest measured | fastest exact | auto chose | its time / fastest | auto's steps after trials / fastest | cost model alone | trials: steps, s | measured inter / intra Gbit/s |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, s in summary.items():
        cal, trial = s["calibration"], s["auto_trial"]
        lines.append(
            f"| {label} | {s['fastest']} | {s['fastest_exact']} | {s['auto_pick']} | "
            f"{s['auto_pick_time_over_fastest']} | {s['auto_after_over_fastest']} | "
            f"{s['model_alone_would_pick']} | {trial['steps']}, {trial['seconds']} | "
            f"{cal['inter']:.2f} / {cal['intra']:.2f} |"
        )
    for label, s in summary.items():
        lines += ["", f"## {label}", ""]
        lines += ["| strategy | step (s) | per micro-batch (s) | speedup vs flat | cross-node bytes / step (x gradient) |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name, r in s["rows"].items():
            lines.append(
                f"| {name} | {r['step_s']:.3f} | {r['per_micro_batch_s']:.3f} | "
                f"{r['speedup_vs_flat_per_micro_batch']} | {r['cross_node_bytes_per_step_x_grad']:.3f} |"
            )
        measured = ", ".join(f"{k} {v}" for k, v in s["auto_measured_ms"].items())
        line = f"auto: chose {s['auto_pick']} ({s['auto_reason']}); trial ms/step: {measured}"
        if s["auto_pruned_by_model"]:
            line += f"; the cost model left out {', '.join(s['auto_pruned_by_model'])}"
        lines += ["", line]
    return "\n".join(lines) + "\n"
