"""What the training loop calls, in the shape torchtitan's CheckpointManager made familiar:
:meth:`CheckpointManager.verify` and :meth:`CheckpointManager.load` once at start-up,
:meth:`CheckpointManager.save` after every step (it decides whether the step saves: the
interval, the last step), :meth:`CheckpointManager.close` at the end. Async saves, retention and
the batch-norm broadcast before each save happen inside.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lerobot_pipe.checkpoint import resume
from lerobot_pipe.checkpoint.layout import remove_stale_temporaries
from lerobot_pipe.checkpoint.loader import load_train_state
from lerobot_pipe.checkpoint.resume import ResumePoint
from lerobot_pipe.checkpoint.stateful import TrainState
from lerobot_pipe.checkpoint.writer import CheckpointWriter
from lerobot_pipe.distributed.batch_norm import broadcast_batch_norm_stats

log = logging.getLogger(__name__)


class CheckpointManager:
    """Checkpoints of one run in ``output_dir``. Collective to build (the writer's process
    group). ``save_freq`` 0 saves only the last step; ``enabled=False`` never saves.
    ``run_info`` is training_step.json's record of this run (topology, batch; the step and the
    data position are filled in at each save)."""

    def __init__(
        self,
        output_dir: str | Path,
        *,
        save_freq: int,
        enabled: bool,
        run_info: dict,
        is_main: bool = True,
        **writer_options: Any,
    ) -> None:
        """``writer_options``: :class:`~.writer.CheckpointWriter`'s (``total_steps``,
        ``checkpoint_format``, ``sharded``, ``async_save``, ``keep_last``)."""
        self.output_dir = Path(output_dir)
        self.save_freq = save_freq
        self.enabled = enabled
        self.run_info = run_info
        self.is_main = is_main
        self.writer = CheckpointWriter(output_dir, run_info=run_info, **writer_options)
        self.state: TrainState | None = None

    def verify(self, point: ResumePoint | None, policy_type: str) -> ResumePoint | None:
        """Collective, before anything is built or written: the checkpoint to resume from with
        every file verified (each rank hashing a share; an automatic resume falls back to an
        older one), or None for a fresh run. Then the leftovers of killed saves go."""
        if point is not None:
            point = resume.verify(point, self.output_dir, self.writer.group, policy_type)
        if self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            for path in remove_stale_temporaries(self.output_dir):
                log.info("removed unfinished checkpoint write %s", path)
        return point

    def load(self, states: Mapping[str, Any], point: ResumePoint | None) -> TrainState:
        """Collective: the parts this manager saves from now on (``states``, torchtitan's shape:
        a name -> a ``Stateful`` part, the names of :data:`~.stateful.STATES`), restored from
        ``point`` (as :meth:`verify` returned it) when resuming; the typed record of them."""
        self.state = state = TrainState.from_states(states)
        if point is not None:
            load_train_state(point, state, self.run_info)
        return state

    def due(self, step: int, last_step: bool) -> bool:
        return self.enabled and (last_step or (self.save_freq > 0 and step % self.save_freq == 0))

    @property
    def last_saved(self) -> Path | None:
        """The newest checkpoint this run made durable (with async saves, not always the newest
        one saved)."""
        return self.writer.last_saved

    def save(self, step: int, *, last_step: bool = False) -> bool:
        """After loop step ``step`` (the state's progress already says where the run is): save
        when due (the interval, the last step); whether it did. Collective."""
        if not self.due(step, last_step):
            return False
        assert self.state is not None, "load() binds the state first"
        # Every topology saves rank 0's batch norm statistics (DDP's; FSDP2 keeps each rank's
        # own): lerobot_pipe/distributed/batch_norm.py.
        broadcast_batch_norm_stats(self.state.model.module)
        self.writer.save(self.state)
        return True

    def close(self) -> Path | None:
        """The end of training: wait for the last save; the newest checkpoint this run wrote."""
        return self.writer.close()

    def shutdown(self) -> None:
        """After an error (or at the end, again): let the save in flight finish, release."""
        self.writer.shutdown()
