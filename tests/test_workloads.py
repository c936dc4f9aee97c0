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
