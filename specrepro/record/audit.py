"""``python -m specrepro audit``: transformers' own speculative samplers through the exactness battery.

What this file is: the command around :func:`specrepro.sim.audit.audit_table`. It prints the table (per setting and
implementation: TV to the exact distribution, p-value, n, the TV detected with 90% power at that n, verdict, the
transformers version), saves it as the result table ``audit_transformers`` (the committed record only under ``make
reproduce``, :func:`specrepro.record.results.save_table`) and writes a standalone reproduction script for every
audited transformers row that fails (every row with ``--all-repros``) under ``--out``. With ``--runtime llama.cpp``
it audits llama.cpp's own speculative programs instead (:mod:`specrepro.sim.llamacpp_audit`; table
``audit_llamacpp``, reproduction scripts ``repro_llamacpp_*.py``).

What it is not: the audit itself (:mod:`specrepro.sim.audit`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["configure_parser", "run_command"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m specrepro audit`` (defaults shown by ``--help``)."""
    from specrepro.sim.audit import QUICK_SETTINGS

    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("--quick", action="store_true",
                        help=f"small n, a smoke test without the power guarantee (settings {', '.join(QUICK_SETTINGS)})")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run")
    parser.add_argument("--profile", default="standard", help="profile the table is saved under (results directory)")
    parser.add_argument("--out", default="build/audit", help="folder for the reproduction scripts")
    parser.add_argument("--all-repros", action="store_true",
                        help="write a reproduction script for every audited row, not only failing ones")
    parser.add_argument("--runtime", choices=("transformers", "llama.cpp"), default="transformers",
                        help="whose speculative samplers to audit: transformers' generate, or llama.cpp's "
                             "llama-speculative-simple / llama-speculative programs (built by python -m "
                             "specrepro.sim.llamacpp_build; table audit_llamacpp)")
    parser.add_argument("--n", type=int, default=None,
                        help="llama.cpp runtime only: runs (samples) per row (default 2000; --quick 200)")


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run the audit, print and save the table, write the reproduction scripts.

    Returns:
        0 when every control behaved as expected (our samplers and HF's plain sampling pass, the replayed bugs
        fail), whatever transformers' own verdicts are (a failing audited row is a finding, with its reproduction);
        1 when a control misbehaved (the audit is then not trustworthy).
    """
    import pandas as pd

    from specrepro.files import atomic_write_text
    from specrepro.record.results import check_clean_for_record, save_table
    from specrepro.sim.audit import COLUMNS, LEVEL, audit_table, reproduction_script

    check_clean_for_record(args.profile)  # before the minutes of sampling, not after
    if getattr(args, "runtime", "transformers") == "llama.cpp":
        return _run_llamacpp(args)
    df = audit_table(quick=args.quick, seed=args.seed, progress=True)
    name = "audit_transformers_quick" if args.quick else "audit_transformers"
    path = save_table(df, name, profile=args.profile, seed=args.seed, quick=bool(args.quick),
                      transformers=str(df["transformers_version"].iloc[0]), level=LEVEL,
                      seconds=round(float(df.attrs.get("seconds", float("nan"))), 1))
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(df[COLUMNS[:-1] + ["role"]].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"transformers {df['transformers_version'].iloc[0]}; level {LEVEL:g}; table: {path}")
    return _repros_and_controls(
        df, Path(args.out), args.all_repros,
        lambda r: f"repro_{r['setting'].replace('=', '').replace('-', '_')}_{r['implementation']}.py",
        lambda r: reproduction_script(r["setting"], r["implementation"], seed=args.seed))


def _repros_and_controls(df, out: Path, all_repros: bool, file_name, script) -> int:
    """Write a reproduction script (``script(row)``, named ``file_name(row)``, under ``out``) for every failing
    audited row (every audited row with ``all_repros``); return 1 when a control did not behave as expected, else 0."""
    from specrepro.files import atomic_write_text

    for _, r in df.iterrows():
        if r["role"] == "audited" and (r["verdict"] == "fail" or all_repros):
            path = out / file_name(r)
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, script(r))
            print("reproduction:", path)
    bad = df[(df["role"] != "audited") & ~df["as_expected"]]
    if len(bad):
        print("controls misbehaved:", ", ".join(f"{a}/{b}" for a, b in zip(bad["setting"], bad["implementation"])))
        return 1
    return 0


def _run_llamacpp(args: argparse.Namespace) -> int:
    """The llama.cpp audit (:func:`specrepro.sim.llamacpp_audit.audit_llamacpp_table`): print and save the table
    ``audit_llamacpp``, write a reproduction script for every failing audited row (every one with ``--all-repros``).
    Returns 1 when a control misbehaved (or the programs are not built), else 0."""
    import pandas as pd

    from specrepro.files import atomic_write_text
    from specrepro.record.results import save_table
    from specrepro.sim.llamacpp_audit import COLUMNS, LEVEL, audit_llamacpp_table, reproduction_script

    try:
        df = audit_llamacpp_table(quick=args.quick, seed=args.seed, n=args.n, progress=True)
    except FileNotFoundError as e:
        print(e)
        return 1
    name = "audit_llamacpp_quick" if args.quick else "audit_llamacpp"
    path = save_table(df, name, profile=args.profile, seed=args.seed, quick=bool(args.quick),
                      llama_cpp_python=str(df["llama_cpp_python"].iloc[0]), level=LEVEL,
                      seconds=round(float(df.attrs.get("seconds", float("nan"))), 1))
    with pd.option_context("display.width", 220, "display.max_columns", None):
        print(df[COLUMNS[:-1] + ["role"]].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"llama.cpp of llama-cpp-python {df['llama_cpp_python'].iloc[0]}; level {LEVEL:g}; table: {path}")
    tag = lambda r: r["setting"].replace("=", "").replace("-", "_").replace(".", "")  # noqa: E731
    return _repros_and_controls(
        df, Path(args.out), args.all_repros,
        lambda r: f"repro_llamacpp_{tag(r)}_{r['implementation'].replace('-', '_')}.py",
        lambda r: reproduction_script(r["setting"], r["implementation"]))
