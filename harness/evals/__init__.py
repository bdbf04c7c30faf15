"""GSM8K through lm-eval against the reference engine or an OpenAI-compatible endpoint,
overlap on and off on the same questions, judged by a paired test (harness.oracles.stats)."""
