"""Medusa heads with a restricted vocabulary and teacher-forced stdlib self-distillation .

What is tested:
* heads with ``vocab_ids``: logits are -inf outside the kept ids and, at initialisation, equal the LM head's on them
  (shared and private projections); the shared heads make one product for all K heads; save/load keeps the ids;
  bad ids raise.
* exactness: greedy Medusa with restricted heads equals AR; one Medusa step with children sampled from restricted
  heads (q = 0 outside V') and MSS verification passes a chi-square goodness of fit against the target's exact
  3-token distribution at level 1e-3, and the same heads and temperature through MSS without the residual update fail
  it (the test has power against a wrong sampler).
* data: teacher-forced data record the target's last hidden state and its own top-k distribution at every position
  (checked against a direct forward), one chunk per file, cached in shards that a second call reads without running
  the model.
* training: soft-target (KL) training lowers the loss; an interrupted run resumes from its checkpoint and ends with
  the same heads as an uninterrupted run.
* real models (real_model): SmolLM2-135M with stdlib-trained restricted heads passes the goodness-of-fit test at
  top-k 3 (and qwen2.5-coder-1.5b with its cached heads, when those are cached on this machine).
"""

import pytest
import torch
from conftest import LEVEL, PROMPT, tiny_lm

from specrepro.core.decoding import generate
from specrepro.core.medusa import MedusaProposer, medusa_generate
from specrepro.core.medusa_heads import MedusaHeads, random_heads
from specrepro.core.sampling import SamplingConfig
from specrepro.core.trees import tree_generate, verify_tree
from specrepro.sim.exact import target_distribution
from specrepro.sim.medusa import medusa_step_samples
from specrepro.sim.toy import ToyLM
from specrepro.stats import gof_test
from specrepro.train.medusa1 import (
    MedusaTrainConfig,
    _soft_head_targets,
    train_medusa_heads,
)
from specrepro.train.stdlib import stdlib_distillation_data

CHOICES = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
KEEP = torch.tensor([0, 2, 3, 5, 6])


@pytest.fixture(scope="module")
def target():
    return tiny_lm("llama", vocab=8, seed=1)


def _restricted_random_heads(model, k=3, seed=0, scale=0.6, shared=True):
    heads = MedusaHeads.from_base(model, k, share_lm_head=shared, vocab_ids=KEEP)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in heads.blocks:
            b.linear.weight.copy_(scale * torch.randn(b.linear.weight.shape, generator=g))
    return heads.eval().requires_grad_(False)


@pytest.mark.parametrize("shared", [False, True])
def test_restricted_heads_equal_lm_head_on_kept_ids(target, shared):
    heads = MedusaHeads.from_base(target, n_heads=3, share_lm_head=shared, vocab_ids=KEEP)
    h = torch.randn(5, 32)
    out = heads(h)
    assert out.shape == (3, 5, 8) and heads.n_vocab == 5
    assert heads.forward_restricted(h).shape == (3, 5, 5)
    lm = target.lm_head(h)
    mask = torch.zeros(8, dtype=torch.bool)
    mask[KEEP] = True
    for k in range(3):
        torch.testing.assert_close(out[k][:, mask], lm[:, mask])
        assert torch.isneginf(out[k][:, ~mask]).all()


def test_restricted_heads_save_load_and_bad_ids(tmp_path, target):
    heads = _restricted_random_heads(target, shared=False)
    heads.save(tmp_path / "h")
    back = MedusaHeads.load(tmp_path / "h", target)
    assert back.vocab_ids.tolist() == KEEP.tolist()
    h = torch.randn(3, 32)
    torch.testing.assert_close(back(h), heads(h))
    for bad in ([3, 2], [0, 0], [8], [-1]):
        with pytest.raises(ValueError, match="vocab_ids"):
            MedusaHeads(32, 8, 2, vocab_ids=torch.tensor(bad))
    assert MedusaHeads(32, 8, 2, vocab_ids=torch.arange(8)).vocab_ids is None  # whole vocabulary: no restriction


