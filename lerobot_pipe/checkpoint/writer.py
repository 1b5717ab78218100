"""One save of a :class:`~lerobot_pipe.checkpoint.stateful.TrainState` under ``checkpoints/``, in
the training loop or in the background, with the same bytes either way (what
:class:`~lerobot_pipe.checkpoint.manager.CheckpointManager` calls).

A save has two halves:

* **snapshot** (in the loop, collective on the training process group): the local model and
  optimizer state dicts (each rank's shards when sharded; unsharded, the optimizer state is
  whole on every rank already), the full model for ``model.safetensors`` (a gather on the
  training group; not in sharded async saves, see below), this rank's RNG state and the small
  JSON values. With ``--checkpoint_async=true`` every tensor the loop would go on to change is
  copied to CPU memory here (pinned on CUDA; allocated by DCP's ``DefaultStager`` at the first
  save, then refilled in place; allocated again when the state's layout changed): this copy is
  the loop's only stall. A sharded async save stages this rank's model shards instead of
  gathering the full model in the loop.
* **persist** (a background thread with async saves, else inline): each rank writes its DCP
  shards, the RNG states are gathered, a sharded async save assembles the full model on the
  main rank from the staged shards
  (:func:`~lerobot_pipe.checkpoint.gather.gather_full_tensors`), the main rank writes
  its files; each rank fsyncs and hashes what it wrote (:class:`HashingFileSystemWriter`);
  the hashes are gathered to the main rank, which writes training_step.json, renames the folder
  into place, moves ``last`` and applies retention; then every rank learns the outcome. The
  collectives of this half run on a gloo process group of their own: CPU collectives on CPU
  copies (next to nccl on GPU), never interleaved with the loop's. The bytes written are the
  same either way.

With ``--ema.enable=true`` the EMA policy (:class:`~.stateful.EMAShadow`: the model's state
with the shadow in place of the trained parameters) goes the same two ways into
``pretrained_model_ema/``: gathered for its ``model.safetensors`` (in the loop, or from staged
shards in the background), saved as DCP shards by every rank, its folder written by the same
``pretrained`` writer; its update count into ``training_state/ema_state.json``.

At most one save is in flight: the next save, the end of training (:meth:`CheckpointWriter.close`)
and a clean shutdown after an error (:meth:`CheckpointWriter.shutdown`) wait for it. A killed
trainer's save in flight leaves only its ``.tmp-<step>/``, which the next start removes.

Why not ``dcp.async_save``: one checkpoint of this layout is up to three DCP folders plus the main
rank's files plus a manifest collective and the publication, which must follow all of them in
one order on every rank; ``async_save`` runs each DCP save in its own executor thread with its
own collectives and returns a future per folder, with no place for the hashing and publication.
So the background thread here calls DCP's public ``dcp.save`` with a ``StorageWriter``
subclass, and staging uses the ``DefaultStager`` that ``async_save`` itself uses.
"""

from __future__ import annotations

import copy
import logging
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint import FileSystemWriter, Metadata
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.tensor import DTensor
from torch.futures import Future as TorchFuture

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint.gather import gather_full_tensors
from lerobot_pipe.checkpoint.layout import (
    CheckpointError,
    checkpoints_dir,
    fsync_folders,
    prune_checkpoints,
    publish_step_folder,
    step_folder_name,
    update_last_link,
)
from lerobot_pipe.checkpoint.lerobot_state import (
    as_torch_defaults,
    flatten_rng_states,
    flatten_tensors,
    index_optimizer_state,
    scaler_state,
)
from lerobot_pipe.checkpoint.manifest import file_entry, ordered
from lerobot_pipe.checkpoint.stateful import PretrainedWriter, TrainState
from lerobot_pipe.configs.checkpoint_format import CheckpointFormat
from lerobot_pipe.distributed.runtime import barrier, broadcast_from_main, gather_objects
from lerobot_pipe.fsutil import fsync_path, write_json_atomic
from lerobot_pipe.utils.faults import fault_point, saving_step

log = logging.getLogger(__name__)


