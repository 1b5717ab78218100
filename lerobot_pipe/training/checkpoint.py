"""The checkpoint contract: what is written, in what order, and what makes a checkpoint complete.

Layout: see :mod:`lerobot_pipe.constants`. The rules, relied on by resume, conversion and the
pipeline:

1. Saving is a collective (:class:`~lerobot_pipe.training.checkpointer.Checkpointer`, in the
   training loop or in the background). DCP shards are written by every rank; single files
   (safetensors, JSON) only by the main process. Each rank fsyncs and hashes what it wrote.
2. Everything is written into ``checkpoints/.tmp-<step>/``; ``training_state/training_step.json``
   is written last inside it (itself via a temporary file and an atomic rename), once every
   rank's files are durable; then the folder is renamed to ``checkpoints/<step>/``.
3. A checkpoint is complete iff ``<step>/training_state/training_step.json`` exists. Nothing
   else ever looks at an incomplete one; ``.tmp-*`` leftovers of a killed save are removed when
   the next run starts. training_step.json carries the size and SHA-256 of every other file of
   the checkpoint (``"files"``), so a truncated, bit-flipped or missing file is found before a
   resume uses it (:func:`verify_checkpoint_split`: each rank checks a share); automatic resume
   then falls back to the newest checkpoint that verifies.
4. ``checkpoints/last`` is a relative symlink, replaced atomically and only ever pointing at a
   complete checkpoint. Retention (:func:`prune_checkpoints`) deletes a checkpoint only after a
   newer one is complete, never the one ``last`` points to.

No pickle is ever loaded: tensors go through safetensors, everything else through JSON; the only
exception is DCP's own ``.metadata``, read only from this run's own output.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import random
import shutil
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from lerobot_pipe import constants as C
from lerobot_pipe.distributed.runtime import barrier
from lerobot_pipe.fsutil import fsync_path
from lerobot_pipe.training.faults import fault_point
from lerobot_pipe.training.manifest import file_entry, sha256_file, shares

if TYPE_CHECKING:
    from lerobot_pipe.training.state import TrainState

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used. The message names the file."""


# --------------------------------------------------------------------------- names and discovery


def step_folder_name(step: int, total_steps: int) -> str:
    return f"{step:0{max(6, len(str(total_steps)))}d}"


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / C.CHECKPOINTS_DIR


def training_step_path(step_dir: Path) -> Path:
    return step_dir / C.TRAINING_STATE_DIR / C.TRAINING_STEP


def is_complete(step_dir: Path) -> bool:
    return training_step_path(step_dir).is_file()


def read_json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"missing checkpoint file: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"corrupt checkpoint file {path}: not valid JSON ({e})") from None


def read_training_step(step_dir: Path) -> dict:
    path = training_step_path(step_dir)
    data = read_json_file(path)
    if not isinstance(data, dict) or not isinstance(data.get("step"), int):
        raise CheckpointError(f"corrupt checkpoint file {path}: no integer 'step'")
    return data


def list_complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete step folders, oldest first (by the step recorded in training_step.json)."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        if child.name.startswith(".") or child.is_symlink() or not child.is_dir():
            continue
        if not is_complete(child):
            continue
        try:
            found.append((read_training_step(child)["step"], child))
        except CheckpointError as e:
            log.warning("ignoring checkpoint %s: %s", child, e)
    return [path for _, path in sorted(found)]


def remove_stale_temporaries(output_dir: str | Path) -> list[Path]:
    """Delete ``.tmp-*`` folders left by a save that was killed (they were never complete)."""
    root = checkpoints_dir(output_dir)
    removed = []
    if root.is_dir():
        old_prefix = f"{C.TMP_CHECKPOINT_PREFIX}old-"
        for child in root.glob(f"{old_prefix}*"):
            # A complete checkpoint moved aside while a newer save of the same step replaced it;
            # the kill came before the new one was in place: put the old one back.
            original = root / child.name[len(old_prefix) :]
            if not original.exists() and is_complete(child):
                os.rename(child, original)
                log.warning(
                    "restored %s (a replacement save of the same step did not finish)", original
                )
        for child in root.iterdir():
            if child.name.startswith(C.TMP_CHECKPOINT_PREFIX):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
            elif child.is_dir() and not child.is_symlink() and not is_complete(child):
                log.warning(
                    "ignoring incomplete checkpoint folder %s (no %s)", child, C.TRAINING_STEP
                )
        for link in root.glob(".last*"):
            link.unlink(missing_ok=True)
    return removed


