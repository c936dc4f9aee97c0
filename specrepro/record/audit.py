"""``python -m specrepro audit``: transformers' own speculative samplers (``--runtime llama.cpp``: llama.cpp's
speculative programs) through the exactness battery, :func:`specrepro.sim.audit.audit_table`
(:func:`specrepro.sim.llamacpp_audit.audit_llamacpp_table`), saved as the result table ``audit_transformers``
(``audit_llamacpp``), with a standalone reproduction script under ``--out`` for every audited row that fails.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specrepro.files import atomic_write_text
from specrepro.record.results import check_clean_for_record, save_table

__all__ = ["configure_parser", "run_command"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m specrepro audit`` (defaults shown by ``--help``)."""
    from specrepro.sim.audit import QUICK_SETTINGS

    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("--quick", action="store_true", help="small n, a smoke test without the power guarantee "
                        f"(settings {', '.join(QUICK_SETTINGS)})")
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
    """Run the audit, print and save the table, write the reproduction scripts. Exit status 0 when every control
    behaved as expected (our samplers and HF's plain sampling pass, the replayed bugs fail), whatever the audited
    samplers' verdicts (a failing audited row is a finding); 1 when a control misbehaved (the audit is then not
    trustworthy) or llama.cpp's programs are not built."""
    check_clean_for_record(args.profile)  # before the minutes of sampling, not after
    llama = args.runtime == "llama.cpp"
    if llama:
        from specrepro.sim import llamacpp_audit as sim

        try:
            df = sim.audit_llamacpp_table(quick=args.quick, seed=args.seed, n=args.n, progress=True)
        except FileNotFoundError as e:
            print(e)
            return 1
        name, version = "audit_llamacpp", {"llama_cpp_python": str(df["llama_cpp_python"].iloc[0])}
        what = f"llama.cpp of llama-cpp-python {version['llama_cpp_python']}"
    else:
        from specrepro.sim import audit as sim

        df = sim.audit_table(quick=args.quick, seed=args.seed, progress=True)
        name, version = "audit_transformers", {"transformers": str(df["transformers_version"].iloc[0])}
        what = f"transformers {version['transformers']}"
    path = save_table(df, name + ("_quick" if args.quick else ""), profile=args.profile, seed=args.seed,
                      quick=bool(args.quick), level=sim.LEVEL, **version,
                      seconds=round(float(df.attrs.get("seconds", float("nan"))), 1))
    print(df[sim.COLUMNS[:-1] + ["role"]].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"{what}; level {sim.LEVEL:g}; table: {path}")
    out = Path(args.out)
    for _, r in df[(df["role"] == "audited") & ((df["verdict"] == "fail") | args.all_repros)].iterrows():
        setting = r["setting"].replace("=", "").replace("-", "_")
        if llama:
            file = f"repro_llamacpp_{setting.replace('.', '')}_{r['implementation'].replace('-', '_')}.py"
            script = sim.reproduction_script(r["setting"], r["implementation"])
        else:
            file = f"repro_{setting}_{r['implementation']}.py"
            script = sim.reproduction_script(r["setting"], r["implementation"], seed=args.seed)
        atomic_write_text(out / file, script)  # with its folder
        print("reproduction:", out / file)
    bad = df[(df["role"] != "audited") & ~df["as_expected"]]
    if len(bad):
        print("controls misbehaved:", ", ".join(f"{a}/{b}" for a, b in zip(bad["setting"], bad["implementation"])))
        return 1
    return 0