class CheckpointSaveError(RuntimeError):
    """A save that failed on some rank (a full disk, a lost peer); nothing of it became visible."""


@dataclass
class _Snapshot:
    """One save's state, taken in the loop; the main rank's parts are None elsewhere."""

    step: int
    tmp: Path
    final: Path
    record: dict
    model_local: dict | None = None  # this rank's state dict (its shards when sharded)
    optimizer_dcp: dict | None = None
    full_model: dict[str, torch.Tensor] | None = None
    optimizer_flat: dict[str, torch.Tensor] | None = None
    param_groups: list | None = None
    rng: dict[str, torch.Tensor] | None = None  # this rank's generators
    scheduler: dict | None = None
    scaler: dict | None = None
    # --ema.enable=true: the EMA policy's state, whole on the main rank (pretrained_model_ema's
    # weights file) and this rank's part (its DCP shards, or gathered in the background).
    ema_full: dict[str, torch.Tensor] | None = None
    ema_local: dict | None = None
    ema_counters: dict | None = None
    stream: dict | None = None  # --dataset.streaming=true: the stream's position (JSON)


class CheckpointWriter:
    """Writes complete checkpoints of one run (the contract of :mod:`lerobot_pipe.checkpoint`).
    Every rank builds one (collective: it creates the save's process group) and calls
    :meth:`save` at the same steps.

    ``run_info`` is training_step.json without the manifest; its ``step`` and
    ``samples_consumed`` are replaced by the state's progress at each save.
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        total_steps: int,
        checkpoint_format: CheckpointFormat | str,
        sharded: bool,
        run_info: dict,
        async_save: bool = False,
        keep_last: int = 0,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.root = checkpoints_dir(output_dir)
        self.total_steps = total_steps
        checkpoint_format = CheckpointFormat(checkpoint_format)
        # A run that is not sharded writes model.safetensors whatever the format says: every rank
        # holds every tensor, and one file resumes on any topology and loads in LeRobot's tools.
        # The format (kept in the run's config) decides the rest.
        self.write_safetensors = not sharded or checkpoint_format.writes_safetensors
        self.write_dcp = checkpoint_format.writes_dcp
        self.sharded = sharded
        self.run_info = run_info
        self.keep_last = keep_last
        self.distributed = dist.is_initialized()
        self.is_main = not self.distributed or dist.get_rank() == 0
        self.group = dist.new_group(backend="gloo") if self.distributed else None
        # model.safetensors of a sharded async save: gathered in the background from the staged
        # shards, so the loop runs no collective of the size of the model.
        self.gather_in_background = (
            async_save and sharded and self.distributed and self.write_safetensors
        )
        self._staging: StagingOptions | None = None
        self._worker: ThreadPoolExecutor | None = None
        if async_save:
            cuda = torch.cuda.is_available()
            self._staging = StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=False,
                use_async_staging=False,  # the loop may change the state once save returns
                use_non_blocking_copy=cuda,
            )
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._staged: dict[tuple, torch.Tensor] | None = None  # reused from save to save
        self._pending: Future | None = None
        self.last_saved: Path | None = None
        self.staged_bytes = 0  # bytes this rank copied for the last async save
        self.last_duration_s = 0.0  # the last save, from save() until complete on every rank

    # ------------------------------------------------------------------ the loop's side

    def save(self, state: TrainState) -> None:
        """Collective: checkpoint ``state`` at ``state.progress.step``. Synchronous saves return
        when the checkpoint is complete; async ones once the state is staged (the previous save,
        if still in flight, is waited for first)."""
        self.wait()
        start = time.perf_counter()
        snapshot = self._snapshot(state)
        if self._worker is None:
            self.last_saved = self._persist(snapshot, state.pretrained, start)
            return
        if self.is_main:
            log.info(
                "Checkpoint %s staged in %.2fs (%.1f MB on this rank); writing in the background",
                snapshot.final.name,
                time.perf_counter() - start,
                self.staged_bytes / 1e6,
            )
        self._pending = self._worker.submit(self._persist, snapshot, state.pretrained, start)

    def wait(self) -> Path | None:
        """Block until the save in flight is complete on every rank (re-raising its failure);
        return the newest checkpoint this run completed."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.last_saved = pending.result()
        return self.last_saved

    def close(self) -> Path | None:
        """The end of training: wait for the last save, release the background thread."""
        try:
            return self.wait()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Release the background thread, after the save in flight finished (a clean shutdown
        keeps it); its failure is logged, not raised: an error is already on its way."""
        if self._pending is not None:
            try:
                self.wait()
            except Exception as e:  # noqa: BLE001 - reported, the original error propagates
                log.warning("the checkpoint save in flight failed too: %s", e)
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        self._staged = None

    # ------------------------------------------------------------------ snapshot (in the loop)

    def _snapshot(self, state: TrainState) -> _Snapshot:
        step = state.progress.step
        name = step_folder_name(step, self.total_steps)
        tmp = self.root / f"{C.TMP_CHECKPOINT_PREFIX}{name}"
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / C.PRETRAINED_MODEL_DIR).mkdir(parents=True)
            (tmp / C.TRAINING_STATE_DIR).mkdir()
            if state.ema is not None:
                (tmp / C.PRETRAINED_MODEL_EMA_DIR).mkdir()
        barrier()
        fault_point("save:begin")
        record = {**self.run_info, "step": step, **state.progress.state_dict()}
        snap = _Snapshot(step=step, tmp=tmp, final=self.root / name, record=record)
        if self.write_safetensors and not self.gather_in_background:
            full = state.model.full_state_dict()  # collective; empty on ranks other than 0
            snap.full_model = full if self.is_main else None
        if self.write_dcp or self.gather_in_background:
            snap.model_local = state.model.state_dict()
        if state.ema is not None:
            self._snapshot_ema(snap, state)
        if self.sharded:
            osd = state.optimizer.state_dict()
            snap.optimizer_dcp = {"optimizer": osd["state"]}
            param_groups = osd["param_groups"]
        else:
            osd = state.optimizer.full_state_dict()  # empty on ranks other than 0
            param_groups = None
            if self.is_main:
                numbered, param_groups = index_optimizer_state(osd)
                snap.optimizer_flat = flatten_tensors({"state": numbered})
        del osd
        snap.rng = state.rng.state_dict()  # this rank's; gathered by the writer
        if state.stream is not None and self.is_main:
            snap.stream = copy.deepcopy(state.stream.state_dict())
        if self.is_main:
            snap.param_groups = as_torch_defaults(copy.deepcopy(param_groups))
            if state.scheduler is not None:
                snap.scheduler = copy.deepcopy(state.scheduler.state_dict())
            if state.saves_scaler:
                snap.scaler = scaler_state(state.scaler)
        if self._staging is not None:
            self._stage(snap, state)
        fault_point("save:staged")
        return snap

    def _snapshot_ema(self, snap: _Snapshot, state: TrainState) -> None:
        """The EMA policy: the model's state with the shadow in place of the trained weights."""
        assert state.ema is not None
        if self.write_safetensors and not self.gather_in_background:
            shadow = state.ema.full_shadow()  # collective; None on ranks other than 0
            if self.is_main:
                snap.ema_full = state.ema.weights(snap.full_model, shadow)
        if self.write_dcp or self.gather_in_background:
            snap.ema_local = state.ema.weights(snap.model_local)
        snap.ema_counters = state.ema.counters()

    def _stage(self, snap: _Snapshot, state: TrainState) -> None:
        """Copy to CPU memory what the background writer must not read live: every tensor on an
        accelerator, and every CPU tensor whose storage the loop writes into (trainable
        parameters, buffers, optimizer state, the EMA shadow: the DCP state dicts are views of
        them, and so is a gather on one CPU process). Fresh CPU tensors (a gather's output
        elsewhere) and frozen parameters are a snapshot already and are not copied again."""
        assert self._staging is not None
        live = _live_storages(state)
        trees = {
            attr: getattr(snap, attr)
            for attr in (
                "model_local",
                "optimizer_dcp",
                "full_model",
                "optimizer_flat",
                "ema_local",
                "ema_full",
            )
            if getattr(snap, attr) is not None
        }
        wanted = _tensor_paths(trees, lambda t: not t.is_cpu or _storage(t) in live)
        staged = self._staged
        if staged is not None and _same_layout(staged, wanted):
            # The previous save's copies (finished: at most one save in flight) take the new
            # values: a plain copy per tensor instead of rebuilding every (D)Tensor wrapper.
            cuda = torch.cuda.is_available()
            for path, tensor in wanted.items():
                _local(staged[path]).copy_(_local(tensor), non_blocking=cuda)
            if cuda:
                torch.cuda.synchronize()
        else:  # first save, or a new layout: allocate (pinned on CUDA)
            staged = self._staged = _allocate_copies(wanted, self._staging)
        # New dicts along the way: the state dicts hold the optimizer's own per-parameter dicts.
        for attr, tree in _with(trees, staged).items():
            setattr(snap, attr, tree)
        self.staged_bytes = sum(_tensor_bytes(t) for t in staged.values())

    # ------------------------------------------------------------------ persist (background)

    def _persist(self, snap: _Snapshot, pretrained: PretrainedWriter, start: float) -> Path:
        """Every rank: write, fsync and hash this rank's files; the main rank assembles the
        manifest and publishes; every rank returns the outcome. Runs on ``self.group`` only."""
        with saving_step(snap.step):
            problem = None
            files: dict[str, dict] = {}
            try:
                fault_point("save:persist_begin")
                files = self._write(snap, pretrained)
                fault_point("save:after_hash")
            except Exception as e:  # noqa: BLE001 - every rank must reach the gather below
                log.exception("checkpoint %s: writing failed", snap.final.name)
                problem = f"{type(e).__name__}: {e}"
            parts = gather_objects((files, problem), group=self.group)
            outcome = None
            if self.is_main:
                outcome = next(
                    (f"rank {r}: {p}" for r, (_, p) in enumerate(parts) if p is not None), None
                )
                if outcome is None:
                    try:
                        self._publish(snap, {k: v for f, _ in parts for k, v in f.items()})
                    except Exception as e:  # noqa: BLE001 - reported to every rank
                        log.exception("checkpoint %s: publishing failed", snap.final.name)
                        outcome = f"rank 0: {type(e).__name__}: {e}"
            outcome = broadcast_from_main(outcome, self.group)
        if outcome is not None:
            raise CheckpointSaveError(
                f"saving checkpoint {snap.final.name} failed ({outcome}); the earlier "
                f"checkpoints are intact and {snap.tmp.name}/ is removed at the next start"
            )
        self.last_duration_s = time.perf_counter() - start
        if self.is_main:
            log.info("Saved checkpoint %s (%.2fs)", snap.final, self.last_duration_s)
        return snap.final

    def _write(self, snap: _Snapshot, pretrained: PretrainedWriter) -> dict[str, dict]:
        """This rank's files of the checkpoint, written, fsynced and hashed. The collectives
        first (DCP's, the RNG and model gathers): they then run on every rank whatever fails
        later on the main rank alone (a DCP failure fails every rank)."""
        model_dir = snap.tmp / C.PRETRAINED_MODEL_DIR
        ema_dir = snap.tmp / C.PRETRAINED_MODEL_EMA_DIR
        state_dir = snap.tmp / C.TRAINING_STATE_DIR
        files: dict[str, dict] = {}
        if self.write_dcp:
            files.update(self._dcp_save(snap.model_local, model_dir / C.MODEL_DCP_DIR, snap.tmp))
            fault_point("save:after_model_dcp")
            if snap.ema_local is not None:
                files.update(self._dcp_save(snap.ema_local, ema_dir / C.MODEL_DCP_DIR, snap.tmp))
        if snap.optimizer_dcp is not None:
            files.update(
                self._dcp_save(snap.optimizer_dcp, state_dir / C.OPTIMIZER_DCP_DIR, snap.tmp)
            )
            snap.optimizer_dcp = None
        rng_states = gather_objects(snap.rng, group=self.group)
        if self.gather_in_background:
            snap.full_model = gather_full_tensors(snap.model_local, self.group)
            if snap.ema_local is not None:
                snap.ema_full = gather_full_tensors(snap.ema_local, self.group)
            fault_point("save:after_model_gather")
        snap.model_local = snap.ema_local = None
        if self.is_main:
            pretrained(model_dir, snap.full_model)
            snap.full_model = None
            if snap.ema_counters is not None:
                pretrained(ema_dir, snap.ema_full)
                snap.ema_full = None
        fault_point("save:after_pretrained")
        if snap.optimizer_flat is not None:
            save_file(snap.optimizer_flat, state_dir / C.OPTIMIZER_STATE)
            snap.optimizer_flat = None
        fault_point("save:after_optimizer")
        if not self.is_main:
            return files
        write_json_atomic(state_dir / C.OPTIMIZER_PARAM_GROUPS, snap.param_groups)
        fault_point("save:after_param_groups")
        save_file(flatten_rng_states(rng_states), state_dir / C.RNG_STATE)
        fault_point("save:after_rng")
        if snap.scheduler is not None:
            write_json_atomic(state_dir / C.SCHEDULER_STATE, snap.scheduler)
            fault_point("save:after_scheduler")
        if snap.scaler is not None:
            write_json_atomic(state_dir / C.SCALER_STATE, snap.scaler)
            fault_point("save:after_scaler")
        if snap.ema_counters is not None:
            write_json_atomic(state_dir / C.EMA_STATE, snap.ema_counters)
        if snap.stream is not None:
            write_json_atomic(state_dir / C.STREAM_STATE, snap.stream)
        for folder in (model_dir, ema_dir, state_dir):
            if not folder.is_dir():
                continue
            for path in sorted(p for p in folder.iterdir() if p.is_file()):
                fsync_path(path)
                files[path.relative_to(snap.tmp).as_posix()] = file_entry(path)
        return files

    def _dcp_save(self, state_dict: dict, folder: Path, root: Path) -> dict[str, dict]:
        writer = HashingFileSystemWriter(folder, root)
        with warnings.catch_warnings():  # a single-process save is intended, not a fallback
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(
                state_dict,
                storage_writer=writer,
                process_group=self.group,
                no_dist=not self.distributed,
            )
        return writer.files

    def _publish(self, snap: _Snapshot, files: dict[str, dict]) -> None:
        """Main rank, once every rank's files are durable: training_step.json with the manifest,
        the atomic rename, ``last``, retention."""
        on_disk = {p.relative_to(snap.tmp).as_posix() for p in snap.tmp.rglob("*") if p.is_file()}
        if on_disk != set(files):
            raise CheckpointError(
                f"{snap.tmp} holds files no rank hashed ({sorted(on_disk - set(files))}) or "
                f"misses hashed ones ({sorted(set(files) - on_disk)})"
            )
        fsync_folders(snap.tmp)
        fault_point("save:before_training_step")
        state_dir = snap.tmp / C.TRAINING_STATE_DIR
        write_json_atomic(state_dir / C.TRAINING_STEP, {**snap.record, "files": ordered(files)})
        fault_point("save:before_rename")
        publish_step_folder(snap.tmp, snap.final)
        fault_point("save:before_last_link")
        update_last_link(self.root, snap.final.name)
        fault_point("save:end")
        for removed in prune_checkpoints(self.output_dir, self.keep_last):
            log.info(
                "Removed checkpoint %s (--checkpoint_keep_last=%d)", removed.name, self.keep_last
            )