def test_greedy_restricted_medusa_equals_ar(target):
    prop = MedusaProposer(_restricted_random_heads(target), CHOICES)
    ar = generate(target, PROMPT, max_new_tokens=25).tokens
    assert medusa_generate(target, PROMPT, prop, max_new_tokens=25).tokens == ar
    assert tree_generate(target, PROMPT, prop, max_new_tokens=25).tokens == ar


def _no_residual_mss(parents, tokens, p, q, generator):
    return verify_tree(parents, tokens, p, q, generator, "mss", residual_fn=lambda p, q, x: p)


@pytest.mark.parametrize("rule", ["mss", "mss without residual (negative control)"])
def test_restricted_stochastic_medusa_goodness_of_fit(target, rule):
    """Children drawn i.i.d. from heads with q = 0 on 3 of 8 tokens; the target keeps all 8. MSS must still give
    the target's distribution; dropping the residual update (same heads, T = 1, n, level) must be caught."""
    cfg = SamplingConfig(1.0)
    toy = ToyLM.from_transformer(target, PROMPT)
    prop = MedusaProposer(_restricted_random_heads(target), CHOICES, mode="iid")
    g = torch.Generator().manual_seed(11)
    if rule == "mss":
        samples = medusa_step_samples(target, prop, PROMPT, acceptance="mss", sampling=cfg, n_samples=2000,
                                      length=3, generator=g)
    else:
        samples = []
        for _ in range(600):
            out = tree_generate(target, PROMPT, prop, max_new_tokens=4, sampling=cfg, generator=g,
                                verify=_no_residual_mss)
            samples.append(tuple(out.tokens[1:3]))
    if rule == "mss":
        pval = gof_test(samples, target_distribution(toy, cfg, 3))[1]
        assert pval > LEVEL, pval
    else:
        marginal: dict = {}
        for seq, pr in target_distribution(toy, cfg, 4).items():
            marginal[seq[1:3]] = marginal.get(seq[1:3], 0.0) + pr
        pval = gof_test(samples, marginal)[1]
        assert pval < LEVEL, pval


class _CharTokenizer:
    """A tokenizer for the 8-token tiny models: one token per character, id = code point mod 8."""

    def get_vocab(self):
        return {str(i): i for i in range(8)}

    def __call__(self, text, add_special_tokens=False, return_tensors="pt"):
        class _Enc:
            pass

        enc = _Enc()
        enc.input_ids = torch.tensor([[ord(c) % 8 for c in text]], dtype=torch.long)
        return enc


def _corpus(tmp_path, n=6):
    g = torch.Generator().manual_seed(0)
    files = []
    for i in range(n):
        p = tmp_path / f"mod{i}.py"
        p.write_text("".join(chr(97 + int(x)) for x in torch.randint(0, 20, (200,), generator=g)))
        files.append(p)
    return files


def test_teacher_forced_data_match_a_direct_forward_and_are_cached(tmp_path, monkeypatch, target):
    monkeypatch.setenv("SPECREPRO_CACHE", str(tmp_path / "cache"))
    tok = _CharTokenizer()
    files = _corpus(tmp_path)
    data = stdlib_distillation_data(target, tok, n_tokens=4 * 31, chunk_tokens=32, teacher_topk=3, files=files,
                                    shard_size=3, progress=False)
    assert len(data.responses) == 4 and len(set(data.meta["files"])) == 4  # one chunk per file
    for r, h, ti, tp in zip(data.responses, data.hidden, data.teacher_ids, data.teacher_probs):
        assert r.shape == (31,) and h.shape == (31, 32) and ti.shape == (31, 3) and tp.shape == (31, 3)
        assert (tp[:, 1:] <= tp[:, :-1]).all() and (tp.sum(-1) <= 1 + 1e-5).all()
        torch.testing.assert_close(target.lm_head(h).argmax(-1), ti[:, 0])
    # the direct forward of the first chunk reproduces its hidden states
    chunk_text = None
    for f in files:
        if f.name == data.meta["files"][0]:
            chunk_text = f.read_text()
    ids = tok(chunk_text).input_ids[0]
    r0 = data.responses[0]
    start = next(i for i in range(ids.numel() - 31) if ids[i + 1: i + 32].tolist() == r0.tolist())
    with torch.no_grad():
        hid = target.model(input_ids=ids[start: start + 32][None]).last_hidden_state[0, :-1]
    torch.testing.assert_close(hid, data.hidden[0])

    def boom(*a, **k):
        raise AssertionError("the cached shards should have been read")

    monkeypatch.setattr(target.model, "forward", boom)
    try:
        again = stdlib_distillation_data(target, tok, n_tokens=4 * 31, chunk_tokens=32, teacher_topk=3,
                                         files=files, shard_size=3, progress=False)
    finally:
        monkeypatch.undo()
    assert [r.tolist() for r in again.responses] == [r.tolist() for r in data.responses]