# --------------------------------------------------------------------------- file writing helpers


def fsync_folders(root: Path) -> None:
    """fsync every folder of a tree (its files were fsynced by whoever wrote them), so the
    creations and renames in it are durable."""
    for dirpath, _, _ in os.walk(root):
        fsync_path(Path(dirpath))


# --------------------------------------------------------------------------- state flattening


def flatten_tensors(tree: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """Nested dict of tensors/numbers -> flat {"a/b/c": tensor} (the optimizer-state layout)."""
    flat: dict[str, torch.Tensor] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_tensors(value, name + "/"))
        elif isinstance(value, torch.Tensor):
            flat[name] = value.detach().cpu().contiguous()
        else:
            flat[name] = torch.tensor(value)
    return flat


def unflatten_tensors(flat: dict[str, torch.Tensor]) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def index_optimizer_state(osd: dict) -> tuple[dict[int, Any], list[dict]]:
    """LeRobot's layout of a full optimizer state: parameters numbered in the optimizer's order
    (group after group), ``state`` keyed by that number and ``params`` listing numbers."""
    index: dict[str, int] = {}
    groups = []
    for group in osd["param_groups"]:
        numbers = [index.setdefault(fqn, len(index)) for fqn in group["params"]]
        groups.append({**group, "params": numbers})
    return {index[fqn]: value for fqn, value in osd["state"].items()}, groups


def named_optimizer_state(state: dict, saved_groups: list[dict], current: dict) -> dict:
    """The saved optimizer state keyed by parameter name, for ``set_optimizer_state_dict``.

    ``saved_groups`` list parameter numbers (LeRobot's layout) or names (the sharded layout and
    lerobot_pipe's earlier one); ``current`` is this optimizer's own state dict, whose groups
    name the parameters in order. Saved hyper-parameters (the lr a scheduler reached) win."""
    current_groups = current["param_groups"]
    names = [fqn for group in current_groups for fqn in group["params"]]
    numbered = any(isinstance(p, int) for g in saved_groups for p in g["params"])
    if numbered:
        sizes = [len(g["params"]) for g in saved_groups]
        expected = [len(g["params"]) for g in current_groups]
        if sizes != expected:
            raise CheckpointError(
                f"the checkpoint's optimizer has parameter groups of sizes {sizes}, this policy's "
                f"optimizer {expected}: it was written for another model or policy configuration"
            )
        by_number = dict(enumerate(names))
        return {
            "state": {by_number[int(k)]: v for k, v in state.items()},
            "param_groups": [
                {**saved, "params": [by_number[int(n)] for n in saved["params"]]}
                for saved in saved_groups
            ],
        }
    if [len(g["params"]) for g in saved_groups] == [len(g["params"]) for g in current_groups]:
        return {"state": state, "param_groups": saved_groups}
    # Grouping changed (lerobot_pipe before LeRobot's backbone group): keep this optimizer's
    # groups, each with the hyper-parameters of the saved group that held its first parameter.
    owner = {fqn: g for g in saved_groups for fqn in g["params"]}
    regrouped = []
    for group in current_groups:
        saved = owner.get(group["params"][0], group) if group["params"] else group
        regrouped.append({**saved, "params": group["params"]})
    log.warning("the checkpoint's optimizer parameter groups differ from this run's; regrouped")
    return {"state": state, "param_groups": regrouped}


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"missing checkpoint file: {path}")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"corrupt checkpoint file {path}: {e}") from None


# --------------------------------------------------------------------------- RNG


# LeRobot's names (utils/random_utils.py); ``py_rng_gauss`` is ours: random.gauss's cached value,
# which LeRobot drops and an exact resume needs. The main rank's state is stored under these flat
# names, which LeRobot's load_rng_state reads; rank r > 0 under ``rank<r>/<name>``, which it ignores.
_LEGACY_RNG_NAMES = {  # lerobot_pipe's names before the LeRobot layout
    "python_version": "py_rng_version",
    "python_state": "py_rng_state",
    "python_gauss": "py_rng_gauss",
    "numpy_keys": "np_rng_state_values",
    "numpy_pos": "np_rng_state_index",
    "numpy_has_gauss": "np_rng_has_gauss",
    "numpy_gauss": "np_rng_cached_gaussian",
    "torch": "torch_rng_state",
    "cuda": "torch_cuda_rng_state",
}