def _allocate_copies(
    tensors: dict[tuple, torch.Tensor], options: StagingOptions
) -> dict[tuple, torch.Tensor]:
    """CPU copies of ``tensors`` (pinned memory on CUDA) from one ``DefaultStager.stage`` call,
    which keeps storage shared between tensors shared in the copies.

    A stager per call, on every torch: torch 2.11 and 2.12's stager empties its copy dispatch
    table at the end of each ``stage`` call (pytorch #183413, fixed in 2.13), so a second call on
    the same stager fails with ``KeyError: <class 'type'>``. Nothing is lost by a new one: the
    writer keeps the copies itself and refills them in place (:meth:`CheckpointWriter._stage`),
    the stager's storage cache would only be reused on a layout change, and closing the stager
    leaves the copies' pinned memory pinned until the copies themselves are freed."""
    stager = DefaultStager(options)
    try:
        return stager.stage(tensors)
    finally:
        stager.close()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _storage(t: torch.Tensor) -> int:
    return _local(t).untyped_storage().data_ptr()


def _live_storages(state: TrainState) -> set[int]:
    """The storages the training loop writes into."""
    model, optimizer = state.model.module, state.optimizer.optimizer
    tensors = [p for p in model.parameters() if p.requires_grad] + list(model.buffers())
    tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    if state.ema is not None:
        tensors += list(state.ema.shadow.values())
    return {_storage(t) for t in tensors}


