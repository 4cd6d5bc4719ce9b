"""`toolbox.serving.weights`: a push that does not fit the served model is refused and changes nothing."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save
from torch import nn

from toolbox.serving.weights import load_weights, state_digest


def test_a_bad_push_changes_nothing_and_names_the_tensors() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    before = state_digest(model)
    state = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    state["1.weight"] = torch.zeros(5, 5)  # mis-shaped: 0.weight etc. would be copied before strict load raises
    del state["1.bias"]
    with pytest.raises(ValueError, match=r"missing \['1.bias'\].*mis-shaped \['1.weight: \(5, 5\) != \(2, 4\)'\]"):
        load_weights(model, save(state))
    assert state_digest(model) == before
    good = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    assert load_weights(model, save(good)) == 4 and state_digest(model) != before
