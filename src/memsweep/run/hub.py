"""Fail fast when the Hugging Face hub cannot be reached, instead of retrying for ~30 s."""
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from ..errors import ConfigError


def is_offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return True
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return False
    except OSError:
        return True


def is_cached(repo_id: str) -> bool:
    from huggingface_hub import constants

    folder = "models--" + repo_id.replace("/", "--")
    datasets_folder = "datasets--" + repo_id.replace("/", "--")
    cache = Path(constants.HF_HUB_CACHE)
    return (cache / folder).exists() or (cache / datasets_folder).exists()


def require_reachable(key: str, repo_id: str) -> None:
    """Raise a clear ConfigError when `repo_id` can come neither from the hub nor from the local cache."""
    if Path(repo_id).exists() or is_cached(repo_id) or not is_offline():
        return
    raise ConfigError(key, f"{repo_id!r} is not a local folder, not in the Hugging Face cache, and the hub "
                           "cannot be reached (offline). Use the embedded defaults (model=minilm data=tweets; for "
                           "images task=image_classification: model=vit-digits data=digits), "
                           "a local folder, or data=csv data.path=<file>")
