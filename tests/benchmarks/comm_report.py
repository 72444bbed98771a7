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
        pick = run["auto"]["strategy"]
        out[label] = {
            "rows": rows,
            "fastest": best,
            "fastest_exact": best_exact,
            "auto_pick": pick,
            "auto_pick_time_over_fastest": round(timed[pick] / timed[best], 2)
            if best and pick in timed
            else None,
            "auto_reason": run["auto"]["reason"],
            "calibration": {k: round(v, 6) for k, v in run["calibration"].items()},
        }
    return out


def render_markdown(doc: dict) -> str:
    cond, summary = doc["conditions"], doc["summary"]
    lines = ["# Gradient communication across two emulated nodes", "", "Conditions:", ""]
    lines += [f"- {k}: {v}" for k, v in cond.items()]
    lines += ["", "## Does `auto` pick right?", ""]
    lines += ["| link | fastest measured | fastest exact | auto picks | auto's time / fastest | measured inter / intra Gbit/s |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for label, s in summary.items():
        cal = s["calibration"]
        lines.append(
            f"| {label} | {s['fastest']} | {s['fastest_exact']} | {s['auto_pick']} | "
            f"{s['auto_pick_time_over_fastest']} | {cal['inter']:.2f} / {cal['intra']:.2f} |"
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
        lines += ["", f"auto: {s['auto_reason']}"]
    return "\n".join(lines) + "\n"
