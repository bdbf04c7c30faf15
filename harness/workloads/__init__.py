"""Workload generation: request streams (presets), hypothesis strategies, prompt files."""
