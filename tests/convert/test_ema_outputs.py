"""The EMA policy of a DCP-only checkpoint (``--ema.enable=true --checkpoint_format=dcp``, a real
2-rank FSDP2 run): ``lerobot-convert-dcp`` converts its ``pretrained_model_ema/`` too (in place,
and beside ``--output_dir``), and publishing the converted policy pushes the EMA policy to
``<repo_id>-ema`` on the local test Hub."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest_hub import hub_server  # noqa: F401 - the fixture
from launch import run_distributed
from safetensors.torch import load_file
from tiny import DETERMINISTIC, run_train, tiny_act_flags

from lerobot_pipe import constants as C
from lerobot_pipe.convert import load_dcp_state_dict
from lerobot_pipe.hub import publish_checkpoint
from lerobot_pipe.scripts.convert_dcp import main as convert_main

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")
REPO = "alice/act-ema-test"


@pytest.fixture(scope="module")
def dcp_step(dataset_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("ema_dcp") / "run"
    flags = tiny_act_flags(
        **DETERMINISTIC,
        **{"dataset.root": dataset_root, "steps": 2, "save_freq": 2, "batch_size": 4},
    )
    argv = [
        *flags,
        "--parallelism.dp_shard=2",
        "--checkpoint_format=dcp",
        "--ema.enable=true",
        f"--output_dir={out}",
    ]
    run_distributed(run_train, 2, argv)
    step_dir = out / C.CHECKPOINTS_DIR / "000002"
    assert not (step_dir / C.PRETRAINED_MODEL_EMA_DIR / C.MODEL_SAFETENSORS).exists()
    return step_dir


def _shards(folder):
    return load_dcp_state_dict(folder / C.MODEL_DCP_DIR)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_conversion_in_place_writes_the_ema_weights(dcp_step, tmp_path):
    step = tmp_path / "000002"
    shutil.copytree(dcp_step, step)
    assert convert_main([f"--checkpoint_dir={step}"]) == 0
    for folder in (C.PRETRAINED_MODEL_DIR, C.PRETRAINED_MODEL_EMA_DIR):
        assert _same(load_file(step / folder / C.MODEL_SAFETENSORS), _shards(step / folder))
    live = load_file(step / C.PRETRAINED_MODEL_DIR / C.MODEL_SAFETENSORS)
    ema = load_file(step / C.PRETRAINED_MODEL_EMA_DIR / C.MODEL_SAFETENSORS)
    assert not _same(live, ema)


def test_conversion_to_an_output_tree_and_publishing(dcp_step, tmp_path, hub_server):  # noqa: F811
    out = tmp_path / "converted" / C.PRETRAINED_MODEL_DIR
    assert convert_main([f"--checkpoint_dir={dcp_step}", f"--output_dir={out}"]) == 0
    ema_out = out.with_name(C.PRETRAINED_MODEL_EMA_DIR)
    ema_weights = load_file(ema_out / C.MODEL_SAFETENSORS)
    assert _same(ema_weights, _shards(dcp_step / C.PRETRAINED_MODEL_EMA_DIR))
    assert not (ema_out / C.MODEL_DCP_DIR).exists()
    assert (ema_out / C.CONFIG_NAME).read_text() == (out / C.CONFIG_NAME).read_text()

    receipt = publish_checkpoint(
        out, REPO, intermediate=False, step=2, token=hub_server.token, endpoint=hub_server.url
    )
    assert receipt.ema is not None and receipt.ema["repo_id"] == f"{REPO}-ema"
    assert C.MODEL_SAFETENSORS in hub_server.list_files(f"{REPO}-ema")
    assert hub_server.read_file(f"{REPO}-ema", C.MODEL_SAFETENSORS) == (
        (ema_out / C.MODEL_SAFETENSORS).read_bytes()
    )
    assert hub_server.read_file(REPO, C.MODEL_SAFETENSORS) == (
        (out / C.MODEL_SAFETENSORS).read_bytes()
    )
    assert "ema" in receipt.to_json()


def test_convert_cli_pushes_the_ema_policy_too(dcp_step, tmp_path, hub_server, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    out = tmp_path / "exported"
    argv = [f"--checkpoint_dir={dcp_step}", f"--output_dir={out}", "--push_to_hub=alice/cli"]
    assert convert_main(argv) == 0
    ema_out = tmp_path / "exported_ema"
    assert hub_server.read_file("alice/cli-ema", C.MODEL_SAFETENSORS) == (
        (ema_out / C.MODEL_SAFETENSORS).read_bytes()
    )
    assert hub_server.read_file("alice/cli", C.MODEL_SAFETENSORS) == (
        (out / C.MODEL_SAFETENSORS).read_bytes()
    )
