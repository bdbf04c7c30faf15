"""A short stress per release, beside the sweep's gate (issue 44 item 4).

The gate runs each release's fixed rows; request ids a client sets, duplicate ids, prompt logprobs,
the pause modes and the server configurations are drawn only by `stress`. So `sweep` runs, after
each release's gate, `stress --target vllm --vllm-version V --minutes M --seed S` in its own process
(like the gate: a release's servers and crashes stay there) and reads the summary that stress
writes (`summary.json` in its --out folder). A new finding there is the release's failure, with its
reproducer in that folder; a known-upstream finding is listed with its id, as the gate lists them.

Seeded: the same seed draws the same workloads on every release, so a finding that appears on one
release and not the next is a difference of the releases, not of the draw.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PASS, FAIL, UNAVAILABLE = "pass", "FAIL", "UNAVAILABLE"
STOP_GRACE_S = 90.0  # a stress told to stop: its servers' grace periods, then its summary


@dataclass
class StressResult:
    status: str  # pass / FAIL / UNAVAILABLE (it could not run or ran no case; `error` says why)
    cases: int = 0
    runs: int = 0
    known: dict = field(default_factory=dict)  # known id -> runs it was reached in
    findings: list = field(default_factory=list)  # [{"kind", "summary", "repro"}] new findings
    configs: list = field(default_factory=list)  # the server configurations drawn
    seconds: float = 0.0
    exit_code: int = 0
    error: str = ""
    out: str = ""  # the stress run's folder: its summary.json, log and reproducers

    @classmethod
    def from_dict(cls, d: dict | None) -> "StressResult | None":
        if not d:
            return None
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def to_dict(self) -> dict:
        return asdict(self)

    def cell(self) -> str:
        """The sweep table's `stress` cell."""
        if self.status == PASS:
            return f"pass ({self.cases} cases)" + (f" KNOWN {','.join(sorted(self.known))}" if self.known else "")
        if self.status == FAIL:
            return f"FAIL ({len(self.findings)} new)"
        return self.status


def stress_command(version: str, out: Path, minutes: float, seed: int, extra=()) -> list[str]:
    return [sys.executable, "-m", "harness.cli", "stress", "--target", "vllm", "--vllm-version", version,
            "--minutes", f"{minutes:g}", "--seed", str(seed), "--out", str(out)] + list(extra)


def read_summary(out: Path, code: int, secs: float) -> StressResult:
    """What one stress run found, from its summary.json; UNAVAILABLE with the log's last error when
    it wrote none (the servers did not start, a bad flag) or ran no case."""
    p = out / "summary.json"
    if not p.is_file():
        return StressResult(UNAVAILABLE, seconds=secs, exit_code=code, out=str(out), error=_why(out / "stress.log", code))
    d = json.loads(p.read_text())
    found = [{"kind": f.get("kind", ""), "summary": f.get("summary", ""), "repro": f.get("repro", "")}
             for f in d.get("findings") or ()]
    known = {k: v[0] if isinstance(v, list) else v for k, v in (d.get("known") or {}).items()}
    res = StressResult(FAIL if found else PASS, cases=int(d.get("cases") or 0), runs=int(d.get("runs") or 0),
                       known=known, findings=found, configs=list(d.get("configs") or ()), seconds=secs,
                       exit_code=code, out=str(out))
    lost = [ln for ln in d.get("lines") or () if ln.startswith("overlap: LOST on ")]
    if lost and not found:  # judged over the whole run (stress's own verdict counts it a failure)
        res.status, res.findings = FAIL, [{"kind": "overlap", "summary": lost[0], "repro": ""}]
    if d.get("error") and not res.runs:
        res.status, res.error = UNAVAILABLE, str(d["error"])[:300]
    elif not res.runs and res.status == PASS:
        res.status, res.error = UNAVAILABLE, "stress ran no case"
    return res


def stress_release(version: str, out_dir: Path, minutes: float, seed: int = 0, extra=(),
                   timeout: float | None = None) -> StressResult:
    """Run the short stress against one installed release; its output goes to out_dir/V-stress/."""
    import signal

    from harness import stopping
    out = Path(out_dir) / f"{version}-stress"
    out.mkdir(parents=True, exist_ok=True)
    stale = out / "summary.json"
    if stale.exists():
        stale.unlink()  # an old summary must not pass for this run's result
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = time.perf_counter()
    with open(out / "stress.log", "w", encoding="utf-8") as f:
        p = subprocess.Popen(stress_command(version, out, minutes, seed, extra), cwd=str(ROOT), stdout=f,
                             stderr=subprocess.STDOUT, env=env)
        try:
            code = p.wait(timeout)
        except subprocess.TimeoutExpired:
            code = 124
            stopping.end_process(p, 10.0, ask=signal.SIGINT)
        except KeyboardInterrupt:  # as the gate's: it has its SIGINT already; wait for its summary
            code = stopping.end_process(p, STOP_GRACE_S, ask=None)
    return read_summary(out, code, time.perf_counter() - t)


def _why(log: Path, code: int) -> str:
    if code == 124:
        return "the stress ran past its time limit"
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    errs = [ln for ln in lines if ln.startswith("overlap-harness: error:")]
    return (errs[-1] if errs else (lines[-1] if lines else f"exit {code}, no output"))[:300]
