"""Comparing what two engines sample: the same requests from the same seed must give the same tokens and log-probs.

Shared by the tests that hold an engine against a reference one (the lean model against transformers', adapters
against merged weights).
"""

from __future__ import annotations

from typing import Any

import torch


def assert_same_samples(engine: Any, reference: Any, requests: list[Any], sampling: Any, seed: int,
                        rtol: float = 1e-5) -> None:
    """``engine`` and ``reference`` each sample ``requests`` from the global torch RNG seeded with ``seed``."""
    torch.manual_seed(seed)
    got = engine.generate(requests, sampling)
    torch.manual_seed(seed)
    want = reference.generate(requests, sampling)
    assert torch.equal(got.response_ids_BR, want.response_ids_BR)
    torch.testing.assert_close(got.logprobs_BR, want.logprobs_BR, rtol=rtol, atol=1e-5)
