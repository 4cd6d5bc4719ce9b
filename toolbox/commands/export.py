"""``toolbox export RUN_DIR[/checkpoints/step_N] OUT_DIR``: a checkpoint as a Hugging Face model directory.

Either side may be a URL of a filesystem fsspec knows (``s3://bucket/runs/x``, `toolbox.core.storage`): a remote
checkpoint and its run's ``config.yaml`` are downloaded first, a remote OUT is written locally and uploaded.

Runs in this process, without Ray: ``torch.distributed.checkpoint`` reads the sharded
checkpoint, whatever number of learner ranks wrote it, into one plain copy of the base
model, which is then saved with ``save_pretrained`` beside the base model's tokenizer. The
run directory's ``config.yaml`` says which base model that is (a tiny model is rebuilt
from its config, deterministically). A run directory exports its latest checkpoint.
Only LLM policies have a Hugging Face form; a ``ppo_env`` run is refused.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from toolbox.callbacks.console import tool_main
from toolbox.core.errors import ConfigError
from toolbox.core.storage import RemoteDir, check_location, fetch_checkpoint, is_remote


@dataclass(frozen=True)
class ExportSource:
    """A checkpoint to export and the run it belongs to."""

    run_dir: Path
    checkpoint: Path


def find_source(target: str | Path) -> ExportSource:
    """A run directory (its latest ``checkpoints/step_N``) or a ``step_N`` directory inside one."""
    from toolbox.driver.preflight import find_resume

    path = Path(target).resolve()
    if (path / ".metadata").exists():
        run_dir = path.parent.parent
    elif (path / "checkpoints").is_dir():
        run_dir, path = path, Path(find_resume(str(path)))
        if not (path / ".metadata").exists():
            raise ConfigError(f"{target}: the run has no checkpoint yet (no checkpoints/step_N with .metadata)")
    else:
        raise ConfigError(f"{target}: neither a run directory (with checkpoints/) nor a checkpoint "
                          "(a checkpoints/step_N directory with .metadata)")
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{path}: no config.yaml in its run directory {run_dir}, so the base model is unknown")
    return ExportSource(run_dir, path)


def export_checkpoint(target: str | Path | ExportSource, out: str | Path) -> Path:
    """Write the policy of checkpoint ``target`` (see `find_source`) to ``out`` as a Hugging Face directory."""
    from toolbox.config import load_config
    from toolbox.driver.preflight import resolve_model_path
    from toolbox.learner.checkpoint import load_model_weights
    from toolbox.learner.hf_export import base_model, write_hf_dir

    source = target if isinstance(target, ExportSource) else find_source(target)
    cfg = load_config([f"experiment={source.run_dir / 'config.yaml'}"])
    algo = cfg.algorithm
    if algo.models().policy == "mlp":
        raise ConfigError(f"{source.run_dir}: algorithm {algo.name!r} trains an environment policy, not a "
                          "causal LM; there is no Hugging Face model to export")
    base = resolve_model_path(cfg, source.run_dir.parent)  # where the run itself resolved it (run_root)
    load = algo.models().load  # a policy that is not a plain causal LM (rm: a score head) names its loader
    model = load(base, cfg.model.dtype) if load else base_model(base, cfg.model.dtype, cfg.model.trust_remote_code)
    lora = cfg.learner.lora
    if lora is not None:  # the checkpoint holds the adapter model: load it as one, write adapter (+ merged)
        from toolbox.learner.lora import add_adapters, write_lora

        model = add_adapters(model, lora)
        load_model_weights(source.checkpoint, model)
        return write_lora(model, base, lora, out, cfg.model.trust_remote_code)
    load_model_weights(source.checkpoint, model)
    return write_hf_dir(model, base, out, cfg.model.trust_remote_code)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="toolbox export", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a run directory (its latest checkpoint) or RUN_DIR/checkpoints/step_N")
    parser.add_argument("out", help="the Hugging Face model directory to write")
    parser.add_argument("--force", action="store_true", help="overwrite a model already in OUT")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 written, 2 bad arguments, source or destination."""
    return tool_main(argv, parse_args, _export, "export", (ConfigError, FileNotFoundError, ValueError))


def _export(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="toolbox-export-") as scratch:
        remote_out = check_location("OUT", args.out) if is_remote(args.out) else ""
        out = Path(scratch) / "hf" if remote_out else Path(check_location("OUT", args.out))
        held = RemoteDir(remote_out).exists("config.json") if remote_out else (out / "config.json").exists()
        if held and not args.force:
            raise ConfigError(f"{args.out}: already holds a model (config.json); pass --force to overwrite it")
        source = find_source(fetch_run(args.source, Path(scratch) / "run") if is_remote(args.source) else args.source)
        written = export_checkpoint(source, out)
        if remote_out:
            RemoteDir(remote_out).put_tree(written, "")
            written = Path(remote_out)  # for the message only
        return f"exported {escape(str(source.checkpoint))} -> [bold]{escape(str(written))}[/]"


def fetch_run(url: str, local: Path) -> Path:
    """A run's checkpoint named by URL (the run's, or its ``step_N``'s) and its ``config.yaml``, downloaded into
    ``local`` (a run directory); returns ``local``."""
    url = check_location("SOURCE", url, writable=False)
    step = url.rstrip("/").rsplit("/", 1)[-1].startswith("step_")
    run_url = url.rstrip("/").rsplit("/", 2)[0] if step else url
    if fetch_checkpoint(url, local, field="SOURCE") is None:
        raise ConfigError(f"{url}: the run has no complete checkpoint to export")
    RemoteDir(run_url).get_file("config.yaml", local / "config.yaml")
    return local

if __name__ == "__main__":
    sys.exit(main())
