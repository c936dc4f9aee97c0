"""A method's name is its whole configuration: a method whose draft an option chooses is recorded, rendered and
compared under the name that fixes that draft, and that name runs the same thing on its own."""

from __future__ import annotations

import pytest

from specrepro.bench.cli import command_settings
from specrepro.bench.registry import REGISTRY, canonical_bench, canonical_method, resolve_method
from specrepro.record import status


@pytest.mark.parametrize("method, options, name", [
    ("sd-draft-adaptive@20", {"draft_kind": "int8-pruned"}, "sd-draft-adaptive-int8-pruned@20"),
    ("sd-hybrid-adaptive@20", {"draft_kind": "int8"}, "sd-hybrid-adaptive-int8@20"),
    ("sd-hybrid-adaptive", {"draft_kind": "int4"}, "sd-hybrid-adaptive-int4"),
    ("sd-draft-adaptive@20", {}, "sd-draft-adaptive@20"),                       # the float draft: the plain name
    ("sd-draft-adaptive@20", {"draft_kind": "fp32"}, "sd-draft-adaptive@20"),
    ("sd-draft-int8@4", {"draft_kind": "int4"}, "sd-draft-int8@4"),              # its draft is in its name already
    ("ar", {"draft_kind": "int8"}, "ar"),
])
def test_canonical_names_fix_the_draft(method, options, name):
    assert canonical_method(method, options) == name
    base = name.split("@", 1)[0]
    assert base in REGISTRY  # the canonical name is a registered method: it runs by that name alone
    resolve_method(name)


def test_old_files_are_read_under_their_canonical_names():
    data = {"config": {"methods": ["ar", "sd-hybrid-adaptive@20"], "options": {"draft_kind": "int8"}},
            "summary": [{"method": "ar"}, {"method": "sd-hybrid-adaptive@20", "tokens_per_s": 2.0}],
            "runs": [{"method": "sd-hybrid-adaptive@20", "prompt": "p"}]}
    out = canonical_bench(data)
    assert out["config"]["methods"] == ["ar", "sd-hybrid-adaptive-int8@20"]
    assert [r["method"] for r in out["summary"]] == ["ar", "sd-hybrid-adaptive-int8@20"]
    assert out["summary"][1]["tokens_per_s"] == 2.0 and out["runs"][0]["method"] == "sd-hybrid-adaptive-int8@20"
    assert data["config"]["methods"] == ["ar", "sd-hybrid-adaptive@20"]  # the argument is not modified
    plain = {"config": {"methods": ["ar", "sd-draft@4"], "options": {}}, "summary": [], "runs": []}
    assert canonical_bench(plain) is plain


def test_a_recipe_naming_the_draft_matches_a_file_that_set_it_by_option():
    line = ("python -m specrepro bench --pair qwen-coder --workload chat --chat --n-prompts 24 --max-new-tokens 64 "
            "--seed 0 --repeats 3 --methods ar,sd-hybrid-adaptive-int8@20 --temperature 0 --json x.json")
    recipe = command_settings(line)
    config = {"methods": ["ar", "sd-hybrid-adaptive@20"], "options": {"draft_kind": "int8"}, "n_prompts": 24,
              "max_new_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "repeats": 3,
              "workload": "chat", "chat_template": True, "dtype": "float32"}
    assert status.bench_setting_changes(config, recipe) == []
    other = {**config, "options": {"draft_kind": "int4"}}
    assert status.bench_setting_changes(other, recipe) == [
        "methods: recorded ['ar', 'sd-hybrid-adaptive-int4@20'], the Makefile asks ['ar', 'sd-hybrid-adaptive-int8@20']"]