def _soft_data(target, tmp_path):
    return stdlib_distillation_data(target, _CharTokenizer(), n_tokens=5 * 63, chunk_tokens=64, teacher_topk=4,
                                    files=_corpus(tmp_path), cache=False, progress=False)


def test_soft_targets_shift_by_head(target, tmp_path):
    data = _soft_data(target, tmp_path)
    ids, pr = _soft_head_targets(data, 3)
    n = data.responses[0].numel()
    assert ids.shape == (5 * n, 3, 4)
    torch.testing.assert_close(ids[:n - 2, 1], data.teacher_ids[0][2:])  # head 2 at j: the backbone's row j + 2
    assert (pr[n - 1, 0] == 0).all()  # past the sequence end: no target


def test_soft_training_lowers_loss_and_resumes(tmp_path, monkeypatch, target):
    data = _soft_data(target, tmp_path)
    cfg = MedusaTrainConfig(n_heads=3, share_lm_head=True, lr=1e-2, epochs=3, batch_size=32, seed=0)
    heads, losses = train_medusa_heads(target, data, cfg, progress=False, vocab_ids=KEEP)
    assert losses.loss.iloc[-3:].mean() < 0.9 * losses.loss.iloc[:3].mean()
    assert heads.vocab_ids.tolist() == KEEP.tolist()

    import specrepro.train.medusa1 as train_mod

    real_save, calls = train_mod._atomic_torch_save, []

    def save_then_stop(obj, path):
        real_save(obj, path)
        calls.append(obj["step"])
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(train_mod, "_atomic_torch_save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train_medusa_heads(target, data, cfg, progress=False, vocab_ids=KEEP, checkpoint=tmp_path / "ck",
                           checkpoint_every=7)
    monkeypatch.setattr(train_mod, "_atomic_torch_save", real_save)
    resumed, losses2 = train_medusa_heads(target, data, cfg, progress=False, vocab_ids=KEEP,
                                          checkpoint=tmp_path / "ck", checkpoint_every=7)
    assert calls == [7, 14] and len(losses2) == len(losses)
    h = torch.randn(4, 32)
    torch.testing.assert_close(resumed(h), heads(h))


def _real_model_gof(model, heads, prompt):
    cfg = SamplingConfig(1.0, top_k=3)
    toy = ToyLM.from_transformer(model, prompt)
    prop = MedusaProposer(heads, [[0], [1], [0, 0], [1, 0]], mode="iid")
    samples = medusa_step_samples(model, prop, prompt, acceptance="mss", sampling=cfg, n_samples=2000, length=2,
                                  generator=torch.Generator().manual_seed(5))
    return gof_test(samples, target_distribution(toy, cfg, 2))[1]


