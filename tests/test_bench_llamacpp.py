"""The llama.cpp bench methods (specrepro.bench.llama: llama-ar, llama-sd@G, llama-sd-block@G) at the runner level,
on two tiny random GGUF checkpoints written by the project (specrepro.backends.tinygguf; vocabulary 32, 2 layers):

* the names resolve with the registry, ``--list-methods`` shows them with their descriptions, and a bad γ
  (``llama-sd@0``) or a missing draft gets the registry's usual errors;
* greedy: llama-ar's tokens are llama-cpp-python's own ``Llama.generate`` tokens at temperature 0; llama-sd@2 and
  llama-sd-block@2 return llama-ar's tokens on every prompt, timed by the bench's harness (run_interleaved) with llama-ar as the
  baseline, and the speculative runs accept some draft tokens and reject others (the draft is the target's first
  layer under its head);
* under sampling a runner is a function of the harness's generator: the same seed gives the same tokens, another
  seed other tokens;
* the bench JSON's config note names the llama.cpp build, OMP_WAIT_POLICY, the threads and both GGUF files;
  a model that is neither a zoo name nor a GGUF file, and a draft over another vocabulary, are refused.

Skipped, with the import error, only where llama_cpp cannot be imported (install: requirements-llamacpp.txt).
"""

from __future__ import annotations

import argparse
import hashlib

import pytest
import torch

from specrepro.backends.llamacpp import llama_cpp_available
from specrepro.backends.tinygguf import TinyShape, tiny_llama_gguf
from specrepro.bench import REGISTRY, BenchContext, BenchOptionError, configure_parser, resolve_method, run_command
from specrepro.bench import validate_options
from specrepro.bench.run import greedy_equality
from specrepro.core.sampling import GREEDY, SamplingConfig
from specrepro.measure.harness import run_interleaved

_OK, _WHY = llama_cpp_available()
pytestmark = [pytest.mark.skipif(not _OK, reason=f"llama_cpp does not import ({_WHY}); install it with the command "
                                                 "in requirements-llamacpp.txt"),
              # torch's intra-op threads spin against llama.cpp's OpenMP threads between decodes: one torch thread
              # (the methods open llama.cpp with torch's thread count, so one llama.cpp thread too)
              pytest.mark.usefixtures("one_thread")]

SHAPE = TinyShape()  # vocabulary 32, 2 layers, float32
PROMPTS = [[5, 9, 17, 6], [1, 30, 12], [7, 7, 7, 21, 8, 4]]
NEW = 24
METHODS = ("llama-ar", "llama-sd", "llama-sd-block")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-gguf")
    # the target's first layer under its head: an early-exit draft, accepted often but not always
    return {"target": tiny_llama_gguf(1, SHAPE, d), "draft": tiny_llama_gguf(1, TinyShape(n_layer=1), d),
            "small": tiny_llama_gguf(3, TinyShape(vocab=24), d)}


def _ctx(paths, sampling=GREEDY, draft="draft", target="target"):
    return BenchContext(target=None, tokenizer=None, draft=None, prompts=[], sampling=sampling, gamma=2,
                        max_new_tokens=NEW, eos_token_id=[], vocab_size=SHAPE.vocab, seed=0, device="cpu",
                        target_name=str(paths[target]) if target in paths else target,
                        draft_name=str(paths[draft]) if draft in paths else draft)


def _runners(ctx, gamma=2):
    return {"llama-ar": REGISTRY["llama-ar"].factory(ctx, "llama-ar", gamma),
            f"llama-sd@{gamma}": REGISTRY["llama-sd"].factory(ctx, "llama-sd", gamma),
            f"llama-sd-block@{gamma}": REGISTRY["llama-sd-block"].factory(ctx, "llama-sd-block", gamma)}


def test_the_methods_resolve_and_are_listed(capsys):
    for name in METHODS:
        assert resolve_method(f"{name}")[1].family == "llama.cpp"
    assert resolve_method("llama-sd@4")[2] == 4 and resolve_method("llama-sd-block@3")[2] == 3
    assert not REGISTRY["llama-ar"].needs_draft and REGISTRY["llama-sd"].needs_draft
    out = validate_options(methods="ar,llama-ar,llama-sd@4,llama-sd-block@4", gamma=3, n_prompts=1, max_new_tokens=8,
                           temperature=0.0, top_p=1.0, top_k=0, repeats=1, device="cpu", has_draft=True)
    assert [(label, g) for label, _, g in out] == [("ar", 3), ("llama-ar", 3), ("llama-sd@4", 4),
                                                   ("llama-sd-block@4", 4)]
    with pytest.raises(BenchOptionError, match="must be an integer >= 1"):
        resolve_method("llama-sd@0")
    with pytest.raises(BenchOptionError, match="no draft length"):
        resolve_method("llama-ar@4")
    with pytest.raises(BenchOptionError, match="needs a draft model"):
        validate_options(methods="llama-sd@4", gamma=3, n_prompts=1, max_new_tokens=8, temperature=0.0, top_p=1.0,
                         top_k=0, repeats=1, device="cpu", has_draft=False)
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert run_command(parser.parse_args(["--list-methods"])) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    for name in METHODS:
        assert "llama.cpp" in listed[name] and REGISTRY[name].description in listed[name]
        assert REGISTRY[name].description  # a real one-line description


