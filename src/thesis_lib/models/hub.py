"""Hugging Face Hub snapshots (:func:`hub_snapshot`)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import HubUnavailableError


def hub_snapshot(repo_id: str | None, files: tuple[str, ...] | None = None, *, fallback: str = "") -> Path:
    """A local snapshot of a hub repo: from the HF cache, else downloaded, else :class:`HubUnavailableError`
    saying how to use a local copy; ``fallback`` ends that message (what else the user can run)."""
    from huggingface_hub import snapshot_download

    patterns = list(files) if files else None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached: fall through to the network
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}
    reason = "HF_HUB_OFFLINE is set" if offline else ""
    if not offline:
        from huggingface_hub.errors import GatedRepoError

        try:
            return Path(snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=5))
        except GatedRepoError:
            raise HubUnavailableError(
                f"{repo_id!r} is a gated repository: its files download only for accounts that were granted access. "
                f"Ask for access on its model page (Embedl's FlashHead checkpoints: a contact form), log in with "
                f"`hf auth login`, and run again; or download it where you have access and pass the folder's path."
            ) from None
        except Exception as exc:  # noqa: BLE001 - any failure to reach the hub means the same to the user
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    raise HubUnavailableError(
        f"Cannot fetch {repo_id!r} from the Hugging Face Hub ({reason}), and it is not in the local Hugging Face cache.\n"
        f"Download it on a machine with hub access (e.g. `hf download {repo_id} --local-dir ./{repo_id.split('/')[-1]}`), "
        "copy the folder here and pass its path as the model spec" + (f", or use {fallback}." if fallback else ".")
    )
