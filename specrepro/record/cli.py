"""``python -m specrepro scorecard``: re-score the record and render it."""

from __future__ import annotations

import argparse

from specrepro.record.results import STANDARD, writes_record

__all__ = ["configure_parser", "run_command"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default=STANDARD, help="profile whose result tables are scored (default standard)")
    parser.add_argument("--device", default="cpu", help="device recorded in the scorecard's provenance")
    parser.add_argument("--readme", action="store_true",
                        help="also rewrite the generated blocks of README.md and docs/ (only as the record's writer: "
                             "the standard profile with SPECREPRO_RECORD=1, as `make scorecard` runs it)")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Score the claims, save the scorecard table, print its markdown; with ``--readme`` update README.md."""
    from specrepro.record.report import render_markdown, update_readme, write_scorecard

    card = write_scorecard(args.profile, args.device)
    print(render_markdown(card, args.profile))
    if args.readme and not writes_record(args.profile):
        print("README.md not rewritten: only the record's writer does that (the standard profile with "
              "SPECREPRO_RECORD=1: `make scorecard`)")
    elif args.readme:
        print("README.md updated" if update_readme(args.profile, card) else "README.md already current")
    return 0