def capture_rng_state() -> dict[str, torch.Tensor]:
    version, mt_state, gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "py_rng_version": torch.tensor([version], dtype=torch.int64),
        "py_rng_state": torch.tensor(mt_state, dtype=torch.int64),
        "py_rng_gauss": torch.tensor(
            [float("nan") if gauss is None else gauss], dtype=torch.float64
        ),
        "np_rng_state_values": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        "np_rng_state_index": torch.tensor([np_pos], dtype=torch.int64),
        "np_rng_has_gauss": torch.tensor([np_has_gauss], dtype=torch.int64),
        "np_rng_cached_gaussian": torch.tensor([np_gauss], dtype=torch.float64),
        "torch_rng_state": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda_rng_state"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, torch.Tensor]) -> None:
    gauss = float(state["py_rng_gauss"].reshape(-1)[0]) if "py_rng_gauss" in state else None
    random.setstate(
        (
            int(state["py_rng_version"].reshape(-1)[0]),
            tuple(int(v) for v in state["py_rng_state"].tolist()),
            None if gauss is None or np.isnan(gauss) else gauss,
        )
    )
    np.random.set_state(
        (
            "MT19937",
            state["np_rng_state_values"].numpy().astype(np.uint32),
            int(state["np_rng_state_index"].reshape(-1)[0]),
            int(state["np_rng_has_gauss"].reshape(-1)[0]),
            float(state["np_rng_cached_gaussian"].reshape(-1)[0]),
        )
    )
    torch.set_rng_state(state["torch_rng_state"])
    if "torch_cuda_rng_state" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["torch_cuda_rng_state"])


