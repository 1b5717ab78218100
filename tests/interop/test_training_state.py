"""training_state/ across the two: what LeRobot's resume (load_training_state into the optimizer
make_optimizer_and_scheduler builds from train_config.json) restores from a checkpoint equals what
lerobot_pipe's resume restores: step, optimizer state of every parameter, param groups, RNG."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from interop_helpers import pretrained, step_dir

pytestmark = pytest.mark.interop


def _our_restore(train_config, output_dir, dataset_root) -> tuple[dict, list[dict], dict]:
    """lerobot_pipe's resume in this process: (optimizer state by parameter name, param group
    hyper-parameters, the first numbers each RNG draws afterwards)."""
    from lerobot_pipe.distributed.runtime import destroy, init_distributed
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.session import prepare_session

    plan = make_plan(
        [
            "--resume=true",
            f"--config_path={train_config}",
            f"--output_dir={output_dir}",
            f"--dataset.root={dataset_root}",
        ],
        1,
    )
    session = prepare_session(plan, init_distributed())
    try:
        draws = {
            "torch": torch.rand(4, dtype=torch.float64),
            "numpy": torch.from_numpy(np.random.rand(4)),
            "python": torch.tensor([random.random() for _ in range(4)], dtype=torch.float64),
        }
    finally:
        destroy()
    names = {id(p): n for n, p in session.policy.named_parameters()}
    state = {
        f"state/{names[id(p)]}/{key}": value
        for group in session.optimizer.param_groups
        for p in group["params"]
        for key, value in session.optimizer.state.get(p, {}).items()
    }
    groups = [
        {k: v for k, v in g.items() if k != "params"} | {"num_params": len(g["params"])}
        for g in session.optimizer.param_groups
    ]
    return state, groups, draws


def _compare(results_name, train_config, lerobot_reads, dataset_root, tmp_path):
    """LeRobot's restore (its own copy of ``train_config``) against ours (``train_config``)."""
    theirs = lerobot_reads.results.tensors(results_name)
    info = lerobot_reads.results.meta(results_name)
    state, groups, draws = _our_restore(train_config, tmp_path / "out", dataset_root)

    their_state = {k: v for k, v in theirs.items() if k.startswith("state/")}
    assert set(state) == set(their_state) and state
    for key, value in state.items():
        assert torch.equal(value.to(their_state[key].dtype), their_state[key]), key
    assert [g["lr"] for g in groups] == [g["lr"] for g in info["param_groups"]]
    assert [g["num_params"] for g in groups] == [g["num_params"] for g in info["param_groups"]]
    for kind, value in draws.items():
        assert torch.equal(value, theirs[f"rng/{kind}"]), f"{kind} RNG after restore"
    return info


@pytest.mark.parametrize("name", ["our_single", "our_ddp"])
def test_lerobot_restores_our_training_state(name, lerobot_reads, dataset_root, tmp_path):
    """Ours, written by one process and by a 2-process DDP run (LeRobot restores the main rank's
    RNG; the other rank's state, kept under rank1/, it ignores)."""
    info = _compare(
        f"{name}.state.safetensors",
        lerobot_reads.resumable[name] / "pretrained_model" / "train_config.json",
        lerobot_reads,
        dataset_root,
        tmp_path,
    )
    assert info["step"] == int(lerobot_reads.resumable[name].name)


def test_we_restore_lerobots_training_state(lerobot_ckpts, lerobot_reads, dataset_root, tmp_path):
    """LeRobot's own checkpoint restores here exactly as in LeRobot (two param groups for ACT,
    the backbone's one empty without cameras)."""
    info = _compare(
        "le_single.state.safetensors",
        pretrained(lerobot_ckpts.single) / "train_config.json",
        lerobot_reads,
        dataset_root,
        tmp_path,
    )
    assert info["step"] == int(step_dir(lerobot_ckpts.single).name)
    assert len(info["param_groups"]) == 2
