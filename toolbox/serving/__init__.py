"""An OpenAI-compatible server of a model directory: continuous batching over a ``transformers`` model
(``engine=hf``), or dynamic batching over any other registered `InferenceEngine`.

`toolbox.commands.serve` is the entry point; `app` holds the routes, `server` the model, `scheduler` the continuous
batcher, `engine_backend` the engine backend, `kv` the batcher's shared KV cache, `sampling` the next-token
choice and `weights` the weight-update contract.
"""
