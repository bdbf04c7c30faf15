"""vLLM across its releases: the gate per release (`sweep`), and the first release where a row or
a reproducer changes (`bisect`). Which releases there are, which are installed and which one a
target runs is the release table's (harness.targets.vllm.releases)."""
