"""``model.cold_start``: a short supervised run before RL, whose exported policy the run then starts from.

Agent trainers rarely start RL from a model that has never seen the task's format: DeepSeek-R1's cold start,
ToolRL and ReTool first fine-tune on a few hundred demonstration episodes, then run GRPO. Here the
supervised run is an ordinary experiment (``model.cold_start.experiment``, e.g. ``sft_tool_calc_tiny``) run
in the driver's process before any RL actor loads the model: ``ray.local_mode``, one learner rank, on this
run's model, exported as a Hugging Face directory. Its directory, ``run_root/.models/cold-start-<digest>``, is
named by everything that decides its result (the base model, the experiment, its overrides, the seed), so a
second run, a resumed run and ``toolbox export`` find it again instead of training it anew.

Not covered: two runs that start the same cold start at the same moment both train it (the same result, the
later one kept); a cold start on several learner ranks or on a Ray cluster (it is meant to be short).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from toolbox.core.errors import ConfigError

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig

log = logging.getLogger("toolbox")
DONE = "cold_start.json"  # written once the exported policy is complete: a directory without it is retrained


def cold_start_args(cfg: ExperimentConfig, base: str, run_dir: Path) -> list[str]:
    """The supervised experiment's command line: the user's experiment and overrides, then what a cold start fixes."""
    cold = cfg.model.cold_start
    assert cold is not None
    return [f"experiment={cold.experiment}", *cold.overrides,
            f"model.path={base}", "model.tiny=null", "model.cold_start=null", f"model.dtype={cfg.model.dtype}",
            f"model.trust_remote_code={str(cfg.model.trust_remote_code).lower()}",
            "ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1",
            "trainer.export=true", f"trainer.seed={cfg.trainer.seed}",
            f"trainer.run_root={run_dir.parent}", f"trainer.run_name={run_dir.name}"]


def cold_start_dir(cfg: ExperimentConfig, base: str, run_root: Path) -> Path:
    """Where the cold start of ``cfg`` from model ``base`` lives (the same inputs, the same directory)."""
    cold = cfg.model.cold_start
    assert cold is not None
    key = json.dumps([base, cold.model_dump(mode="json"), cfg.model.dtype, cfg.trainer.seed])
    return run_root / ".models" / f"cold-start-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def cold_start(cfg: ExperimentConfig, base: str, run_root: Path) -> str:
    """The exported policy of ``cfg.model.cold_start`` run on model ``base``: trained now, or found from before."""
    from toolbox.config import load_config
    from toolbox.driver.experiment import ExperimentBuilder

    run_dir = cold_start_dir(cfg, base, run_root)
    exported = run_dir / "hf"
    if (run_dir / DONE).is_file():
        log.info("model.cold_start: starting from %s (trained before)", exported)
        return str(exported)
    args = cold_start_args(cfg, base, run_dir)
    try:
        sub = load_config(args)
    except ConfigError as err:
        raise ConfigError(f"model.cold_start: {err}") from None
    log.info("model.cold_start: running experiment %s into %s", sub.experiment, run_dir)
    builder = ExperimentBuilder(sub)
    try:
        summary = builder.build_trainer().fit()
    finally:
        builder.shutdown()
    if not (exported / "config.json").is_file():
        raise ConfigError(f"model.cold_start: experiment {sub.experiment!r} exported no policy to {exported} "
                          f"(algorithm {sub.algorithm.name!r}); use one that writes RUN_DIR/hf with trainer.export")
    (run_dir / DONE).write_text(json.dumps({"experiment": sub.experiment, "args": args,
                                            "summary": summary}, indent=1, default=str))
    return str(exported)
