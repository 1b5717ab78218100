"""Fixtures for the Hub publishing tests: a local Hub server with a small LFS threshold."""

import json
import random
from pathlib import Path

import pytest
from conftest_hub import hub_server, make_hub_server_fixture  # noqa: F401  (tests/ is on pythonpath)

# Files above 1 KiB go through LFS, so tests exercise both upload modes with tiny files.
small_lfs_hub = make_hub_server_fixture(scope="function", lfs_threshold=1024)


@pytest.fixture
def make_checkpoint(tmp_path):
    """Factory: a LeRobot-layout checkpoint folder ``<tmp>/out/checkpoints/<step>/``.

    ``pretrained_model/`` gets small regular files, a >1 KiB ``model.safetensors`` (LFS on
    ``small_lfs_hub``), stray DCP files that must never be uploaded, and ``training_state/``.
    ``weights=False`` leaves only DCP shards (an unconverted sharded checkpoint).
    """

    def _make(step: int = 5000, *, seed: int = 0, weights: bool = True) -> Path:
        rng = random.Random(seed)
        step_dir = tmp_path / "out" / "checkpoints" / f"{step:06d}"
        pm = step_dir / "pretrained_model"
        (pm / "pytorch_model_fsdp_0").mkdir(parents=True)
        (pm / "config.json").write_text(json.dumps({"type": "act", "chunk_size": 10}))
        (pm / "train_config.json").write_text(json.dumps({"steps": step, "seed": seed}))
        (pm / "policy_preprocessor.json").write_text(json.dumps({"steps": ["normalizer"]}))
        (pm / "policy_preprocessor_step_0_normalizer_processor.safetensors").write_bytes(
            rng.randbytes(300)
        )
        if weights:
            (pm / "model.safetensors").write_bytes(rng.randbytes(4096))
        (pm / "pytorch_model_fsdp_0" / "__0_0.distcp").write_bytes(rng.randbytes(2048))
        (pm / "pytorch_model_fsdp_0" / ".metadata").write_bytes(b"dcp-metadata")
        (pm / "stray.distcp").write_bytes(b"x" * 10)
        (pm / "notes.txt").write_text("not allow-listed")
        ts = step_dir / "training_state"
        ts.mkdir()
        (ts / "optimizer_state.safetensors").write_bytes(rng.randbytes(2048))
        (ts / "optimizer_param_groups.json").write_text("[]")
        (ts / "rng_state.safetensors").write_bytes(rng.randbytes(64))
        (ts / "training_step.json").write_text(json.dumps({"step": step}))
        return step_dir

    return _make