def flatten_rng_states(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every rank's RNG state in one flat dict: the main rank's under LeRobot's names."""
    flat = dict(states[0])
    for rank, state in enumerate(states[1:], start=1):
        flat.update({f"rank{rank}/{k}": v for k, v in state.items()})
    return flat


def rank_rng_state(flat: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """One rank's state from :func:`flatten_rng_states` output (or the earlier per-rank layout);
    empty when the file holds none for ``rank``."""
    prefix = f"rank{rank}/"
    mine = {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
    if mine and "python_version" in mine:  # lerobot_pipe's earlier names
        return {_LEGACY_RNG_NAMES[k]: v for k, v in mine.items() if k in _LEGACY_RNG_NAMES}
    if rank == 0 and not mine:
        return {k: v for k, v in flat.items() if "/" not in k}
    return mine


# --------------------------------------------------------------------------- save helpers


def gather_full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    if not dist.is_initialized():
        return {k: v.detach().cpu() for k, v in get_model_state_dict(model).items()}
    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def gather_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    if not dist.is_initialized():
        return get_optimizer_state_dict(model, optimizer)
    return get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def scaler_state(scaler: torch.amp.GradScaler) -> dict:
    """The GradScaler's state as JSON values."""
    return {
        k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in scaler.state_dict().items()
    }


def _exchange_paths(a: Path, b: Path) -> bool:
    """Atomically swap two directory entries (Linux renameat2 RENAME_EXCHANGE); False where the
    system call or the file system does not support it."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def publish_step_folder(tmp: Path, final: Path) -> None:
    """Rename the finished temporary folder into place. A complete checkpoint already there (the
    same step saved again after resuming from an older one) is swapped out atomically, so at
    every instant one complete checkpoint of that step exists."""
    if final.exists():
        if _exchange_paths(tmp, final):
            fault_point("save:after_exchange")
            shutil.rmtree(tmp, ignore_errors=True)  # now the old copy
            fsync_path(final.parent)
            return
        # No atomic exchange here: move the old one aside; remove_stale_temporaries puts it back
        # if the process dies before the new one is in place.
        old = final.with_name(f"{C.TMP_CHECKPOINT_PREFIX}old-{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        fault_point("save:during_replace")
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_path(final.parent)


def update_last_link(ckpt_root: Path, name: str) -> None:
    link = ckpt_root / C.LAST_CHECKPOINT_LINK
    tmp_link = ckpt_root / f".{C.LAST_CHECKPOINT_LINK}.tmp"
    tmp_link.unlink(missing_ok=True)
    os.symlink(name, tmp_link)
    fault_point("save:during_last_link")
    os.replace(tmp_link, link)
    fsync_path(ckpt_root)


def prune_checkpoints(output_dir: str | Path, keep_last: int) -> list[Path]:
    """Retention (``--checkpoint_keep_last``): delete the complete checkpoints older than the
    ``keep_last`` newest (by step), never the one ``last`` points to. Called right after a save
    completed, so a checkpoint goes only once a newer one is complete. Each is first renamed to
    a temporary name (atomic: no half-deleted folder ever looks complete; a kill mid-delete
    leaves a temporary that the next start removes)."""
    if keep_last <= 0:
        return []
    root = checkpoints_dir(output_dir)
    complete = list_complete_checkpoints(output_dir)
    link = root / C.LAST_CHECKPOINT_LINK
    current = link.resolve() if link.is_symlink() else None
    removed = []
    for step_dir in complete[:-keep_last]:
        if current is not None and step_dir.resolve() == current:
            continue
        doomed = root / f"{C.DELETING_CHECKPOINT_PREFIX}{step_dir.name}"
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(step_dir, doomed)
        fsync_path(root)
        fault_point("save:during_prune")
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(step_dir)
    return removed


# --------------------------------------------------------------------------- load


def file_manifest(step_dir: Path) -> dict[str, dict]:
    """{relative path: {"size", "sha256"}} of every file in a checkpoint folder, hashed here in one
    process (a save assembles the same manifest from what each rank hashed)."""
    return {
        path.relative_to(step_dir).as_posix(): file_entry(path)
        for path in sorted(step_dir.rglob("*"))
        if path.is_file() and path.name != C.TRAINING_STEP
    }


def _file_problem(step_dir: Path, rel: str, expected: dict, converted: bool, hashes: bool):
    """What is wrong with one listed file (None: nothing). Model DCP shards may be gone once
    lerobot-convert-dcp verified them into model.safetensors."""
    path = step_dir / rel
    if not path.is_file():
        if converted and rel.startswith(f"{C.PRETRAINED_MODEL_DIR}/{C.MODEL_DCP_DIR}/"):
            return None
        return f"checkpoint file missing: {path}"
    size = path.stat().st_size
    if size != expected["size"]:
        expected_size = expected["size"]
        return (
            f"corrupt checkpoint file {path}: {size} bytes, expected {expected_size} (truncated?)"
        )
    if hashes and sha256_file(path) != expected["sha256"]:
        return f"corrupt checkpoint file {path}: SHA-256 does not match {C.TRAINING_STEP}"
    return None


def verify_checkpoint_files(
    step_dir: Path, info: dict, *, hashes: bool = True, share: Collection[str] | None = None
) -> None:
    """Check the files listed in training_step.json (only those in ``share`` when given) against
    their size and, with ``hashes``, their SHA-256."""
    pretrained = step_dir / C.PRETRAINED_MODEL_DIR
    converted = any(
        (pretrained / n).is_file() for n in (C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS)
    )
    for rel, expected in (info.get("files") or {}).items():
        if share is not None and rel not in share:
            continue
        problem = _file_problem(step_dir, rel, expected, converted, hashes)
        if problem:
            raise CheckpointError(problem)


def verify_checkpoint_split(
    step_dir: Path, info: dict, group: dist.ProcessGroup | None = None
) -> None:
    """Collective: check the SHA-256 of every file training_step.json lists, each rank a disjoint
    share (at most ``total / world size + the largest file`` of reads per rank). Every rank then
    raises the same CheckpointError if any share failed, before anything is loaded. Without a
    process group this process checks everything."""
    files = info.get("files") or {}
    if not dist.is_initialized():
        verify_checkpoint_files(step_dir, info)
        return
    world = dist.get_world_size(group)
    mine = set(shares(files, world)[dist.get_rank(group)])
    try:
        verify_checkpoint_files(step_dir, info, share=mine)
        problem = None
    except CheckpointError as e:
        problem = str(e)
    problems: list[str | None] = [None] * world
    dist.all_gather_object(problems, problem, group=group)
    first = next((p for p in problems if p), None)
    if first is not None:
        raise CheckpointError(first)


def newest_usable_checkpoint(
    output_dir: str | Path, *, hashes: bool = True
) -> tuple[Path, dict] | None:
    """The newest complete checkpoint that validates; damaged newer ones are skipped with a
    warning naming the problem (the safe choice for an automatic resume). ``hashes=False``
    checks sizes only (the trainer verifies the hashes split across its ranks)."""
    for step_dir in reversed(list_complete_checkpoints(output_dir)):
        try:
            return step_dir, validate_checkpoint_layout(step_dir, hashes=hashes)
        except CheckpointError as e:
            log.warning(
                "skipping checkpoint %s: %s; falling back to an earlier one", step_dir.name, e
            )
    return None


def validate_checkpoint_layout(step_dir: Path, *, hashes: bool = True) -> dict:
    """Check that a step folder is a complete checkpoint of this project's layout; return its
    training_step.json. Called before any process group starts; ``hashes=False`` checks the
    listed files' sizes, not their SHA-256 (see :func:`verify_checkpoint_split`)."""
    if not step_dir.exists():
        raise CheckpointError(f"checkpoint folder not found: {step_dir}")
    resolved = step_dir.resolve()
    if not resolved.is_dir():
        raise CheckpointError(f"checkpoint path is not a folder (dangling link?): {step_dir}")
    if not is_complete(resolved):
        raise CheckpointError(
            f"incomplete checkpoint {step_dir}: {training_step_path(step_dir)} is missing (the save "
            "did not finish); resume from an earlier complete checkpoint"
        )
    info = read_training_step(resolved)
    ts = resolved / C.TRAINING_STATE_DIR
    has_dcp_optim = (ts / C.OPTIMIZER_DCP_DIR).is_dir()
    has_flat_optim = (ts / C.OPTIMIZER_STATE).is_file()
    parallelism = info.get("parallelism") or {}
    upstream_sharded = (
        has_flat_optim
        and not has_dcp_optim
        and "sharded" not in info
        and int(parallelism.get("dp_shard") or 1) > 1
    )
    if upstream_sharded:
        raise CheckpointError(
            f"{resolved} looks like a LeRobot 0.6 sharded checkpoint (one aggregated "
            f"{C.OPTIMIZER_STATE}, no {C.OPTIMIZER_DCP_DIR}/, no topology fields in "
            f"{C.TRAINING_STEP}); its optimizer state cannot be resharded: start a new run from its "
            "weights with --policy.path=<its pretrained_model/>"
        )
    if not has_dcp_optim and not has_flat_optim:
        raise CheckpointError(
            f"checkpoint {resolved} has no optimizer state ({C.OPTIMIZER_STATE} or {C.OPTIMIZER_DCP_DIR}/)"
        )
    pretrained = resolved / C.PRETRAINED_MODEL_DIR
    if not any(
        (pretrained / n).exists()
        for n in (C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS, C.MODEL_DCP_DIR)
    ):
        raise CheckpointError(f"checkpoint {pretrained} holds no model weights")
    verify_checkpoint_files(resolved, info, hashes=hashes)
    for name in (C.CONFIG_NAME, C.TRAIN_CONFIG_NAME):
        if not isinstance(read_json_file(pretrained / name), dict):
            raise CheckpointError(f"corrupt checkpoint file {pretrained / name}: not a JSON object")
    return info


def load_checkpoint(step_dir: Path, state: TrainState) -> dict:
    """Restore ``state`` (model, optimizer, scheduler, scaler, this rank's RNG, the step) from a
    complete checkpoint, onto whatever topology its model is wrapped for (resharding as
    needed); return training_step.json. Collective. The caller verified the files
    (:func:`verify_checkpoint_split`)."""
    model, optimizer, scheduler = state.model, state.optimizer, state.scheduler
    scaler, model_key_map, progress = state.scaler, state.adapter_key_map, state.progress
    step_dir = step_dir.resolve()
    pretrained = step_dir / C.PRETRAINED_MODEL_DIR
    training_state = step_dir / C.TRAINING_STATE_DIR
    info = read_training_step(step_dir)
    distributed = dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    is_main = rank == 0

    # Model.
    dcp_model = pretrained / C.MODEL_DCP_DIR
    weights_file = next(
        (
            pretrained / n
            for n in (C.MODEL_SAFETENSORS, C.ADAPTER_SAFETENSORS)
            if (pretrained / n).is_file()
        ),
        None,
    )
    if weights_file is not None:
        # model.safetensors holds every tensor; adapter_model.safetensors only the adapters, whose
        # peft names model_key_map turns into this model's keys (the frozen base is already loaded).
        adapter = weights_file.name == C.ADAPTER_SAFETENSORS
        if adapter and model_key_map is None:
            raise CheckpointError(
                f"{weights_file} holds PEFT adapters: resume it with its --peft.* flags"
            )
        full = load_safetensors(weights_file) if (is_main or not distributed) else {}
        if model_key_map is not None and full:
            full = model_key_map(full)
        _set_model_full(model, full, distributed, strict=not adapter)
    elif dcp_model.is_dir():
        sd = get_model_state_dict(model)
        _dcp_load(sd, dcp_model)
        set_model_state_dict(model, sd)
    else:
        raise CheckpointError(f"checkpoint {pretrained} holds no loadable model weights")

    # Optimizer.
    dcp_optim = training_state / C.OPTIMIZER_DCP_DIR
    if dcp_optim.is_dir():
        osd = get_optimizer_state_dict(model, optimizer)
        box = {"optimizer": osd["state"]}
        _dcp_load(box, dcp_optim)
        osd["state"] = box["optimizer"]
        # Hyper-parameters as saved (the LR a scheduler had reached, ...), not as constructed.
        osd["param_groups"] = read_json_file(training_state / C.OPTIMIZER_PARAM_GROUPS)
        set_optimizer_state_dict(model, optimizer, osd)
    else:
        groups = read_json_file(training_state / C.OPTIMIZER_PARAM_GROUPS)
        current = get_optimizer_state_dict(model, optimizer)
        if is_main or not distributed:
            state = unflatten_tensors(load_safetensors(training_state / C.OPTIMIZER_STATE))
            full_osd = named_optimizer_state(state.get("state", state), groups, current)
        else:
            full_osd = {}
        _set_optimizer_full(model, optimizer, full_osd, distributed)

    if scheduler is not None:
        path = training_state / C.SCHEDULER_STATE
        if path.is_file():
            scheduler.load_state_dict(read_json_file(path))
        else:
            log.warning("checkpoint has no %s: the scheduler starts fresh", path)
    if scaler is not None and scaler.is_enabled():
        path = training_state / C.SCALER_STATE
        if path.is_file():
            scaler.load_state_dict(read_json_file(path))
        else:
            log.warning("checkpoint has no %s: the fp16 loss scale starts fresh", path)

    _restore_rank_rng(training_state / C.RNG_STATE, rank, world_size, info)
    progress.step = info["step"]
    barrier()
    return info


def _dcp_load(state: dict, path: Path) -> None:
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"missing DCP metadata: {path / '.metadata'}")
    try:
        with warnings.catch_warnings():  # a single-process load is intended, not a fallback
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
    except Exception as e:  # noqa: BLE001 - DCP wraps reader errors in many types
        raise CheckpointError(
            f"cannot load DCP checkpoint {path}: {type(e).__name__}: {e}"
        ) from None


def _set_model_full(
    model: nn.Module, full: dict[str, torch.Tensor], distributed: bool, strict: bool = True
) -> None:
    options = StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=distributed, strict=strict
    )
    try:
        set_model_state_dict(model, full, options=options)
    except (RuntimeError, KeyError) as e:
        raise CheckpointError(f"checkpoint weights do not fit this model: {e}") from None


def _set_optimizer_full(
    model: nn.Module, optimizer: torch.optim.Optimizer, osd: dict, distributed: bool
) -> None:
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)
    set_optimizer_state_dict(model, optimizer, osd, options=options)


def _restore_rank_rng(path: Path, rank: int, world_size: int, info: dict) -> bool:
    flat = load_safetensors(path)
    saved_world = info.get("world_size", info.get("num_processes", info.get("dp_world_size")))
    mine = rank_rng_state(flat, rank)
    if not mine:
        # More ranks than were saved: start from the main rank's state, then decorrelate.
        mine = rank_rng_state(flat, 0)
        if not mine:
            log.warning("%s holds no RNG state: RNG starts fresh", path)
            return False
        restore_rng_state(mine)
        torch.manual_seed(int(torch.randint(0, 2**62, (1,)).item()) + rank)
    else:
        restore_rng_state(mine)
    exact = saved_world == world_size
    # LeRobot before 0.5 records no world size: one process restores its main rank's state.
    unrecorded_single = saved_world is None and world_size == 1
    if not exact and not unrecorded_single and rank == 0:
        log.warning(
            "checkpoint was written by %s rank(s), this run has %s: each rank's RNG is seeded from "
            "a saved rank's state, so random layers (dropout, VAE sampling) will not replay exactly",
            saved_world,
            world_size,
        )
    return exact
