"""The fault catalogue is tied to real bugs: every fault names a suite that exists, upstream
references are well-formed, each upstream bug class the harness claims to model has a fault,
and `overlap-harness faults` prints the references."""
import re
import subprocess
import sys
from pathlib import Path

from harness.faults import CATALOGUE

ROOT = Path(__file__).resolve().parents[1]
# the upstream bug classes the catalogue must model (issue 10): reference -> what the class is
CLASSES = {
    "sglang#26380": "schedule-stream writes race the running forward's reads (the WAR barrier)",
    "vllm#25279": "a reused CPU buffer rewritten while its async copy to the GPU is pending",
    "vllm#27878": "penalties computed from one-step-old tokens",
    "vllm-ascend#13501": "KV blocks freed while a dispatched step still reads them",
    "vllm#31841": "a buffer that needed double-buffering",
}


def test_every_fault_names_an_existing_suite():
    suites = {p.stem for d in ("races", "equivalence", "evals") for p in (ROOT / d).glob("test_*.py")}
    missing = {f.name: f.suite for f in CATALOGUE.values() if f.suite not in suites}
    assert not missing, f"faults whose suite does not exist: {missing}"


def test_upstream_references_are_well_formed():
    bad = [(f.name, u) for f in CATALOGUE.values() for u in f.upstream
           if not re.fullmatch(r"(sglang|vllm|vllm-ascend)#\d+", u)]
    assert not bad, bad


def test_each_upstream_class_has_a_fault():
    named = {u for f in CATALOGUE.values() for u in f.upstream}
    missing = {u: what for u, what in CLASSES.items() if u not in named}
    assert not missing, f"no fault models these upstream bug classes: {missing}"


def test_faults_command_prints_upstream():
    r = subprocess.run([sys.executable, "-m", "harness.cli", "faults"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "upstream: vllm-ascend#13501" in r.stdout and "early_free" in r.stdout
