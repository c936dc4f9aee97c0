"""The command line: ``python -m specrepro <command> ...`` (also installed as ``specrepro``).

What this file is: an argparse front end with one subcommand per entry of :data:`COMMANDS`. Each entry names a
module exposing ``configure_parser(parser)`` and ``run_command(args, parser) -> int``; the module is imported only
when its command runs (or when ``--help`` lists the commands), so adding a command (``fetch``, ...) is one line here
plus those two functions in its module.

What it is not: the benchmark itself (:mod:`specrepro.bench`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: command -> (module, one-line help). The module provides configure_parser(p) and run_command(args, parser).
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("specrepro.bench", "time decoding methods (ours and transformers') side by side on a workload"),
    "scorecard": ("specrepro.scorecard", "score every headline claim of the papers against a profile's result tables"),
}


def build_parser(commands: dict[str, tuple[str, str]] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command (each configured by its module)."""
    parser = argparse.ArgumentParser(prog="specrepro", description="specrepro: speculative decoding, replicated")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in (commands or COMMANDS).items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(module)
        mod.configure_parser(p)
        p.set_defaults(_module=module, _parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    commands = COMMANDS
    if argv and argv[0] in COMMANDS:  # configure only the command that runs (keeps start-up cheap)
        commands = {argv[0]: COMMANDS[argv[0]]}
    parser = build_parser(commands if commands is not COMMANDS else None)
    args = parser.parse_args(argv)
    mod = importlib.import_module(args._module)
    return int(mod.run_command(args, args._parser) or 0)


if __name__ == "__main__":
    sys.exit(main())
