"""Model backends under the decoding loop: transformers causal LMs with their KV cache (:mod:`.hf`), llama.cpp through
llama-cpp-python (:mod:`.llamacpp`), and the tiny random GGUF checkpoints its tests run on (:mod:`.tinygguf`).

A backend gives what :class:`specrepro.core.blocklm.BlockLM` asks for (a block forward on the cached prefix returning
logits for every new position, cutting the cache back, the vocabulary size); it knows nothing of drafting or
verification. Imports only from the layers below (models, files); never from core.
"""
