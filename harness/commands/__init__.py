"""Entry points: one thin module per command (parse, call the library, print).

harness/cli.py dispatches: it builds the parser from each module's `add_commands`."""
