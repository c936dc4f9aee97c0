"""A memoizing wrapper of a (tiny) transformers causal LM for Monte Carlo runs of the real decoding loops.

What this file is: :class:`MemoizedLM`, which the exactness battery's goodness-of-fit tests hand to
:func:`specrepro.core.decoding.generate`, :func:`specrepro.core.trees.tree_generate` and the drafters in place of a
tiny random model. A goodness-of-fit test draws thousands of short sequences one call at a time, and on a tiny
model (hidden size 32, vocabulary 8) a forward pass is almost all Python overhead (~2-5 ms on a 2-core CPU, for a
few microseconds of arithmetic); with peaked distributions the same few hundred forward passes recur over and over.
The wrapper runs each distinct forward pass once and replays it afterwards, bit for bit:

* a forward pass is a pure function of the weights, its keyword arguments (token ids, attention mask, position ids,
  ``logits_to_keep``, ``use_cache``, ``output_hidden_states``) and the key/value tensors of the KV cache it extends.
  The wrapper keys every call on the arguments' values and the bytes of every cached key/value tensor, so two calls
  with the same key compute the same thing from the same numbers (CPU kernels are deterministic for equal shapes and
  thread counts).
* a replayed call appends to the cache the very KV entries the original call appended (``DynamicCache.update``,
  the cache's own concatenation), so the loops' caches, rollbacks (``crop``, ``select_cache_positions``) and
  their bookkeeping all run for real; only the transformer's arithmetic is skipped. Its logits (and hidden states)
  are returned as fresh copies.
* anything else runs the model unmemoized: positional arguments, other keyword arguments, ``use_cache`` not True
  with a cache, cache layers other than transformers' ``DynamicLayer``, a call that does not simply append its
  positions to the cache.
* ``check_every=k`` recomputes every k-th replayed call with the model as well and raises ``AssertionError`` unless
  logits, hidden states and appended KV entries are bitwise equal (the tests run with a check rate).

The samples a loop draws through the wrapper are therefore the samples it draws through the model, generator state
for generator state; only the time changes. Attribute access (``config``, ``device``, ``generation_config``, ...)
is forwarded to the wrapped model.

What it is not: a cache for models whose weights change while it is in use (wrap after the last weight edit), nor
for anything but inference (calls run under ``torch.inference_mode``).
"""

from __future__ import annotations

import torch

__all__ = ["MemoizedLM", "ReplayedOutput", "memoized"]

#: the keyword arguments a memoized call may have (any other, or a positional argument, runs the model unmemoized)
_MEMO_KEYS = frozenset({"input_ids", "past_key_values", "use_cache", "logits_to_keep", "attention_mask",
                        "position_ids", "output_hidden_states"})
_ORDER = tuple(sorted(_MEMO_KEYS - {"past_key_values"}))