@pytest.mark.real_model
def test_smollm2_restricted_stdlib_heads_goodness_of_fit(smollm2):
    from specrepro.models import load_tokenizer
    from specrepro.train.stdlib import get_or_train_stdlib_heads

    model = smollm2[0] if isinstance(smollm2, tuple) else smollm2
    tok = load_tokenizer("smollm2-135m")
    r = get_or_train_stdlib_heads(model, tok, n_heads=2, head_vocab=4096, n_tokens=1024, chunk_tokens=256,
                                  n_eval_seq=1, epochs=1, batch_size=32, cache=False, progress=False)
    assert r["heads"].n_vocab == 4096 and r["accuracy"].shape[0] == 2
    prompt = tok("def add(a, b):\n    return", return_tensors="pt").input_ids[0]
    assert _real_model_gof(model, r["heads"], prompt) > LEVEL


def test_tree_builders_and_ablation(target):
    from specrepro.lab.medusa_ablation import (
        chain_choices,
        dense_choices,
        tree_ablation,
)

    assert chain_choices(3) == [[0], [0, 0], [0, 0, 0]]
    dense = dense_choices((2, 2))
    assert len(dense) == 6 and [1, 1] in dense and all(len(c) in (1, 2) for c in dense)
    with pytest.raises(ValueError):
        dense_choices((2, 0))
    heads = _restricted_random_heads(target)

    class _Tok:
        def __call__(self, text, return_tensors="pt", **kw):
            class _E:
                pass

            e = _E()
            e.input_ids = torch.tensor([[ord(c) % 8 for c in text]])
            return e

    acc = [[0.5, 0.7], [0.3, 0.5], [0.2, 0.3]]
    runs, summary = tree_ablation(target, _Tok(), heads, ["abcd", "efgh", "ijkl"],
                                  {"chain": chain_choices(3), "dense": dense_choices((2, 2))}, max_new_tokens=12,
                                  accuracies=acc, cost_ms=lambda n: 10.0 + n, progress=False)
    assert len(runs) == 6 and set(summary["tree"]) == {"chain", "dense"}
    row = summary.set_index("tree").loc["chain"]
    assert row["tokens_per_step_lo"] <= row["tokens_per_step"] <= row["tokens_per_step_hi"]
    assert row["predicted_tokens_per_step"] == pytest.approx(1 + 0.5 + 0.5 * 0.3 + 0.5 * 0.3 * 0.2)
    assert row["predicted_speedup"] == pytest.approx(row["tokens_per_step"] * 11.0 / 14.0)


def _cached_stdlib_heads_for(fingerprint):
    import json

    from specrepro.models import cache_dir

    for cfg in sorted((cache_dir() / "medusa" / "heads").glob("*/config.json")):
        c = json.loads(cfg.read_text())
        if c.get("base_fingerprint") == fingerprint and (cfg.parent / "accuracy.csv").exists() and \
                (cfg.parent / "heads.safetensors").exists():
            return cfg.parent
    return None


@pytest.mark.real_model
@pytest.mark.slow
def test_qwen_1p5b_stdlib_heads_goodness_of_fit():
    """The issue's check on the real 1.5B target with its trained, vocabulary-restricted heads: one exact stochastic
    Medusa step (children i.i.d. from the heads at T = 1, top-k 3), continued to 2 tokens, against the target's
    exact top-3 distribution. Runs where the 1.5B model and its stdlib heads are cached (notebook 06 / the bench's
    --medusa-heads stdlib trained them); skipped elsewhere, with the reason."""
    from specrepro.core.medusa_heads import base_fingerprint
    from specrepro.models import cache_dir, load_model

    if not any((cache_dir() / "hf").glob("qwen2.5-coder-1.5b-*")):
        pytest.skip("qwen2.5-coder-1.5b is not in the model cache (the standard profile fetches it)")
    model, tok = load_model("qwen2.5-coder-1.5b")
    where = _cached_stdlib_heads_for(base_fingerprint(model))
    if where is None:
        pytest.skip("no stdlib-trained Medusa heads cached for qwen2.5-coder-1.5b (notebook 06 trains them)")
    heads = MedusaHeads.load(where, model)
    assert heads.vocab_ids is not None
    prompt = tok("def fibonacci(n):\n    ", return_tensors="pt").input_ids[0]
    assert _real_model_gof(model, heads, prompt) > LEVEL
