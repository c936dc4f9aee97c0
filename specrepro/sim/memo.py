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
  their bookkeeping all run for real; only the transformer's arithmetic is skipped. Its logits (hidden states, a
  backbone's last hidden state) are returned as fresh copies. ``get_decoder()`` returns the backbone memoized the
  same way (the pruned-head drafter runs it without the model's head).
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
#: the output fields a replay returns
_FIELDS = ("logits", "last_hidden_state", "hidden_states")


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
            fields, deltas = entry
            if cache is not None:
                for i, (dk, dv) in enumerate(deltas):
                    cache.update(dk, dv, i)
            return ReplayedOutput(cache, **{k: _copy(v) for k, v in fields.items()})
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
        fields = {}
        for name in _FIELDS:
            value = getattr(out, name, None)
            if isinstance(value, torch.Tensor):
                fields[name] = value.clone()
            elif isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
                fields[name] = tuple(v.clone() for v in value)
        if check is not None:
            self.checked += 1
            c_fields, c_deltas = check
            same = c_fields.keys() == fields.keys() and all(_equal(c_fields[k], fields[k]) for k in fields)
            same = same and len(c_deltas) == len(deltas) and all(
                torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(c_deltas, deltas))
            if not same:
                raise AssertionError("MemoizedLM: a replayed forward pass differs from the model's own; the memo "
                                     "key does not capture everything the output depends on")
        elif len(self._memo) < self.max_entries:
            self._memo[key] = (fields, deltas)
        return out

    def _pass(self, args, kwargs):
        self.passed_through += 1
        return self._model(*args, **kwargs)

    def get_decoder(self):
        """The wrapped model's backbone (``get_decoder()``, the transformer without its head), memoized the same way
        (one wrapper per wrapper, with the same check rate)."""
        dec = self.__dict__.get("_decoder")
        if dec is None:
            dec = MemoizedLM(self._model.get_decoder(), check_every=self.check_every, max_entries=self.max_entries)
            object.__setattr__(self, "_decoder", dec)
        return dec


def _equal(a, b) -> bool:
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    return isinstance(b, torch.Tensor) and torch.equal(a, b)


def _copy(v):
    return tuple(x.clone() for x in v) if isinstance(v, tuple) else v.clone()


class ReplayedOutput:
    """The output of a replayed call, as attributes (a transformers ``ModelOutput`` costs more to build than a
    replay): ``past_key_values`` (the cache passed in, or None) and fresh copies of the original output's
    ``logits`` (float [B, T, V]), ``last_hidden_state`` (float [B, T, H], a backbone's output) and ``hidden_states``
    (tuple of float [B, T, H]), each None where the original had none."""

    __slots__ = ("past_key_values",) + _FIELDS

    def __init__(self, past_key_values, logits=None, last_hidden_state=None, hidden_states=None):
        self.past_key_values, self.logits = past_key_values, logits
        self.last_hidden_state, self.hidden_states = last_hidden_state, hidden_states


def memoized(*models, check_every: int = 0):
    """:class:`MemoizedLM` of each model (one model: the wrapper; several: a tuple of wrappers)."""
    out = tuple(MemoizedLM(m, check_every=check_every) for m in models)
    return out[0] if len(out) == 1 else out