def _tensor_key(x):
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return (str(x.dtype), tuple(x.shape), x.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return ("value", x)


class MemoizedLM:
    """``model`` (a transformers causal LM) whose forward passes are memoized by their keyword arguments and the
    contents of the KV cache they extend (module docstring); outputs, caches and hence samples are bitwise those of
    ``model``.

    Args:
        model: the model; it must not change while wrapped.
        check_every: every k-th replayed call is recomputed and compared bitwise (0: never).
        max_entries: the memo stops growing past this many entries (calls then run the model).

    Attributes:
        calls, hits, passed_through, checked: counters (calls memoizable or not; replayed; run unmemoized; verified).
    """

    def __init__(self, model, check_every: int = 0, max_entries: int = 200_000):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_memo", {})
        object.__setattr__(self, "check_every", int(check_every))
        object.__setattr__(self, "max_entries", int(max_entries))
        for k in ("calls", "hits", "passed_through", "checked"):
            object.__setattr__(self, k, 0)

    # ------------------------------------------------------------------ attribute forwarding
    def __getattr__(self, name):
        return getattr(self._model, name)

    def __setattr__(self, name, value):
        if name in ("calls", "hits", "passed_through", "checked", "check_every", "max_entries"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._model, name, value)

    def __repr__(self) -> str:
        return f"MemoizedLM({type(self._model).__name__}, {len(self._memo)} entries, {self.hits}/{self.calls} replayed)"

    @property
    def wrapped(self):
        """The model itself."""
        return self._model

    # ------------------------------------------------------------------ the cache's contents
    @staticmethod
    def _cache_key(cache):
        """The bytes of every key/value tensor ``cache`` holds (what a forward pass reads from it), or None when
        its layers are not transformers' plain ``DynamicLayer`` (then the call is not memoized)."""
        from transformers.cache_utils import DynamicLayer

        layers = getattr(cache, "layers", None)
        if layers is None or any(type(layer) is not DynamicLayer for layer in layers):
            return None
        return tuple((_tensor_key(layer.keys), _tensor_key(layer.values)) if layer.is_initialized else None
                     for layer in layers)

    # ------------------------------------------------------------------ the call
    @torch.inference_mode()
    def __call__(self, *args, **kwargs):
        self.calls += 1
        if args or not set(kwargs) <= _MEMO_KEYS or kwargs.get("input_ids") is None:
            return self._pass(args, kwargs)
        cache = kwargs.get("past_key_values")
        use_cache = kwargs.get("use_cache")
        if cache is not None and not use_cache:
            return self._pass(args, kwargs)
        contents = self._cache_key(cache) if cache is not None else ()
        if contents is None:
            return self._pass(args, kwargs)
        key = (contents,) + tuple(_tensor_key(kwargs.get(k)) for k in _ORDER)
        fed = int(kwargs["input_ids"].shape[-1])
        before = cache.get_seq_length() if cache is not None else 0
        entry = self._memo.get(key)
        if entry is not None:
            self.hits += 1
            if self.check_every and self.hits % self.check_every == 0:
                return self._run(kwargs, cache, key, fed, before, check=entry)
            logits, hidden, deltas = entry
            if cache is not None:
                for i, (dk, dv) in enumerate(deltas):
                    cache.update(dk, dv, i)
            return self._output(logits, hidden, cache)
        return self._run(kwargs, cache, key, fed, before)

    def _run(self, kwargs, cache, key, fed, before, check=None):
        out = self._model(**kwargs)
        deltas = []
        if cache is not None:
            if not all(layer.is_initialized and layer.keys.shape[-2] == before + fed
                       and layer.values.shape[-2] == before + fed for layer in cache.layers):
                return out  # not the plain append this wrapper replays: not memoized
            deltas = [(layer.keys[..., before:, :].clone(), layer.values[..., before:, :].clone())
                      for layer in cache.layers]
        logits = out.logits.clone()
        hidden = tuple(h.clone() for h in out.hidden_states) if getattr(out, "hidden_states", None) else None
        if check is not None:
            self.checked += 1
            c_logits, c_hidden, c_deltas = check
            same = torch.equal(c_logits, logits) and (c_hidden is None) == (hidden is None)
            same = same and (hidden is None or all(torch.equal(a, b) for a, b in zip(c_hidden, hidden)))
            same = same and len(c_deltas) == len(deltas) and all(
                torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(c_deltas, deltas))
            if not same:
                raise AssertionError("MemoizedLM: a replayed forward pass differs from the model's own; the memo "
                                     "key does not capture everything the output depends on")
        elif len(self._memo) < self.max_entries:
            self._memo[key] = (logits, hidden, deltas)
        return out

    def _pass(self, args, kwargs):
        self.passed_through += 1
        return self._model(*args, **kwargs)

    @staticmethod
    def _output(logits, hidden, cache):
        return ReplayedOutput(logits.clone(), cache, tuple(h.clone() for h in hidden) if hidden is not None else None)


class ReplayedOutput:
    """The output of a replayed call: ``logits`` (float [B, T, V]), ``past_key_values`` (the cache passed in, or
    None) and ``hidden_states`` (a tuple of float [B, T, H], or None), as attributes (a transformers
    ``CausalLMOutputWithPast`` costs more to build than a replay)."""

    __slots__ = ("logits", "past_key_values", "hidden_states")

    def __init__(self, logits, past_key_values, hidden_states):
        self.logits, self.past_key_values, self.hidden_states = logits, past_key_values, hidden_states


def memoized(*models, check_every: int = 0):
    """:class:`MemoizedLM` of each model (one model: the wrapper; several: a tuple of wrappers)."""
    out = tuple(MemoizedLM(m, check_every=check_every) for m in models)
    return out[0] if len(out) == 1 else out
