"""The stress search, one concern a module: run one case (case) · reproducers: serialize, load (reproducer)
and check (repro_check) · shrink · the search loop and its shards (explore) · signals.
The `stress` and `replay` commands are in harness/commands/stress.py."""
