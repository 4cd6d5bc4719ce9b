"""``python -m toolbox.bench._startup_floor RUN_DIR``: what every start of the default run does before any of
toolbox's own work, as one fresh process: a local Ray instance started as a run starts it (`start_local` with the
run's ``ray.init`` arguments) and one actor per process the run's workers take (a learner rank and a rollout
worker), each importing torch; then it records the moment both answered as its "step 1" in
RUN_DIR/metrics.jsonl, the record `toolbox bench startup` reads from a run, and shuts Ray down.

It is a floor, not a target: the run also loads its config, builds its model, engine and optimizer, joins its
process group and takes a step, and its driver imports torch."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

WORKERS = 2  # the default run's actors: a learner rank and a rollout worker


class Importer:
    """An actor whose constructor imports torch, as every worker role's does."""

    def __init__(self) -> None:
        import torch  # noqa: F401

    def ready(self) -> bool:
        return True


def main(run_dir: str) -> int:
    import ray

    from toolbox.driver.local_ray import LOCAL_DEFAULTS, shutdown, start_local

    start_local(dict(LOCAL_DEFAULTS))
    try:
        actors = [ray.remote(num_cpus=1 / WORKERS)(Importer).remote() for _ in range(WORKERS)]
        ray.get([a.ready.remote() for a in actors])
        ready = time.time()
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "metrics.jsonl").write_text(json.dumps({"event": "step_end", "time": ready}) + "\n")
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
