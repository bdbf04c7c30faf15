"""vLLM across its releases: which are installed, the gate per release (`sweep`), and the first
release where a row or a reproducer changes (`bisect`)."""
