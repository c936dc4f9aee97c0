"""``python -m specrepro pass-at-1``: options checked before any model loads, paired samples that resume across
sittings, and the two tables the scorecard's quality rule reads."""

import pandas as pd
import pytest
import torch

from specrepro.__main__ import main
from specrepro.core.decoding import generate
from specrepro.core.sampling import SamplingConfig
from specrepro.drafters.model import DraftModelDrafter
from specrepro.lab.chen import quality_tables, sample_pairs

NUCLEUS = SamplingConfig(temperature=0.8, top_p=0.95)


@pytest.mark.parametrize("argv, message", [
    (["--gamma", "0"], "gamma >= 1"),
    (["--temperature", "0"], "temperature must be > 0"),
    (["--top-p", "1.5"], "top_p must lie in (0, 1]"),
    (["--timeout", "0"], "timeout must be > 0"),
    (["--pair", "no-such-pair"], "unknown pair"),
])
def test_bad_options_end_as_one_line_with_status_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["pass-at-1", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specrepro pass-at-1: error:") and message in err[0]


def test_samples_are_paired_by_seed_and_resume_from_the_checkpoint(pair, tmp_path):
    target, draft = pair
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([3, 1, 4, 1, 5]), torch.tensor([2, 7])]
    calls = []

    def spec(ids, generator):
        calls.append(ids.tolist())
        return generate(target, ids, drafter=DraftModelDrafter(draft, 8), gamma=3, max_new_tokens=12,
                        sampling=NUCLEUS, generator=generator, eos_token_id=None)

    kw = dict(sampling=NUCLEUS, seed=5, max_new_tokens=12, eos_token_id=None, decode=lambda t: " ".join(map(str, t)))
    ckpt, key = tmp_path / "q.json", {"seed": 5, "code": "abc"}
    first = sample_pairs(target, prompts[:2], spec, checkpoint=ckpt, checkpoint_key=key,
                         row_info={"commit": "c1", "cpu": "A"}, **kw)
    # prompt i's AR sample is AR sampling from a generator seeded seed + i, whatever ran before it
    ar1 = generate(target, prompts[1], max_new_tokens=12, sampling=NUCLEUS, eos_token_id=None,
                   generator=torch.Generator().manual_seed(6)).tokens
    assert first["ar_tokens"].iloc[1] == [int(t) for t in ar1] and first["ar_text"].iloc[1] == " ".join(map(str, ar1))
    assert all(len(t) == 12 for t in first["spec_tokens"]) and len(calls) == 2
    calls.clear()
    full = sample_pairs(target, prompts, spec, checkpoint=ckpt, checkpoint_key=key,
                        row_info={"commit": "c2", "cpu": "B"}, **kw)
    assert full.attrs["resumed"] == 2 and calls == [prompts[2].tolist()]
    assert list(full["prompt"]) == [0, 1, 2] and list(full["commit"]) == ["c1", "c1", "c2"]
    assert full["spec_tokens"].iloc[:2].tolist() == first["spec_tokens"].tolist()
    # another key: nothing is resumed, the old checkpoint is set aside
    calls.clear()
    with pytest.warns(UserWarning, match="not resumed"):
        again = sample_pairs(target, prompts, spec, checkpoint=ckpt, checkpoint_key={**key, "seed": 6}, **kw)
    assert again.attrs["resumed"] == 0 and len(calls) == 3 and len(list(tmp_path.glob("q.json.stale-*"))) == 1


def test_quality_tables_score_both_methods_per_problem():
    from specrepro.data import load_workload

    problems = load_workload("humaneval", 2)
    right = [p.meta["canonical_solution"] for p in problems]
    samples = pd.DataFrame({"prompt": [0, 1], "ar_tokens": [[1, 2], [3]], "spec_tokens": [[4], [5, 6, 7]],
                            "ar_text": right, "spec_text": [right[0], "    return None\n"], "seconds": [1.0, 2.0],
                            "commit": ["c1", "c2"], "cpu": ["A", "A"]})
    summary, comp = quality_tables(problems, samples, method="sd-draft@4", timeout=5.0)
    assert list(summary["method"]) == ["ar", "sd-draft@4"] and list(summary["passed"]) == [2, 1]
    assert list(summary["pass@1"]) == [1.0, 0.5] and (summary["setting"] == "nucleus").all()
    sd = comp[comp["method"] == "sd-draft@4"]
    assert list(sd["prompt"]) == [p.id for p in problems] and list(sd["passed"]) == [True, False]
    assert list(sd["new_tokens"]) == [1, 3] and list(sd["commit"]) == ["c1", "c2"]
    with pytest.raises(ValueError, match="decoded text"):
        quality_tables(problems, samples.assign(ar_text=None), method="sd-draft@4")
