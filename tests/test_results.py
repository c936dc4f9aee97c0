"""Result tables: atomic writes, provenance sidecars, and resume keyed by the settings a table was measured under."""

import json

import pandas as pd
import pytest

from specrepro import files
from specrepro.record import results


@pytest.fixture
def tmp_results(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "results_dir", lambda profile=results.STANDARD: tmp_path)
    return tmp_path


def _table():
    return pd.DataFrame({"width": [1, 2], "tokens_per_step": [2.5, 3.0]})


def test_round_trip_and_sidecar(tmp_results):
    path = results.save_table(_table(), "t", profile="mine", prompts=2, widths=(1, 2))
    assert path == tmp_results / "t.csv"
    pd.testing.assert_frame_equal(results.load_table("t", "mine"), _table())
    prov = json.loads((tmp_results / "t.provenance.json").read_text())
    assert prov["prompts"] == 2 and prov["widths"] == [1, 2] and prov["profile"] == "mine"
    # no temporary files left behind by the atomic write
    assert sorted(p.name for p in tmp_results.iterdir()) == ["t.csv", "t.provenance.json"]


def test_missing_table_is_none(tmp_results):
    assert results.load_table("absent", "mine") is None
    assert results.load_table("absent", "mine", prompts=2) is None


def test_resume_only_under_the_same_settings(tmp_results):
    results.save_table(_table(), "t", profile="mine", prompts=2, tokens=24, widths=[1, 2])
    # same settings (a tuple equals the recorded list): reused
    assert results.load_table("t", "mine", prompts=2, tokens=24, widths=(1, 2)) is not None
    assert results.load_table("t", "mine", tokens=24) is not None
    # a changed setting, or one the sidecar never recorded, makes the table stale
    assert results.load_table("t", "mine", prompts=2, tokens=64) is None
    assert results.load_table("t", "mine", prompts=2, depth=8) is None


def test_unreadable_sidecar_is_stale(tmp_results):
    results.save_table(_table(), "t", profile="mine", prompts=2)
    (tmp_results / "t.provenance.json").write_text("{not json")
    assert results.load_table("t", "mine", prompts=2) is None
    # without settings the CSV alone is enough
    assert results.load_table("t", "mine") is not None
    (tmp_results / "t.provenance.json").unlink()
    assert results.load_table("t", "mine", prompts=2) is None