def test_greedy_speculative_runners_equal_llama_ar_in_the_harness(paths):
    ctx = _ctx(paths)
    runners = _runners(ctx)
    prompts = [(f"p{i}", torch.tensor(p)) for i, p in enumerate(PROMPTS)]
    runs = run_interleaved(runners, prompts, repeats=1, seed=0, baseline="llama-ar", greedy=True, progress=False)
    assert len(runs) == len(PROMPTS) * len(runners)
    assert runs["equal_to_baseline"].all()
    assert (runs["new_tokens"] == NEW).all()
    ar = runs[runs["method"] == "llama-ar"]
    assert (ar["steps"] == NEW).all()  # one token per target forward
    for label in ("llama-sd@2", "llama-sd-block@2"):
        d = runs[runs["method"] == label]
        acc, drafted = sum(map(sum, d["accepted"])), sum(map(sum, d["drafted"]))
        assert 0 < acc < drafted, (label, acc, drafted)
        assert (d["steps"] < NEW).all()
        assert greedy_equality(runs, label, "llama-ar") == {"greedy_equal_to_llama_ar": True,
                                                            "equal_to_llama_ar_runs": f"{len(PROMPTS)}/{len(PROMPTS)}"}
    # the equality column is not vacuous: a run with other tokens is caught
    other = runs.copy()
    i = other.index[other["method"] == "llama-sd@2"][0]
    other.at[i, "token_ids"] = list(other.at[i, "token_ids"])[:-1] + [(other.at[i, "token_ids"][-1] + 1) % 32]
    assert greedy_equality(other, "llama-sd@2", "llama-ar")["greedy_equal_to_llama_ar"] is False


def test_llama_ar_greedy_is_llamacpps_own_greedy(paths):
    """The llama-ar runner's greedy tokens equal llama-cpp-python's own generate loop at temperature 0 (no repeat
    penalty) on the same GGUF file, prompt by prompt."""
    from llama_cpp import Llama

    run = REGISTRY["llama-ar"].factory(_ctx(paths), "llama-ar", 1)
    llm = Llama(str(paths["target"]), n_ctx=SHAPE.n_ctx, n_threads=1, verbose=False)
    for prompt in PROMPTS:
        theirs = []
        for tok in llm.generate(prompt, temp=0.0, repeat_penalty=1.0, reset=True):
            theirs.append(int(tok))
            if len(theirs) == NEW:
                break
        assert run(torch.tensor(prompt), torch.Generator()).tokens == theirs, prompt


def test_sampling_runners_follow_the_harness_generator(paths):
    ctx = _ctx(paths, sampling=SamplingConfig(1.0))
    for label, run in _runners(ctx).items():
        ids = torch.tensor(PROMPTS[0])
        a = run(ids, torch.Generator().manual_seed(11)).tokens
        b = run(ids, torch.Generator().manual_seed(11)).tokens
        c = run(ids, torch.Generator().manual_seed(12)).tokens
        assert a == b and len(a) == NEW, label
        assert a != c, label  # 24 tokens at T = 1 from another seed: a coincidence has tiny probability


def test_models_are_opened_once_and_the_config_names_the_build(paths, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    ctx = _ctx(paths)
    first = _runners(ctx, gamma=2)
    _runners(ctx, gamma=3)
    models = {k: v for k, v in ctx._shared.items() if k.startswith("llamacpp:")}
    assert set(models) == {"llamacpp:target", "llamacpp:draft"}  # the second set of runners reused them
    note = ctx.config_notes["llamacpp"]
    import llama_cpp

    assert note["version"] == llama_cpp.__version__ and "CPU" in note["system_info"]
    assert note["omp_wait_policy"] == "PASSIVE" and note["n_threads"] == torch.get_num_threads() == 1
    for role in ("target", "draft"):
        assert note[f"{role}_gguf"]["file"] == paths[role].name
        assert note[f"{role}_gguf"]["sha256"] == hashlib.sha256(paths[role].read_bytes()).hexdigest()
    assert first["llama-ar"](torch.tensor(PROMPTS[1]), torch.Generator()).tokens  # the runner still decodes


def test_refusals(paths, tmp_path):
    with pytest.raises(BenchOptionError, match="zoo's GGUF files"):
        _runners(_ctx(paths, target=str(tmp_path / "no-such-model")))
    with pytest.raises(BenchOptionError, match="24 tokens"):
        REGISTRY["llama-sd"].factory(_ctx(paths, draft="small"), "llama-sd", 2)
