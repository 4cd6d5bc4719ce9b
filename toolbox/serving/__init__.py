"""An OpenAI-compatible server of a model directory, with continuous batching over a ``transformers`` model.

`toolbox.serve` is the entry point; `app` holds the routes, `server` the model, `scheduler` the continuous
batcher, `kv` its shared KV cache, `sampling` the next-token choice and `weights` the weight-update contract.
"""
