"""The one seeding function: LeRobot's ``set_seed`` for every seed LeRobot accepts, and seeds
numpy cannot take (2**32 and above: a run's seed plus its rank) work too."""

from __future__ import annotations

import random

import numpy as np
import torch

from lerobot_pipe.utils.random import seed_everything


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seeds_python_numpy_and_torch_as_lerobots_set_seed():
    seed_everything(1000)
    ours = _draws()
    random.seed(1000)
    np.random.seed(1000)
    torch.manual_seed(1000)
    assert ours == _draws()


def test_a_seed_numpy_cannot_take_seeds_it_modulo_2_to_the_32():
    seed_everything(2**32 + 5)
    python, numpy, torch_draw = _draws()
    np.random.seed(5)
    assert numpy == float(np.random.rand())
    seed_everything(5)
    assert (python, torch_draw) != (random.random(), float(torch.rand(())))