def _tensor_paths(
    tree: dict, wanted: Callable[[torch.Tensor], bool], prefix: tuple = ()
) -> dict[tuple, torch.Tensor]:
    """{key path: tensor} of every tensor in nested dicts that ``wanted`` selects."""
    found = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            found.update(_tensor_paths(value, wanted, (*prefix, key)))
        elif torch.is_tensor(value) and wanted(value):
            found[(*prefix, key)] = value
    return found


def _same_layout(staged: dict[tuple, torch.Tensor], tensors: dict[tuple, torch.Tensor]) -> bool:
    """Whether ``staged`` (copies of an earlier save's tensors) can take ``tensors``' values."""
    if staged.keys() != tensors.keys():
        return False
    for path, tensor in tensors.items():
        old = staged[path]
        if type(old) is not type(tensor) or old.dtype != tensor.dtype:
            return False
        if isinstance(tensor, DTensor) and (
            old.shape != tensor.shape
            or old.placements != tensor.placements
            or old.device_mesh != tensor.device_mesh
        ):
            return False
        if _local(old).shape != _local(tensor).shape:
            return False
    return True


def _with(tree: dict, replacements: dict[tuple, Any], prefix: tuple = ()) -> dict:
    """A copy of nested dicts (the dicts only) with the values at ``replacements``' paths."""
    return {
        key: _with(value, replacements, (*prefix, key))
        if isinstance(value, dict)
        else replacements.get((*prefix, key), value)
        for key, value in tree.items()
    }


