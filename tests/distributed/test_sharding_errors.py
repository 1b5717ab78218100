"""Sharding failures with their messages: tied parameters across units, resuming a sharded run
on one process, LeRobot 0.6's sharded layout."""

from __future__ import annotations

import json

import pytest
from tiny import run_train, tiny_act_flags, train_fsdp2_dcp
from torch import nn

from lerobot_pipe.configs.parser import ConfigError
from lerobot_pipe.configs.train import FSDPConfig
from lerobot_pipe.constants import MODEL_SAFETENSORS, TRAIN_CONFIG_NAME
from lerobot_pipe.distributed.parallelize import check_shared_parameters, select_wrap_units
from lerobot_pipe.scripts.train import main as train_main

pytestmark = pytest.mark.torch_range


class Block(nn.Module):
    def __init__(self, shared: nn.Linear | None = None):
        super().__init__()
        self.proj = shared if shared is not None else nn.Linear(4, 4)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block()
        self.b = Block(shared=self.a.proj)


def test_tied_parameters_across_units_fail_before_the_first_step():
    model = Tied()
    units = select_wrap_units(model, FSDPConfig(wrap_modules=["Block"]), [])
    with pytest.raises(ConfigError) as err:
        check_shared_parameters(model, units)
    assert "b.proj.weight" in str(err.value) and "shared (tied)" in str(err.value)
    # Both in one unit (the root) is fine.
    check_shared_parameters(model, select_wrap_units(model, FSDPConfig(wrap_modules=["Tied"]), []))


@pytest.fixture(scope="module")
def fsdp_run(dataset_root, tmp_path_factory):
    return train_fsdp2_dcp(dataset_root, tmp_path_factory.mktemp("fsdp") / "out")


def test_sharded_resume_on_one_process_needs_dp_shard_1(fsdp_run, capsys):
    config = fsdp_run / "checkpoints/last/pretrained_model/train_config.json"
    assert train_main(["--resume=true", f"--config_path={config}", "--steps=4"]) == 2
    err = capsys.readouterr().err
    assert "--parallelism.dp_shard=2 does not divide the world size 1" in err
    # ... and names the fix, which is all it takes: the DCP shards load into the whole model.
    assert "to resume on 1 process(es) pass --parallelism.dp_shard=1" in err
    resumed = ["--resume=true", f"--config_path={config}", "--steps=4", "--parallelism.dp_shard=1"]
    assert train_main(resumed) == 0
    # One process writes model.safetensors; the run's --checkpoint_format=dcp stays in its config
    # and applies again once the run is sharded.
    pretrained = fsdp_run / "checkpoints/000004/pretrained_model"
    assert (pretrained / MODEL_SAFETENSORS).is_file()
    saved = json.loads((pretrained / TRAIN_CONFIG_NAME).read_text())
    assert saved["checkpoint_format"] == "dcp" and saved["parallelism"]["dp_shard"] == 1


def test_lerobot_06_sharded_layout_is_refused(dataset_root, tmp_path, capsys):
    out = tmp_path / "out"
    run_train(
        [
            *tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2, "save_freq": 2}),
            f"--output_dir={out}",
        ]
    )
    step_file = out / "checkpoints/000002/training_state/training_step.json"
    upstream = {
        "step": 2,
        "dp_world_size": 2,
        "batch_size": 4,
        "grad_accum_steps": 1,
        "parallelism": {"dp_replicate": 1, "dp_shard": 2},
    }
    step_file.write_text(json.dumps(upstream))
    assert (
        train_main(["--resume=true", f"--config_path={out / 'checkpoints/000002'}", "--steps=4"])
        == 2
    )
    err = capsys.readouterr().err
    assert "LeRobot 0.6 sharded checkpoint" in err and "--policy.path" in err


def test_min_num_params_picks_units_bottom_up():
    """Like FSDP1's size-based policy: a module is a unit when the parameters not already in a
    unit below it reach the threshold, so the layers' projections are units of their own."""
    from lerobot_pipe.policies.act import ACTConfig, ACTPolicy

    features = {
        "observation.state": {"type": "STATE", "shape": [2]},
        "observation.environment_state": {"type": "ENV", "shape": [2]},
    }
    policy = ACTPolicy(
        ACTConfig.tiny(
            input_features=features, output_features={"action": {"type": "ACTION", "shape": [2]}}
        )
    )
    names = [n for n, _ in select_wrap_units(policy, FSDPConfig(min_num_params=2000), [])]
    assert {
        "model.encoder.layers.0.linear1",
        "model.encoder.layers.1.linear2",
        "model.decoder.layers.0.linear1",
    } <= set(names)
    modules = dict(policy.named_modules())
    for name in names:
        inner = [p for n in names if n.startswith(name + ".") for p in modules[n].parameters()]
        own = sum(p.numel() for p in modules[name].parameters() if all(p is not q for q in inner))
        assert own >= 2000, (name, own)
    check_shared_parameters(policy, [(n, modules[n]) for n in names])  # nesting is not tying
