"""Where a pretrained policy or a checkpoint lives: a local folder, or a Hub repository.

One resolver for everything that accepts "a policy": a pretrained_model/ folder, the checkpoint
step folder around it (or its ``last`` link), or a Hub repo id (downloaded through
huggingface_hub into its cache, only the files a policy folder holds).
"""

from __future__ import annotations

import re
from pathlib import Path

from lerobot_pipe import constants as C
from lerobot_pipe.utils.repo_id import looks_like_repo_id

POLICY_FILE_PATTERNS = ["*.json", "*.safetensors", "*.md", "*.yaml"]
_STEP_FOLDER = re.compile(r"^checkpoints/(\d+)/")


# What a pretrained-model folder holds (any one of them): config, weights, adapter, DCP shards.
POLICY_FOLDER_MARKERS = (
    C.CONFIG_NAME,
    C.MODEL_SAFETENSORS,
    C.ADAPTER_SAFETENSORS,
    C.ADAPTER_CONFIG_NAME,
    C.MODEL_DCP_DIR,
)


def pretrained_dir(path: str | Path) -> Path:
    """The pretrained-model folder ``path`` names: the ``pretrained_model/`` of a checkpoint step
    folder (or of its ``last`` link), the folder around a file or the DCP folder inside it (such
    as train_config.json or pytorch_model_fsdp_0/), else ``path`` itself. The one resolver of
    everything that takes "a step folder or its pretrained_model/"."""
    path = Path(path)
    if path.is_file() or (path.name == C.MODEL_DCP_DIR and path.is_dir()):
        path = path.parent
    if (path / C.PRETRAINED_MODEL_DIR).is_dir():
        return path / C.PRETRAINED_MODEL_DIR
    return path


def holds_policy_files(folder: Path) -> bool:
    """Whether ``folder`` holds any of a pretrained-model folder's files."""
    return any((folder / name).exists() for name in POLICY_FOLDER_MARKERS)


def checkpoint_step_dir(pretrained: Path) -> Path | None:
    """The checkpoint step folder a pretrained-model folder (``pretrained_model/``, or the EMA
    policy's ``pretrained_model_ema/``) sits in, or None (a folder of its own, such as a
    conversion's output)."""
    in_step = pretrained.name in (C.PRETRAINED_MODEL_DIR, C.PRETRAINED_MODEL_EMA_DIR)
    return pretrained.parent if in_step else None


def ema_policy_dir(pretrained: Path) -> Path | None:
    """The EMA policy folder beside a ``pretrained_model/`` (a checkpoint's, or a conversion's
    output laid out alike: ``pretrained_model_ema/``), or None when there is none."""
    if pretrained.name != C.PRETRAINED_MODEL_DIR:
        return None
    ema = pretrained.parent / C.PRETRAINED_MODEL_EMA_DIR
    return ema if ema.is_dir() else None


def local_policy_folder(
    path: str, revision: str | None = None, required_file: str = C.CONFIG_NAME
) -> Path:
    """A local folder holding ``required_file`` (the policy's config.json by default),
    downloading ``path`` from the Hub when it is a repo id and no such local folder exists."""
    local = pretrained_dir(path)
    if local.is_dir():
        if not (local / required_file).is_file():
            raise FileNotFoundError(f"no {required_file} in {local}")
        return local
    if not looks_like_repo_id(path):
        raise FileNotFoundError(f"{path}: no such folder, and not a Hub repo id (namespace/name)")
    from huggingface_hub import snapshot_download

    from lerobot_pipe.utils.hub_http import redact, with_retries

    try:
        folder = with_retries(
            lambda: snapshot_download(
                path, repo_type="model", revision=revision, allow_patterns=POLICY_FILE_PATTERNS
            ),
            what=f"downloading policy {path}",
        )
    except Exception as e:  # noqa: BLE001 - any network or Hub error, reworded below
        raise FileNotFoundError(
            f"not a local folder, and downloading Hub repo {path!r} (revision={revision!r}) "
            f"failed: {type(e).__name__}: {redact(str(e))}"
        ) from None
    if not (Path(folder) / required_file).is_file():
        raise FileNotFoundError(f"Hub repo {path!r} holds no {required_file} at its root")
    return Path(folder)


def download_latest_checkpoint(repo_id: str, output_dir: Path) -> Path:
    """Download the newest ``checkpoints/<step>/`` of a Hub training repository (LeRobot's
    ``--save_checkpoint_to_hub`` layout) into ``output_dir/checkpoints/<step>/``; returns it."""
    from huggingface_hub import HfApi, snapshot_download

    from lerobot_pipe.utils.hub_http import redact, with_retries

    try:
        files = with_retries(
            lambda: HfApi().list_repo_files(repo_id, repo_type="model"),
            what=f"listing {repo_id}",
        )
    except Exception as e:  # noqa: BLE001 - any network or Hub error, reworded below
        raise FileNotFoundError(
            f"listing Hub repo {repo_id!r} failed: {type(e).__name__}: {redact(str(e))}"
        ) from None
    steps = sorted(
        {m.group(1) for f in files if (m := _STEP_FOLDER.match(f))},
        key=int,
    )
    complete = [
        s
        for s in steps
        if f"{C.CHECKPOINTS_DIR}/{s}/{C.TRAINING_STATE_DIR}/{C.TRAINING_STEP}" in files
    ]
    if not complete:
        raise FileNotFoundError(
            f"Hub repo {repo_id!r} holds no checkpoints/<step>/ with a "
            f"{C.TRAINING_STATE_DIR}/{C.TRAINING_STEP} (was it pushed with its training state?)"
        )
    step = complete[-1]
    with_retries(
        lambda: snapshot_download(
            repo_id,
            repo_type="model",
            allow_patterns=[f"{C.CHECKPOINTS_DIR}/{step}/*"],
            local_dir=str(output_dir),
        ),
        what=f"downloading checkpoint {step} of {repo_id}",
    )
    return output_dir / C.CHECKPOINTS_DIR / step
