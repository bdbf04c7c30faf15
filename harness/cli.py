"""The `overlap-harness` command line."""
from __future__ import annotations

import argparse
import os
import sys

from harness.commands.run import cmd_run
from harness.flags import UsageError, _bool_flag, add_engine_flags

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        cmds = [c for x in self._actions if isinstance(x, argparse._SubParsersAction) for c in x.choices]
        if cmds and message.endswith("required: cmd"):  # `overlap-harness` or `overlap-harness --badflag`
            message = f"expected a command ({', '.join(cmds)}); see overlap-harness --help"
        raise UsageError(message)


# -- main -----------------------------------------------------------------------------
def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="overlap-harness", description="Race detection and equivalence testing for overlapped "
                "LLM schedulers, with a reference overlap engine.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="generate for prompts and print a step summary")
    add_engine_flags(r)
    r.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    r.add_argument("--prompts", help="JSONL file: {\"prompt\": ...} or {\"messages\": [...]} per line")
    r.add_argument("--max-tokens", type=int, default=32)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--repetition-penalty", type=float, default=1.0)
    r.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    _bool_flag(r, "chat", False, "wrap each --prompt in the model's chat template")
    r.add_argument("--timeline", metavar="DIR", help="write a Chrome trace and a PNG timeline into DIR")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(fn=cmd_run)
    for extra in _extra_commands():
        extra(sub)
    return p


def _extra_commands():
    """Sub-commands that live in their own modules (check, mutants, stress, replay, serve, gsm8k,
    sanitize, setup, sweep, bisect)."""
    out = []
    import importlib
    for mod in ("harness.commands.check", "harness.commands.stress", "harness.commands.serve", "harness.commands.gsm8k",
                "harness.commands.sanitize", "harness.commands.setup", "harness.commands.sweep",
                "harness.commands.bisect"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        out.append(m.add_commands)
    return out


def main(argv: list[str] | None = None) -> int:
    from harness import stopping
    stopping.install()  # SIGTERM (a CI cancellation, `timeout`) ends every command as Ctrl-C does
    try:
        a = make_parser().parse_args(argv)
        rc = a.fn(a) or 0
        sys.stdout.flush()  # a closed pipe is found here, inside the handler below, not at exit
        return rc
    except UsageError as e:
        print(f"overlap-harness: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        # a command that keeps what it found and prints its summary returned already; this is
        # one that had nothing to keep yet (a server pair still starting, a single run)
        print(f"overlap-harness: {stopping.stopped_word()} by {stopping.signal_name()}", file=sys.stderr)
        served = sys.modules.get("harness.targets.served.process")
        if served is not None:  # before the exit handlers: no server outlives the message
            served.stop_all()
        return stopping.exit_code()
    except BrokenPipeError:
        # the reader of our output went away (`... --json | head`): not an error of ours; the
        # servers stop as on Ctrl-C, and stdout is pointed at /dev/null so that the interpreter's
        # final flush does not print a second traceback
        served = sys.modules.get("harness.targets.served.process")
        if served is not None:
            served.stop_all()
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE


if __name__ == "__main__":
    # run the package's own module, so `python -m harness.cli` and the sub-command modules
    # share one UsageError class (a second copy of this file would not catch theirs)
    from harness.cli import main as _main
    sys.exit(_main())
