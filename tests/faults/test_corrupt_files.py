"""Damaged checkpoints: each gives a clear error naming the file when named explicitly, and an
automatic resume (--resume=true with --output_dir) falls back to the previous checkpoint that
verifies, saying so in the log. Never a traceback from inside a library."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from launch import run_distributed
from tiny import run_train, tiny_act_flags

from lerobot_pipe.checkpoint.manifest import file_manifest
from lerobot_pipe.scripts.train import main as train_main


@pytest.fixture(scope="module")
def runs(dataset_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 4, "save_freq": 2})
    run_train([*flags, f"--output_dir={root / 'plain'}"])
    run_distributed(
        run_train,
        2,
        [
            *flags,
            "--batch_size=4",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
            f"--output_dir={root / 'dcp'}",
        ],
    )
    return root


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip(path):
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x10  # a byte of tensor data, not of the header
    path.write_bytes(bytes(data))


def _malformed(path):
    path.write_text('{"step": 4,')


def _other_policy(step):
    config = step / "pretrained_model/config.json"
    data = json.loads(config.read_text())
    data["type"] = "diffusion"
    config.write_text(json.dumps(data))
    info_path = step / "training_state/training_step.json"
    info = json.loads(info_path.read_text())
    info["files"] = file_manifest(step)  # a consistent checkpoint, just of another policy
    info_path.write_text(json.dumps(info))


# (id, run, damage(step_dir), explicit-resume message, automatic resume falls back?)
CASES = [
    (
        "truncated-weights",
        "plain",
        lambda s: _truncate(s / "pretrained_model/model.safetensors"),
        "pretrained_model/model.safetensors",
        True,
    ),
    (
        "bitflip-optimizer",
        "plain",
        lambda s: _flip(s / "training_state/optimizer_state.safetensors"),
        "optimizer_state.safetensors: SHA-256 does not match",
        True,
    ),
    (
        "bitflip-rng",
        "plain",
        lambda s: _flip(s / "training_state/rng_state.safetensors"),
        "rng_state.safetensors",
        True,
    ),
    (
        "malformed-param-groups",
        "plain",
        lambda s: _malformed(s / "training_state/optimizer_param_groups.json"),
        "optimizer_param_groups.json",
        True,
    ),
    (
        "malformed-training-step",
        "plain",
        lambda s: _malformed(s / "training_state/training_step.json"),
        "training_step.json: not valid JSON",
        True,
    ),
    (
        "missing-training-step",
        "plain",
        lambda s: (s / "training_state/training_step.json").unlink(),
        "training_step.json is missing",
        True,
    ),
    (
        "missing-optimizer-shard",
        "dcp",
        lambda s: (s / "training_state/optimizer_0/__1_0.distcp").unlink(),
        "checkpoint file missing: ",
        True,
    ),
    (
        "missing-model-shard",
        "dcp",
        lambda s: (s / "pretrained_model/pytorch_model_fsdp_0/__0_0.distcp").unlink(),
        "pytorch_model_fsdp_0/__0_0.distcp",
        True,
    ),
    (
        "dcp-metadata",
        "dcp",
        lambda s: _truncate(s / "training_state/optimizer_0/.metadata"),
        "optimizer_0/.metadata",
        True,
    ),
    ("other-policy-type", "plain", _other_policy, "holds a 'diffusion' policy", False),
]


@pytest.mark.parametrize(
    ("run", "damage", "message", "falls_back"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_damaged_newest_checkpoint(
    runs, dataset_root, tmp_path, capsys, run, damage, message, falls_back
):
    out = tmp_path / "out"
    shutil.copytree(runs / run, out, symlinks=True)
    step = out / "checkpoints/000004"
    damage(step)
    extra = ["--parallelism.dp_shard=1"] if run == "dcp" else []

    # Named explicitly: a clear error naming the file, nothing written.
    before = sorted(str(p) for p in out.rglob("*"))
    assert train_main(["--resume=true", f"--config_path={step}", "--steps=6", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert sorted(str(p) for p in out.rglob("*")) == before

    # Automatic: fall back to step 2 (when that is the safe choice), saying why.
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 6, "save_freq": 2})
    code = train_main(["--resume=true", f"--output_dir={out}", *flags, *extra])
    err = capsys.readouterr().err
    if falls_back:
        assert code == 0, err
        assert "Resuming from" in err and "000002" in err.split("Resuming from")[1].splitlines()[0]
        # Said once (by locate on sizes, else by verify on hashes), with what happens to step 4;
        # a folder without training_step.json is an unfinished save instead, never listed.
        if "training_step.json is missing" not in message:
            assert err.count("cannot be resumed") == 1, err
            assert "resuming from 000002 instead: training rewrites 000004" in err
            assert "not the newest usable checkpoint" not in err
        assert (out / "checkpoints/000006/training_state/training_step.json").is_file()
    else:
        assert code == 2 and message in err
    assert "Traceback" not in err


def test_dangling_last_link_falls_back_to_newest(runs, dataset_root, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(runs / "plain", out, symlinks=True)
    last = out / "checkpoints/last"
    last.unlink()
    last.symlink_to("000009")
    flags = tiny_act_flags(**{"dataset.root": dataset_root, "steps": 6, "save_freq": 2})
    assert train_main(["--resume=true", f"--output_dir={out}", *flags]) == 0
    err = capsys.readouterr().err
    assert (
        "not the newest usable checkpoint" in err
        and "000004" in err.split("Resuming from")[1].splitlines()[0]
    )
    assert os.readlink(last) == "000006"
