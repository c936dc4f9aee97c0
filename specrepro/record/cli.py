"""``python -m specrepro scorecard``: re-score the record and render it.
"""

from __future__ import annotations

import argparse

from specrepro.record.results import STANDARD

__all__ = ["configure_parser", "run_command"]


# --------------------------------------------------------------------------------------------- command line


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m specrepro scorecard``."""
    parser.add_argument("--profile", default=STANDARD, help="profile whose result tables are scored (default standard)")
    parser.add_argument("--device", default="cpu", help="device recorded in the scorecard's provenance")
    parser.add_argument("--readme", action="store_true",
                        help="also rewrite README.md's scorecard and figure blocks (done for any profile when given)")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Score the claims, save the scorecard table, print its markdown; with ``--readme`` update README.md."""
    from specrepro.record.report import render_markdown, update_readme, write_scorecard

    card = write_scorecard(args.profile, args.device)
    print(render_markdown(card, args.profile))
    if args.readme:
        changed = update_readme(args.profile, card, force=True)
        print("README.md updated" if changed else "README.md already current")
    return 0
