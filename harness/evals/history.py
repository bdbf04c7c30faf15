"""The nightly history: one JSON line per gate run, and the accuracy trend as a PNG."""
from __future__ import annotations

import json
from pathlib import Path


def history_entry(result: dict) -> dict:
    """What a history line keeps: the verdict and the figures, not the per-question pairs."""
    s = result["stats"]
    return {"time": result["time"], "verdict": result["verdict"], "target": result["target"],
            "data": result["data"], "n": result["n"], "engine": result.get("engine", {}),
            "acc_off": s["acc_ref"], "acc_on": s["acc_cand"], "ci_off": list(s["ci_ref"]),
            "ci_on": list(s["ci_cand"]), "losses": s["losses"], "gains": s["gains"], "p_loss": s["p_loss"],
            "drop": s["drop"], "drop_upper": s["drop_upper"], "min_effect": s["min_effect"],
            "seconds": result["seconds"]["total"]}


def append_history(path: str | Path, result: dict) -> dict:
    entry = history_entry(result)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
    return entry


def read_history(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn line (a run killed while writing) is skipped, not fatal
    return out


def plot_trend(entries: list[dict], out: str | Path) -> Path:
    """Accuracy with overlap off and on per run, with Wilson intervals; runs the gate flagged
    are marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(entries) + 3), 4))
    xs = list(range(len(entries)))
    for key, ci, dx, color, label in (("acc_off", "ci_off", -0.08, "tab:blue", "overlap off"),
                                      ("acc_on", "ci_on", 0.08, "tab:orange", "overlap on")):
        ys = [100 * e[key] for e in entries]
        lo = [100 * (e[key] - e[ci][0]) for e in entries]
        hi = [100 * (e[ci][1] - e[key]) for e in entries]
        ax.errorbar([x + dx for x in xs], ys, yerr=[lo, hi], fmt="o-", color=color, capsize=3, label=label)
    for x, e in zip(xs, entries):
        if e["verdict"] != "pass":
            ax.annotate("LOSS" if e["verdict"].startswith("silent") else "?", (x, 100 * e["acc_on"]),
                        textcoords="offset points", xytext=(0, -16), ha="center",
                        color="red" if e["verdict"].startswith("silent") else "gray", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels([e["time"][5:16].replace("T", " ") for e in entries], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("GSM8K accuracy, % (95% Wilson interval)")
    last = entries[-1] if entries else {}
    ax.set_title(f"GSM8K gate: {last.get('data', '')}, n = {last.get('n', '')}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
