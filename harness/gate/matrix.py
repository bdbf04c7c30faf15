"""The kill matrix (`overlap-harness mutants`): every suite against the correct engine and against
every fault of a target's catalogue, or each fault against the suite that must catch it; and its
table."""
from __future__ import annotations

from harness.gate import run_suites


def kill_matrix(seeds: int | None = None, faults=None, progress=None, intended_only: bool = False,
                target: str = "ref", pairs=None) -> dict:
    """Run every suite against the correct engine and against every fault (or, with
    intended_only, each fault against the one suite that must catch it). A served target keeps
    its servers between rows (`pairs`, harness.targets.Pairs): its faults live in the agent's plan."""
    from harness.targets import fault_catalogue
    catalogue = fault_catalogue(target)
    out = {"target": target, "correct": None, "faults": {}, "not_here": {}}
    names = list(faults or catalogue)
    # a bug that only a device shows (vLLM's CPU build runs each forward inline) is listed with
    # its reason, never run and counted as missed or caught
    out["not_here"] = {n: catalogue[n].device_only for n in names if getattr(catalogue[n], "device_only", "")}
    # ... and one that no configuration reaches on the release its text was written against (the reason)
    out["not_here"].update({n: catalogue[n].unreachable for n in names
                            if getattr(catalogue[n], "unreachable", "") and n not in out["not_here"]})
    # a source patch that needs another server configuration (a drafter's): listed with the command
    # that runs it, never run on this pair, where its path does not exist
    out["not_here"].update({n: f"needs the {catalogue[n].config} configuration: check --target {target} --configs "
                               f"{catalogue[n].config} --fault {n}"
                            for n in names if getattr(catalogue[n], "config", "") and n not in out["not_here"]})
    names = [n for n in names if n not in out["not_here"]]
    for label, fs in [("correct", ())] + [(n, (n,)) for n in names]:
        if progress:
            progress(label)
        only = [catalogue[label].suite] if intended_only and label != "correct" else None
        res = run_suites(target, fs, seeds, suites=only, pairs=pairs)
        if res.interrupted:  # SIGTERM or Ctrl-C: the matrix ends here, not with the next fault
            raise KeyboardInterrupt
        row = {s.suite: {"caught": s.failed > 0, "failed": s.failed, "cases": s.cases,
                         "first_step": s.first_step, "finding": s.first_failure}
               for s in res.suites.values() if s.skipped < s.cases}  # a suite that cannot attack it: no column
        if label == "correct":
            out["correct"] = row
        else:
            f = catalogue[label]
            out["faults"][label] = {"suites": row, "intended": f.suite, "section": getattr(f, "section", ""),
                                    "upstream": list(f.upstream),
                                    "caught_by_intended": row.get(f.suite, {}).get("caught", False)}
    out["ok"] = (all(not v["caught"] for v in out["correct"].values())
                 and all(v["caught_by_intended"] for v in out["faults"].values()))
    return out


def format_matrix(m: dict) -> str:
    suites = sorted(m["correct"])
    short = [s.removeprefix("test_") for s in suites]
    w = max(len(n) for n in list(m["faults"]) + ["correct engine"]) + 2
    cw = [max(len(s), 12) for s in short]
    lines = ["fault".ljust(w) + "  ".join(s.ljust(c) for s, c in zip(short, cw))]

    def cell(v, intended):
        if v is None:
            return "n/a"
        if not v["caught"]:
            return "MISSED" if intended else "-"
        step = v["first_step"]
        return "caught" + (f" @{step}" if isinstance(step, int) else "") + ("*" if intended else "")
    c = m["correct"]
    lines.append("correct engine".ljust(w) + "  ".join(
        ("FALSE ALARM" if c[s]["caught"] else "clean").ljust(cw[i]) for i, s in enumerate(suites)))
    for name, f in m["faults"].items():
        lines.append(name.ljust(w) + "  ".join(cell(f["suites"].get(s), s == f["intended"]).ljust(cw[i])
                                               for i, s in enumerate(suites)))
    for name, why in m.get("not_here", {}).items():
        lines.append(f"{name.ljust(w)}not run here (needs a device): {why}")
    lines.append("\n* the suite that must catch the fault; @N: step of the first hazard")
    lines.append("every fault caught by its intended suite, no false alarm: " + ("yes" if m["ok"] else "NO"))
    return "\n".join(lines)