def _tensor_bytes(t: torch.Tensor) -> int:
    local = _local(t)
    return local.numel() * local.element_size()


class HashingFileSystemWriter(FileSystemWriter):
    """DCP's file-system writer (same files, same bytes, fsynced) that also records the size and
    SHA-256 of each file this rank writes, read back right after DCP wrote it.

    ``files`` maps each file's path relative to ``root`` (the checkpoint's step folder) to its
    entry; the coordinator's entry for the DCP metadata file is added in :meth:`finish`. The
    metadata's save id is derived from the folder path instead of a random UUID, so the same
    state saved twice (synchronously or in the background) gives the same bytes.
    """

    def __init__(self, path: Path, root: Path) -> None:
        super().__init__(path)
        self._folder = Path(path)
        self._root = Path(root)
        self.files: dict[str, dict] = {}

    def storage_meta(self) -> StorageMeta:
        save_id = str(uuid.uuid5(uuid.NAMESPACE_URL, self._folder.as_posix()))
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=save_id)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> TorchFuture[list[WriteResult]]:
        written = super().write_data(plan, planner)
        names = {r.storage_data.relative_path for r in written.wait()}
        # DCP also creates a file per writer thread with nothing to write (a rank whose plan is
        # empty, e.g. an optimizer without tensor state): this rank's files all carry its prefix.
        prefix = getattr(plan.storage_data, "prefix", None)
        if prefix:
            names.update(p.name for p in self._folder.glob(f"{prefix}*") if p.is_file())
        self._record(names)
        return written

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)
        self._record([C.DCP_METADATA_FILE])

    def _record(self, names: Iterable[str]) -> None:
        for name in sorted(set(names)):
            path = self._folder / name
            self.files[path.relative_to(self._root).as_posix()] = file_entry(path)
