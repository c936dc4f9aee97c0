"""Model names: hub ids without an organisation (``gpt2``) are handed to transformers, unknown bare names give a
clear error (offline: a tiny model saved into a throwaway Hugging Face hub cache, read with HF_HUB_OFFLINE=1)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specrepro import models

REPO = Path(__file__).resolve().parents[1]


def _save_tiny_model(directory: Path) -> None:
    """A 1-layer random llama over a 6-word vocabulary with its tokenizer, saved with save_pretrained."""
    import torch
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "</s>", "def", "f", "(", ")"])}
    raw = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="</s>")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             eos_token_id=1, bos_token_id=None))
    model.save_pretrained(directory)
    tok.save_pretrained(directory)


def test_bare_hub_id_loads_from_the_hub_cache(tmp_path):
    """``load_model("tinybare")``: not a zoo name, so it goes to from_pretrained as the hub id 'tinybare' (here found
    in an offline hub cache laid out as huggingface_hub writes it)."""
    snapshot = tmp_path / "hub" / "models--tinybare" / "snapshots" / ("0" * 40)
    _save_tiny_model(snapshot)
    (tmp_path / "hub" / "models--tinybare" / "refs").mkdir()
    (tmp_path / "hub" / "models--tinybare" / "refs" / "main").write_text("0" * 40)
    code = textwrap.dedent("""
        from specrepro.models import load_model
        from specrepro.core.decoding import default_eos_ids
        model, tok = load_model("tinybare")
        print("loaded", type(model).__name__, tok.eos_token_id, default_eos_ids(model, tok))
    """)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "SPECREPRO_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "loaded LlamaForCausalLM 1 [1]" in proc.stdout


def test_bare_local_directory_loads(tmp_path, monkeypatch):
    _save_tiny_model(tmp_path / "tinydir")
    monkeypatch.chdir(tmp_path)
    model, tok = models.load_model("tinydir")
    assert model.config.num_hidden_layers == 1 and tok.eos_token_id == 1


def test_unknown_bare_name_lists_the_zoo_and_says_what_was_tried(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(KeyError) as info:
        models.load_model("specrepro-no-such-model")
    msg = info.value.args[0]
    assert "'specrepro-no-such-model'" in msg and "smollm2-135m" in msg and "qwen2.5-coder-1.5b" in msg
    assert "hub id or local directory" in msg
    with pytest.raises(KeyError, match="smollm2-135m"):
        models.load_tokenizer("specrepro-no-such-model")
