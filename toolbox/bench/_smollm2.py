"""SmolLM2-135M-Instruct for the benchmarks: where its directory is, and the arithmetic workload run on it.

The model is a real pretrained one (Llama, 30 layers, hidden 576, vocabulary 49,152, tied embeddings, ChatML
template, pad == eos), so unlike the random BPE models of `toolbox.bench._bpe_models` it is not built here: it is
fetched once (``toolbox model fetch smollm2-135m-instruct``) into the model catalog, or given as a directory.
The workload is the ``grpo_smollm2_arith`` experiment's: chat-templated one-operation word problems from
``configs/data/arith`` with its system prompt, scored by ``math_verify`` on the ``#### N`` answer.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

NAME = "smollm2-135m-instruct"
PATH_ENV = "TOOLBOX_BENCH_SMOLLM2"
SYSTEM_PROMPT = "Answer with the number only, after ####."
# Correct answer (1) plus a shaping term (0.2) for giving one after the marker: an instruct model of this size
# is right on some samples of a group and not others, and the marker term varies too, so advantages are rarely
# all zero and both sides do the full gradient work.
REWARD = {"name": "weighted_sum", "weights": [1.0, 0.2],
          "components": [{"name": "math_verify"}, {"name": "format", "pattern": r"####\s*-?\d", "match": "search"}]}


def arith_task() -> dict[str, Any]:
    """The ``dataset`` task spec of ``configs/data/arith`` (question / answer fields, the system prompt)."""
    from toolbox.core.paths import CONFIG_DIR

    return {"name": "dataset", "path": str(CONFIG_DIR / "data" / "arith"), "prompt_field": "question",
            "answer_field": "answer", "system_prompt": SYSTEM_PROMPT}


def model_dir(explicit: str = "") -> str:
    """SmolLM2's directory: ``explicit`` (``--model-path``), else ``$TOOLBOX_BENCH_SMOLLM2``, else the model
    catalog's copy (`toolbox.models.catalog`). Raises `SystemExit` naming the fetch command when none has it."""
    given = explicit or os.environ.get(PATH_ENV, "")
    if given:
        if not (Path(given) / "config.json").is_file():
            raise SystemExit(f"--model-path / ${PATH_ENV}: {given} is not a model directory (no config.json)")
        return given
    catalog = _catalog()
    if catalog is None:
        raise SystemExit(f"bench --model smollm2: no model catalog in this toolbox (toolbox.models.catalog); give the "
                         f"directory of a SmolLM2-135M-Instruct copy with --model-path or ${PATH_ENV}")
    from toolbox.core.errors import ConfigError

    try:  # the catalog's error names the cache directory and `toolbox model fetch smollm2-135m-instruct`
        return str(catalog.resolve(NAME, field="bench --model smollm2"))
    except ConfigError as err:
        raise SystemExit(f"{err}; or give a directory with --model-path or ${PATH_ENV}") from None


def _catalog() -> Any:
    """`toolbox.models.catalog`, or None in a toolbox that has none yet."""
    try:
        return importlib.import_module("toolbox.models.catalog")
    except ModuleNotFoundError as err:
        if err.name != "toolbox.models.catalog":
            raise
        return None
