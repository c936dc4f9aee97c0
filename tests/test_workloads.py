"""The offline workloads (specrepro.data): the chat workload's categories, order and determinism."""

from specrepro.data import CHAT_CATEGORIES, WORKLOADS, load_workload


def test_chat_workload_covers_its_six_categories_in_turn():
    assert "chat" in WORKLOADS
    prompts = load_workload("chat")
    assert len(prompts) >= 40
    assert [p.meta["category"] for p in prompts[:6]] == list(CHAT_CATEGORIES)
    counts = {c: sum(p.meta["category"] == c for p in prompts) for c in CHAT_CATEGORIES}
    assert min(counts.values()) >= 6, counts
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert p.id.startswith(f"chat/{p.meta['category']}/") and len(p.text) > 40
        assert p.meta["source"] == ("generated" if p.meta["category"] == "math" else p.meta["source"])
    rag = next(p for p in prompts if p.meta["category"] == "rag")
    assert "Passage: " in rag.text and "Question: " in rag.text


def test_chat_workload_is_the_same_every_time():
    a, b = load_workload("chat", 12), load_workload("chat", 12)
    assert [(p.id, p.text) for p in a] == [(p.id, p.text) for p in b]


def test_group_speedups_pair_within_each_category():
    import pandas as pd
    import pytest

    from specrepro.bench.run import group_speedups

    rows = []
    for i, cat in enumerate(["qa", "qa", "qa", "math", "math", "math"]):
        for m, tps, steps in (("ar", 2.0, 64), ("sd", 2.0 * (1.5 if cat == "qa" else 3.0), 20)):
            rows.append({"method": m, "prompt": f"chat/{cat}/{i}", "repeat": 0, "tokens_per_s": tps * (1 + i / 10),
                         "new_tokens": 64, "steps": steps})
    t = group_speedups(pd.DataFrame(rows)).set_index("group")
    assert t.loc["qa", "speedup"] == pytest.approx(1.5) and t.loc["math", "speedup"] == pytest.approx(3.0)
    assert (t["n_prompts"] == 3).all() and t.loc["qa", "tokens_per_step"] == pytest.approx(3.2)
    with pytest.raises(KeyError, match="baseline"):
        group_speedups(pd.DataFrame(rows), baseline="hf-ar")
