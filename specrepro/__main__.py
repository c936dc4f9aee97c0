"""The command line: ``python -m specrepro <command> ...`` (also installed as ``specrepro``).

What this file is: an argparse front end with one subcommand per entry of :data:`COMMANDS`. Each entry names a
module exposing ``configure_parser(parser)`` and ``run_command(args, parser) -> int``; the module is imported only
when its command runs (or when ``--help`` lists the commands), so adding a command (``fetch``, ...) is one line here
plus those two functions in its module.

Errors: a library error raised while a command runs (an impossible option, an unknown model or workload, a failed
fetch or checksum, mismatched tokenizers, a hub or file error: see :func:`is_user_error`) is printed as one line,
``specrepro <command>: error: <message>``, on stderr, and the process exits with status 2 (as argparse does for a
malformed command line), without a traceback. Anything else is a bug and keeps its traceback.

What it is not: the benchmark itself (:mod:`specrepro.bench`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: command -> (module, one-line help). The module provides configure_parser(p) and run_command(args, parser).
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("specrepro.bench", "time decoding methods (ours and transformers') side by side on a workload"),
    "cost-curves": ("specrepro.bench.costcurves", "time models' forward passes over n new tokens: eager, static cache "
                                                  "and CUDA graphs (random weights: architectures only)"),
    "formats": ("specrepro.bench.formats", "re-encode a GGUF target into llama.cpp's weight formats and time each: "
                                           "cost curve, draft cost, free-draft bound and predicted speedup"),
    "scorecard": ("specrepro.record.cli", "score every headline claim of the papers against a profile's result tables"),
    "audit": ("specrepro.record.audit", "run transformers' assisted generation and prompt lookup through the exactness "
                                        "battery (tiny random models, exact distributions, stated power)"),
    "verdict-history": ("specrepro.record.history", "re-score every committed state of the record: each claim's "
                                                    "verdict per commit, and the claims whose verdict moved"),
    "greedy-equality": ("specrepro.record.equality", "greedy speculative vs greedy AR on a whole workload, divergences "
                                              "explained by near-ties or counted"),
    "shard": ("specrepro.record.shards", "read or measure notebook 04's shards (cost curves, the Table 2 sweeps' "
                                         "parts) and notebook 05's naive-vs-MSS table, each one table and sidecar "
                                         "of the record, sized to a sitting"),
    "status": ("specrepro.record.status", "every shard, executed notebook and figure of the record: current, stale "
                                          "(and why) or missing, with its last run time and an estimate here"),
    "cache": ("specrepro.cache", "the model cache: every entry with its size and check (list), a full hash check "
                                 "(verify), or delete it (clear)"),
    "record-lock": ("specrepro.record.lock", "hold the checkout's record lock for a make job until it ends (`make "
                                             "reproduce` takes it first)"),
    "pass-at-1": ("specrepro.record.quality", "HumanEval pass@1 of AR and speculative sampling on a whole workload, "
                                              "paired by problem and resumable over sittings"),
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


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error the user can act on (printed as one line) rather than a bug (a traceback):
    ValueError (bad parameters, :class:`~specrepro.bench.BenchOptionError`,
    :class:`~specrepro.models.TokenizerMismatchError`), KeyError (an unknown model, pair or workload), OSError (a hub
    or file error), :class:`~specrepro.models.ModelFetchError`, :class:`~specrepro.models.ChecksumError`,
    :class:`~specrepro.data.WorkloadUnavailable`, :class:`~specrepro.files.RecordBusyError` (another job is writing
    the record)."""
    if isinstance(exc, (ValueError, KeyError, OSError)):
        return True
    from specrepro.data import WorkloadUnavailable
    from specrepro.files import RecordBusyError
    from specrepro.models import ChecksumError, ModelFetchError

    return isinstance(exc, (ModelFetchError, ChecksumError, WorkloadUnavailable, RecordBusyError))


def error_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (a KeyError's own text, not its repr; line breaks joined with '; ')."""
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    lines = [line.strip() for line in str(msg).splitlines() if line.strip()]
    return "; ".join(lines) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command; returns the exit status.

    Raises:
        SystemExit: status 2 for a malformed command line (argparse) or a library error (:func:`is_user_error`),
            after printing ``specrepro <command>: error: <message>`` (one line) on stderr.
    """
    argv = sys.argv[1:] if argv is None else argv
    commands = COMMANDS
    if argv and argv[0] in COMMANDS:  # configure only the command that runs (keeps start-up cheap)
        commands = {argv[0]: COMMANDS[argv[0]]}
    parser = build_parser(commands if commands is not COMMANDS else None)
    args = parser.parse_args(argv)
    mod = importlib.import_module(args._module)
    try:
        return int(mod.run_command(args, args._parser) or 0)
    except Exception as exc:
        if not is_user_error(exc):
            raise
        args._parser.exit(2, f"{args._parser.prog}: error: {error_line(exc)}\n")


if __name__ == "__main__":
    sys.exit(main())
