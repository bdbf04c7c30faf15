"""The plan a target hands its agent, and the facts the agent writes back.

The plan is a JSON file whose path is in OVERLAP_HARNESS_AGENT_PLAN. It is read again when
its mtime changes, so one running server can be given another delay policy or fault between
two runs without a restart (a restart of vLLM costs most of a minute here).

    {"overlap": true, "seed": 0,
     "delays": {"engine_step": {"p": 0.3, "ms": 5}, "output_copy": {"p": 1.0, "ms": 2}},
     "faults": ["sampled_ids_no_wait"],
     "facts_dir": "/tmp/..."}
"""
from __future__ import annotations

import atexit
import json
import os
import random
import threading
import time
import zlib

ENV = "OVERLAP_HARNESS_AGENT_PLAN"
_CHECK_EVERY_S = 0.05  # at most one stat() of the plan file per 50 ms on a hot path


class Plan:
    def __init__(self, path: str):
        self.path = path
        self._mtime = None
        self._checked = 0.0
        self.data: dict = {}
        self._rngs: dict[str, random.Random] = {}
        self.reload(force=True)

    def reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < _CHECK_EVERY_S:
            return
        self._checked = now
        try:
            m = os.stat(self.path).st_mtime_ns
        except OSError:
            return
        if m == self._mtime and not force:
            return
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return  # a half-written file: keep the last plan; the target writes by rename
        self._mtime, self.data = m, data
        self._rngs = {}

    @property
    def overlap(self) -> bool:
        return bool(self.data.get("overlap", True))

    def fault(self, name: str) -> bool:
        self.reload()
        return name in self.data.get("faults", ())

    def delay(self, point: str, step_s: float = 0.0) -> float:
        """Sleep at a named point as the plan says (seeded per point); returns the seconds slept.
        {"ms": M} sleeps M ms; {"steps": K} sleeps K times `step_s`, the engine's recent step
        period as the agent measured it, so "hold the reader back two steps" means the same on a
        fast machine and a loaded one."""
        self.reload()
        d = self.data.get("delays", {}).get(point)
        if not d:
            return 0.0
        rng = self._rngs.get(point)
        if rng is None:
            rng = self._rngs[point] = random.Random(zlib.crc32(point.encode()) ^ int(self.data.get("seed", 0)))
        if rng.random() >= float(d.get("p", 1.0)):
            return 0.0
        s = float(d.get("ms", 0.0)) / 1000.0 + float(d.get("steps", 0.0)) * step_s
        if s > 0:
            time.sleep(s)
        return s


class Facts:
    """What one process saw, as JSON in facts_dir/<role>-<pid>.json; written when asked
    (throttled) and at exit."""

    def __init__(self, facts_dir: str | None, role: str):
        self.path = os.path.join(facts_dir, f"{role}-{os.getpid()}.json") if facts_dir else None
        self.data: dict = {"role": role, "pid": os.getpid()}
        self._lock = threading.Lock()
        self._written = 0.0
        self.dirty = False  # changed since the last write (a flusher writes it soon)
        atexit.register(self.write, True)

    def set(self, **kw) -> None:
        with self._lock:
            self.data.update(kw)
            self.dirty = True

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.data[key] = self.data.get(key, 0) + n
            self.dirty = True

    def write(self, force: bool = False) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._written < 0.2:
            return
        self._written = now
        with self._lock:
            text = json.dumps(self.data)
            self.dirty = False
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, self.path)
        except OSError:
            pass


def load() -> Plan | None:
    path = os.environ.get(ENV)
    return Plan(path) if path else None


def write_plan(path: str, data: dict) -> None:
    """Atomically (write then rename), so an agent never reads half a plan."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_facts(facts_dir: str) -> list[dict]:
    out = []
    for name in sorted(os.listdir(facts_dir)) if os.path.isdir(facts_dir) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(facts_dir, name), encoding="utf-8") as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                pass
    return out