def test_dirty_means_code_not_outputs(tmp_path, monkeypatch):
    """Rewriting a committed result table must not mark the table's own provenance '-dirty'; a code edit must."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "specrepro").mkdir()
    (tmp_path / "data" / "results").mkdir(parents=True)
    (tmp_path / "specrepro" / "m.py").write_text("x = 1\n")
    (tmp_path / "data" / "results" / "t.csv").write_text("a\n1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(files, "repo_root", lambda: tmp_path)
    assert not files.git_commit().endswith("-dirty")
    (tmp_path / "data" / "results" / "t.csv").write_text("a\n2\n")
    assert not files.git_commit().endswith("-dirty")
    (tmp_path / "specrepro" / "m.py").write_text("x = 2\n")
    assert files.git_commit().endswith("-dirty")


def test_only_make_reproduce_writes_the_record(monkeypatch):
    root = results.repo_root()
    monkeypatch.delenv(results.RECORD_ENV, raising=False)
    # an interactive standard run (JupyterLab, papermill without the Makefile) writes under build/
    assert results.results_dir("standard") == root / "build/standard/results"
    assert results.figures_dir("standard") == root / "build/standard/figures"
    assert results.read_dirs("standard") == [root / "build/standard/results", root / "data/results"]
    monkeypatch.setenv(results.RECORD_ENV, "1")
    assert results.results_dir("standard") == root / "data/results"
    assert results.figures_dir("standard") == root / "figures"
    assert results.read_dirs("standard") == [root / "data/results"]
    # other profiles never write the record
    assert results.results_dir("quick") == root / "build/quick/results"
    assert results.read_dirs("quick") == [root / "build/quick/results"]


def test_cpu_description_names_the_model_and_its_widest_simd():
    from specrepro.files import cpu_description

    info = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
            "flags\t\t: fpu sse4_2 avx avx2 fma\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n")
    assert cpu_description(info) == "AMD EPYC (family 25, model 1), avx2"
    assert cpu_description(info.replace("avx2", "avx2 avx512f")).endswith(", avx512f")
    assert cpu_description("") in (__import__("platform").processor() or "unknown",)


def test_cpu_bf16_reads_the_bfloat16_flags():
    from specrepro.files import cpu_bf16

    info = "processor\t: 0\nmodel name\t: Xeon\nflags\t\t: fpu avx2 avx512f avx512_vnni\n"
    assert cpu_bf16(info) is False
    assert cpu_bf16(info.replace("avx512_vnni", "avx512_vnni avx512_bf16")) is True
    assert cpu_bf16(info.replace("avx512_vnni", "amx_bf16 amx_tile")) is True
    assert cpu_bf16("model name\t: no flags line\n") is None


def test_atomic_directory_appears_whole_or_not_at_all(tmp_path):
    from specrepro.files import atomic_directory

    final = tmp_path / "ckpt"
    with atomic_directory(final) as tmp:
        (tmp / "config.json").write_text("{}")
        assert not final.exists()  # nothing at the final name while it is being written
    assert (final / "config.json").read_text() == "{}"
    with pytest.raises(RuntimeError, match="interrupted"):
        with atomic_directory(final) as tmp:
            (tmp / "config.json").write_text('{"half": 1}')
            raise RuntimeError("interrupted")
    assert (final / "config.json").read_text() == "{}"  # the old directory is kept
    with atomic_directory(final) as tmp:
        (tmp / "other.txt").write_text("x")
    assert sorted(p.name for p in final.iterdir()) == ["other.txt"]  # replaced, not merged
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary directory left behind


def test_code_fingerprint_of_modules_follows_their_imports_and_nothing_else(tmp_path, monkeypatch):
    """A fingerprint of some modules changes with their code and that of what they import, and not with a module
    they do not import; the whole-package fingerprint changes with either."""
    import specrepro.files as files

    pkg = tmp_path / "specrepro"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("from specrepro.core import b\n")
    (pkg / "core" / "b.py").write_text("def f():\n    from specrepro.c import g\n")
    (pkg / "c.py").write_text("g = 1\n")
    (pkg / "other.py").write_text("x = 1\n")
    monkeypatch.setattr(files, "__file__", str(pkg / "files.py"))
    closure = [p.relative_to(pkg).as_posix() for p in files._import_closure(pkg, ["specrepro.core.a"])]
    assert closure == ["__init__.py", "c.py", "core/__init__.py", "core/a.py", "core/b.py"]
    part, whole = files.code_fingerprint(["specrepro.core.a"]), files.code_fingerprint()
    (pkg / "other.py").write_text("x = 2\n")  # not imported by core.a
    assert files.code_fingerprint(["specrepro.core.a"]) == part and files.code_fingerprint() != whole
    (pkg / "c.py").write_text("g = 2\n")  # imported inside a function of core.b, which core.a imports
    assert files.code_fingerprint(["specrepro.core.a"]) != part
    with pytest.raises(ModuleNotFoundError, match="not a module"):
        files.code_fingerprint(["specrepro.nope"])
    with pytest.raises(ModuleNotFoundError, match="not a module"):
        files.code_fingerprint(["numpy"])


def test_resumable_rows_keeps_finished_items_and_drops_rows_beyond_the_list(tmp_path):
    from specrepro.files import resumable_rows

    ckpt, calls = tmp_path / "rows.json", []

    def one(i):
        calls.append(i)
        return {"square": i * i}

    rows, resumed = resumable_rows(3, one, checkpoint=ckpt, key={"k": 1}, row_info={"sitting": "a"}, index="prompt")
    assert resumed == 0 and calls == [0, 1, 2] and [r["square"] for r in rows] == [0, 1, 4]
    calls.clear()
    rows, resumed = resumable_rows(4, one, checkpoint=ckpt, key={"k": 1}, row_info={"sitting": "b"}, index="prompt")
    assert resumed == 3 and calls == [3] and [r["sitting"] for r in rows] == ["a", "a", "a", "b"]
    rows, resumed = resumable_rows(2, one, checkpoint=ckpt, key={"k": 1}, index="prompt")
    assert resumed == 2 and [r["prompt"] for r in rows] == [0, 1]
    rows, _ = resumable_rows(2, one, key={"k": 1})  # no checkpoint: every item runs
    assert [r["item"] for r in rows] == [0, 1]
    with pytest.raises(ValueError, match="n_items"):
        resumable_rows(-1, one)
