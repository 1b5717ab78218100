"""The checkpoint manager takes its parts as a ``states`` mapping (torchtitan's shape), and the
mapping is checked: every name is one a checkpoint has files for, the required parts are there."""

from __future__ import annotations

import pytest
import torch

from lerobot_pipe.checkpoint.stateful import STATES, TrainProgress, TrainState, train_states


def _states(**extra):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    return train_states(model, optimizer, lambda directory, full_state: None, **extra)


def test_a_states_mapping_becomes_the_record_the_writer_saves():
    progress = TrainProgress(step=7)
    state = TrainState.from_states(_states(progress=progress, ema=None, stream=None))
    assert state.progress is progress
    assert state.ema is None and state.scheduler is None
    assert state.optimizer.model is state.model
    assert set(STATES) == {f.name for f in TrainState.__dataclass_fields__.values()}


def test_an_unknown_or_missing_part_is_named():
    with pytest.raises(ValueError, match=r"unknown \['lr_sheduler'\]"):
        TrainState.from_states(_states(lr_sheduler=object()))
    states = _states()
    del states["optimizer"]
    with pytest.raises(ValueError, match=r"missing \['optimizer'\]"):
        TrainState.from_states(states)
    with pytest.raises(ValueError, match="ModelState"):
        TrainState.from_states({**_states(), "model": torch.nn.Linear(2, 2)})
