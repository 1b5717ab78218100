"""Offline conversion of a model DCP checkpoint (``pytorch_model_fsdp_0/``) into safetensors.

A sharded run (``--checkpoint_format=dcp`` or ``safetensors_dcp``) saves the model with
``torch.distributed.checkpoint.save(get_model_state_dict(model), checkpoint_id=...)`` into
``<step>/pretrained_model/pytorch_model_fsdp_0/``. This module merges those shards into the file a
``safetensors`` run would have written, on one CPU process with no process group:

* ``model.safetensors``: the full state dict, same keys and bit-identical tensors (the same bytes
  ``save_file`` writes for the gathered state dict);
* for a PEFT run (``adapter_config.json`` present): ``adapter_model.safetensors`` with the tensors
  ``peft.get_peft_model_state_dict`` selects, under its names.

Only public APIs of torch (2.13) and safetensors, chosen as follows:

* Reading: ``dcp.load(no_dist=True)`` through a ``FileSystemReader`` into CPU tensors allocated
  from the public ``Metadata.state_dict_metadata`` (``TensorStorageMetadata.size`` and
  ``.properties.dtype``), with ``DefaultLoadPlanner(allow_partial_load=True)`` so that a PEFT
  conversion reads the adapter entries only. Only the model DCP folder is read, never the
  optimizer's.
* Writing: ``safetensors.torch.save_file`` into a temporary file of the output folder, then
  ``os.replace``. torch's ``HuggingFaceStorageWriter`` (``dcp.save`` of the loaded tensors) does
  not fit: it names its files ``model-00001-of-00001.safetensors``, puts DCP offsets into the
  header metadata, builds each file in memory first (``safetensors.torch.save``: another 1x) and
  writes it in place, so its file is neither the one a ``safetensors`` run writes nor atomic; the
  consolidation it relies on lives in a private module and merges safetensors-format DCP, not
  ``.distcp`` shards. ``format_utils.dcp_to_torch_save`` writes a pickle.
* Memory: the state dict once (1x the weights). ``save_file`` (safetensors >= 0.8) writes straight
  from the tensors' memory; DCP's reader holds one stored chunk at a time; the read-back opens the
  file anew every few MiB (:mod:`.verify`) because the pages a ``safe_open`` handle maps stay in
  this process's RSS until it closes.
* Integrity: torch's reader loads a shard whose tensor bytes have a flipped bit without complaint
  (it does not check the CRC-32s inside the records). So the DCP folder's files are first checked
  against the size and SHA-256 that the checkpoint's ``training_state/training_step.json`` lists
  for every file (``"files"``, written by the trainer; checked with
  ``checkpoint.manifest.verify_files``), before ``.metadata`` is unpickled and before
  anything is written or deleted. Without that manifest (a ``pretrained_model/`` outside its step
  folder, a checkpoint written by another tool) a warning says so: a missing or truncated shard,
  or a damaged record structure, is still an error naming the file (torch's reader fails on it,
  and :mod:`.dcp_read` adds the name), but a flipped bit in tensor data is not found.
* PEFT names: the policy is built on the meta device from ``config.json``, wrapped by peft from
  ``adapter_config.json``, and ``get_peft_model_state_dict`` selects and names the entries
  (``policies.peft.adapter_key_map``); no naming rule of peft's is repeated here.

The output is written atomically (temporary file in the same folder, ``os.replace``): a killed
conversion never leaves a partial file under the final name. It is made durable exactly when the
shards are about to go, i.e. with ``delete_dcp``: the temporary file is fsynced, read back and
compared tensor by tensor with what the shards hold, renamed into place and its folder fsynced,
and only then is the DCP folder deleted. Without ``delete_dcp`` the shards stay the source of
truth, and a file that a power cut damaged is found and rewritten by the next run, like any file
that ``save_file`` or ``save_pretrained`` wrote. An existing output that already holds exactly the
DCP's tensors is left untouched ("already converted").

Security: DCP's ``.metadata`` file is a Python pickle, and unpickling runs code. Load DCP only from
a local folder your own run wrote. Anything that looks like a URL or a Hub repo id is refused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch.distributed.checkpoint import Metadata

from lerobot_pipe import constants as C
from lerobot_pipe.convert.dcp_read import (
    load_tensors,
    read_dcp_metadata,
    tensor_entries,
    verify_dcp_files,
)
from lerobot_pipe.convert.errors import ConversionError, one_line
from lerobot_pipe.convert.verify import verify_against_dcp
from lerobot_pipe.fsutil import TMP_MARKER, atomic_path, fsync_folder, fsync_path, writer_pid
from lerobot_pipe.utils.faults import fault_point
from lerobot_pipe.utils.locate import (
    ema_policy_dir,
    holds_policy_files,
    pretrained_dir,
)
from lerobot_pipe.utils.repo_id import looks_like_repo_id

logger = logging.getLogger(__name__)

SAFETENSORS_METADATA = {"format": "pt"}
# Files of the source folder that are never copied into --output_dir.
_NOT_COPIED = frozenset({C.MODEL_DCP_DIR, C.PUBLISH_RECEIPT})
_TMP_MARKERS = (TMP_MARKER, ".deleting-")
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


# --------------------------------------------------------------------------------------------
# Locating the checkpoint


def _local_dir(checkpoint_dir: str | os.PathLike[str]) -> Path:
    text = os.fspath(checkpoint_dir)
    if _URL_RE.match(text) or text.startswith(("hf:", "hf.co/", "huggingface.co/")):
        raise ConversionError(
            f"refusing to read a checkpoint from a URL ({text}): DCP metadata is a pickle, so only "
            "a local folder written by your own run is accepted"
        )
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConversionError(f"checkpoint_dir {path} is not a directory")
        return path
    if looks_like_repo_id(text):
        raise ConversionError(
            f"checkpoint_dir {text} does not exist locally and looks like a Hub repo id: "
            "DCP metadata is a pickle, so only a local folder written by your own run is accepted"
        )
    raise ConversionError(f"checkpoint_dir {path} does not exist")


def _pretrained_to_convert(checkpoint_dir: str | os.PathLike[str]) -> Path:
    """The pretrained-model folder of a LOCAL step folder, its ``pretrained_model/`` or its DCP
    folder (``policies.locate.pretrained_dir``); URLs and Hub ids are refused (DCP metadata is a
    pickle)."""
    pretrained = pretrained_dir(_local_dir(checkpoint_dir))
    if not holds_policy_files(pretrained):
        raise ConversionError(
            f"nothing to convert: {pretrained} has no {C.PRETRAINED_MODEL_DIR}/, {C.MODEL_DCP_DIR}/ "
            f"or {C.MODEL_SAFETENSORS}"
        )
    return pretrained


# --------------------------------------------------------------------------------------------
# PEFT: which DCP entries make up adapter_model.safetensors, and under which names


def _read_adapter_config(pretrained: Path) -> dict:
    path = pretrained / C.ADAPTER_CONFIG_NAME
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConversionError(f"cannot read {path}: {one_line(e)}") from e
    if not isinstance(config, dict):
        raise ConversionError(f"{path} is not a JSON object")
    return config


def _adapter_key_map(pretrained: Path, metadata: Metadata) -> dict[str, str]:
    """{adapter_model.safetensors name: DCP key}, as peft selects and names them for the policy
    of ``config.json`` wrapped as ``adapter_config.json`` says."""
    from lerobot_pipe.configs.policies import PreTrainedConfig
    from lerobot_pipe.policies.factory import get_policy_class
    from lerobot_pipe.policies.peft import adapter_key_map, wrap_with_adapter_config

    adapter_config = _read_adapter_config(pretrained)
    with torch.device("meta"):  # the module structure only: nothing allocated or initialized
        try:
            config = PreTrainedConfig.from_pretrained(pretrained)
            policy = get_policy_class(config)(config, pretrained_parts=False)
        except (OSError, ValueError, TypeError) as e:
            raise ConversionError(
                f"cannot build the policy of {pretrained / C.CONFIG_NAME}, which names the "
                f"adapter tensors: {one_line(e)}"
            ) from e
        try:
            key_map = adapter_key_map(wrap_with_adapter_config(policy, adapter_config))
        except Exception as e:
            raise ConversionError(
                f"cannot apply {pretrained / C.ADAPTER_CONFIG_NAME} (peft_type "
                f"{adapter_config.get('peft_type')}) to the {config.type} policy with peft: "
                f"{one_line(e)}"
            ) from e
    missing = sorted(set(key_map.values()) - set(metadata.state_dict_metadata))
    if missing:
        raise ConversionError(
            f"the DCP checkpoint in {pretrained / C.MODEL_DCP_DIR} has no entry {missing[0]} "
            f"({len(missing)} of the {len(key_map)} adapter tensors missing): its "
            f"{C.CONFIG_NAME} and {C.ADAPTER_CONFIG_NAME} do not describe the model it holds"
        )
    return key_map


# --------------------------------------------------------------------------------------------
# Writing


def _file_mode() -> int:
    """The mode a new regular file gets here (0o666 less the umask)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _remove_dead_temporaries(folder: Path, final_name: str) -> None:
    """Temporary weights files of conversions whose process is gone (killed mid-write)."""
    for tmp in folder.glob(f".{final_name}{TMP_MARKER}*"):
        pid = writer_pid(tmp)
        if pid is not None and not _pid_alive(pid):
            tmp.unlink(missing_ok=True)
            logger.info("Removed %s, left by an interrupted conversion", tmp.name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_tmp_name(name: str) -> bool:
    return name.startswith(".") and any(m in name for m in _TMP_MARKERS)


def _unshared(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with a copy for every repeat of a tensor: save_file refuses tensors that share
    memory, and one DCP entry can feed two names (peft saves a ``modules_to_save`` bias twice
    under ``bias="all"``)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state.items():
        out[name] = tensor.clone() if id(tensor) in seen else tensor
        seen.add(id(tensor))
    return out


def _write_weights(
    state: Mapping[str, torch.Tensor], final: Path, *, verify: bool, durable: bool
) -> None:
    """Write ``state`` to ``final`` atomically; read the temporary file back and compare it with
    ``state`` first if asked; ``durable``: fsync the file before the rename, the folder after."""
    try:
        with atomic_path(final, durable=durable) as tmp:
            save_file(_unshared(state), str(tmp), metadata=SAFETENSORS_METADATA)
            os.chmod(tmp, _file_mode())  # save_file creates it 0600
            if verify:
                verify_against_dcp(tmp, state)
                logger.info(
                    "Verified %s against the DCP shards (%d tensors)", final.name, len(state)
                )
            fault_point("convert:before_replace")
        fault_point("convert:after_replace")
    except (OSError, SafetensorError) as e:
        raise ConversionError(f"cannot write {final}: {one_line(e)}") from e


# --------------------------------------------------------------------------------------------
# Folder handling


def _same_file(a: Path, b: Path) -> bool:
    import filecmp

    try:
        return b.is_file() and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _copy_file(src: Path, dst: Path, durable: bool) -> bool:
    """Copy atomically unless ``dst`` already has the same bytes. Returns True when copied."""
    if _same_file(src, dst):
        if durable:
            fsync_path(dst)  # it may have been copied by a run that did not fsync
        return False
    with atomic_path(dst, durable=durable) as tmp:
        shutil.copy2(src, tmp)
    return True


def _copy_tree(src: Path, dst: Path, skip: frozenset[str], durable: bool) -> list[str]:
    copied = []
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        if entry.name in skip or _is_tmp_name(entry.name):
            continue
        target = dst / entry.name
        if entry.is_dir():
            with contextlib.suppress(ValueError, OSError):
                if dst.resolve().is_relative_to(entry.resolve()):
                    continue  # the output folder lives inside the source folder
            sub = _copy_tree(entry, target, frozenset(), durable)
            copied += [f"{entry.name}/{n}" for n in sub]
        elif entry.is_file() and _copy_file(entry, target, durable):
            copied.append(entry.name)
    if durable:
        fsync_folder(dst)
    return copied


def _prepare_output(pretrained: Path, output_dir: str | os.PathLike[str] | None) -> Path:
    if output_dir is None:
        return pretrained
    out = Path(output_dir).expanduser()
    if _URL_RE.match(os.fspath(output_dir)):
        raise ConversionError(f"output_dir must be a local folder, not {os.fspath(output_dir)}")
    try:
        if out.exists() and out.resolve() == pretrained.resolve():
            return pretrained
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConversionError(f"output_dir {out} is not writable: {one_line(e)}") from e
    return out


def _delete_dcp(dcp_dir: Path) -> None:
    """Remove the DCP folder: rename it away first (atomic), then delete the renamed folder."""
    doomed = dcp_dir.with_name(f".{dcp_dir.name}.deleting-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(dcp_dir, doomed)
        fsync_folder(dcp_dir.parent)
        fault_point("convert:during_delete")
        shutil.rmtree(doomed)
    except OSError as e:
        raise ConversionError(f"cannot delete {dcp_dir}: {one_line(e)}") from e
    logger.info("Deleted the DCP shards %s", dcp_dir)


# --------------------------------------------------------------------------------------------
# Entry point


def _read_dcp(pretrained: Path, dcp_dir: Path, is_peft: bool) -> dict[str, torch.Tensor]:
    """{output name: tensor} of the model DCP, checked against the manifest first."""
    verify_dcp_files(dcp_dir)
    metadata = read_dcp_metadata(dcp_dir)
    if is_peft:
        key_map = _adapter_key_map(pretrained, metadata)
    else:
        key_map = {k: k for k in metadata.state_dict_metadata}
    entries = tensor_entries(metadata, set(key_map.values()))
    nbytes = sum(dtype.itemsize * size.numel() for dtype, size in entries.values())
    logger.info("Loading DCP from %s (%d tensors, %.1f MB)", dcp_dir, len(key_map), nbytes / 1e6)
    loaded = load_tensors(dcp_dir, metadata, list(entries))
    return {name: loaded[key] for name, key in key_map.items()}


def convert_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    *,
    output_dir: str | os.PathLike[str] | None = None,
    delete_dcp: bool = False,
    ema_output_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Merge a step's model DCP into ``model.safetensors`` (``adapter_model.safetensors`` for PEFT),
    and, when the run kept an EMA of the weights (``pretrained_model_ema/`` beside
    ``pretrained_model/``), the EMA policy's DCP the same way: in place, or into
    ``ema_output_dir`` (default with ``output_dir``: a ``pretrained_model_ema/`` beside an
    ``output_dir`` named ``pretrained_model``, else ``<output_dir>_ema``). Returns the model's
    weights file; see :func:`convert_pretrained` for the rest."""
    pretrained = _pretrained_to_convert(checkpoint_dir)
    ema = ema_policy_dir(pretrained)
    weights = convert_pretrained(pretrained, output_dir=output_dir, delete_dcp=delete_dcp)
    if ema is not None:
        convert_pretrained(
            ema, output_dir=ema_output_folder(output_dir, ema_output_dir), delete_dcp=delete_dcp
        )
    return weights


def ema_output_folder(
    output_dir: str | os.PathLike[str] | None, ema_output_dir: str | os.PathLike[str] | None
) -> Path | None:
    """Where :func:`convert_checkpoint` writes the EMA policy (None: in place)."""
    if ema_output_dir is not None or output_dir is None:
        return None if ema_output_dir is None else Path(ema_output_dir).expanduser()
    out = Path(output_dir).expanduser()
    name = C.PRETRAINED_MODEL_EMA_DIR if out.name == C.PRETRAINED_MODEL_DIR else f"{out.name}_ema"
    return out.with_name(name)


def convert_pretrained(
    checkpoint_dir: str | os.PathLike[str],
    *,
    output_dir: str | os.PathLike[str] | None = None,
    delete_dcp: bool = False,
) -> Path:
    """Merge one pretrained-model folder's model DCP into ``model.safetensors``
    (``adapter_model.safetensors`` for PEFT).

    ``checkpoint_dir``: a LOCAL step folder or its ``pretrained_model/`` (DCP metadata is a
    pickle: never point this at downloaded files). Without ``output_dir`` the weights are written
    into that ``pretrained_model/``; with it, ``output_dir`` becomes a complete pretrained-model
    folder (every file but the DCP folder copied, plus the weights; a step saved without DCP has
    its weights file copied). The shards are checked against the checkpoint's file manifest and
    read before anything is written. ``delete_dcp`` removes the DCP folder only after the written
    file was read back and found identical to the shards, and fsynced. Idempotent. Returns the
    weights file.
    """
    t0 = time.perf_counter()
    pretrained = _pretrained_to_convert(checkpoint_dir)
    is_peft = (pretrained / C.ADAPTER_CONFIG_NAME).is_file()
    weights_name = C.ADAPTER_SAFETENSORS if is_peft else C.MODEL_SAFETENSORS
    dcp_dir = pretrained / C.MODEL_DCP_DIR
    has_dcp = dcp_dir.exists()
    if (pretrained / weights_name).is_file():
        # A deletion that was killed half-way: it only ever starts after the weights file was
        # verified and in place, so what is left of the renamed shard folder can go.
        for stale in pretrained.glob(f".{C.MODEL_DCP_DIR}.deleting-*"):
            shutil.rmtree(stale, ignore_errors=True)
            logger.info("Removed %s, left by an interrupted --delete_dcp", stale.name)
    if not has_dcp and not (pretrained / weights_name).is_file():
        raise ConversionError(
            f"nothing to convert: {pretrained} has neither {C.MODEL_DCP_DIR}/ nor {weights_name}"
        )
    # A damaged or unreadable DCP fails here, before anything is written.
    state = _read_dcp(pretrained, dcp_dir, is_peft) if has_dcp else None
    out_dir = _prepare_output(pretrained, output_dir)
    final = out_dir / weights_name
    _remove_dead_temporaries(out_dir, weights_name)

    if out_dir != pretrained:
        try:
            skip = _NOT_COPIED | {weights_name} if has_dcp else _NOT_COPIED
            copied = _copy_tree(pretrained, out_dir, frozenset(skip), durable=delete_dcp)
        except OSError as e:
            raise ConversionError(f"output_dir {out_dir} is not writable: {one_line(e)}") from e
        if copied:
            logger.info("Copied %d files into %s: %s", len(copied), out_dir, ", ".join(copied))

    if state is None:
        source = pretrained / weights_name
        if delete_dcp:
            logger.info("No DCP folder in %s: nothing to delete", pretrained)
        logger.info("No DCP folder in %s: %s is already there", pretrained, weights_name)
        return final if out_dir != pretrained else source

    if final.exists():
        try:
            verify_against_dcp(final, state)
        except ConversionError as e:
            logger.warning("Existing %s is not the converted DCP (%s); rewriting it", final, e)
        else:
            logger.info("Already converted: %s matches %s", final, dcp_dir)
            if delete_dcp:
                # An earlier run without --delete_dcp did not fsync: make it durable first.
                fsync_path(final)
                fsync_folder(final.parent)
                _delete_dcp(dcp_dir)
            return final
    _write_weights(state, final, verify=delete_dcp, durable=delete_dcp)
    logger.info(
        "Wrote %s (%.1f MB) in %.2f s", final, final.stat().st_size / 1e6, time.perf_counter() - t0
    )
    if delete_dcp:
        _delete_dcp(dcp_dir)  # _write_weights verified the file against the shards (or raised)
    return final
