"""Agents: code of ours that runs inside a real engine's own processes.

A target hands its agent a plan (a JSON file named by an environment variable; plumbing, not
an interface) and the agent, loaded by the engine itself (vLLM's `vllm.general_plugins` entry
point), injects seeded delays and faults at named points of the engine's async path and writes
what it saw (the effective async-scheduling setting, how many steps really overlapped) as facts
the target reads back. Without a plan an agent does nothing.
"""
