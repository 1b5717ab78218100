"""Fixtures for the DCP → safetensors converter tests.

The session fixtures run two forked ranks in a gloo process group (tests/launch.py's
``run_distributed``: a real multi-process run, no torchrun needed) to produce real FSDP2 DCP
checkpoints (plain, and PEFT/LoRA on a tiny ACT policy, which the converter rebuilds on the meta
device to name the adapter tensors) plus the full-gathered reference weights written by rank 0,
once per test session; each test then works on its own copy. Like the trainer's, each step
folder ends with ``training_state/training_step.json`` listing the size and SHA-256 of every file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from launch import run_distributed
from torch import nn

from lerobot_pipe import constants as C
from lerobot_pipe.checkpoint.manifest import file_manifest
from lerobot_pipe.fsutil import write_json_atomic


@contextmanager
def _gloo_group() -> Iterator[int]:
    """This rank (of run_distributed) in a gloo process group; yields the rank."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        yield dist.get_rank()
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------
# A small policy-like model: model.encoder.layers.N (TransformerEncoderLayer) + heads.


class _Encoder(nn.Module):
    def __init__(self, dim: int, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                dim, nhead=4, dim_feedforward=2 * dim, dropout=0.0, batch_first=True
            )
            for _ in range(n_layers)
        )

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class _Core(nn.Module):
    def __init__(self, dim: int, n_layers: int):
        super().__init__()
        self.input_proj = nn.Linear(5, dim)
        self.encoder = _Encoder(dim, n_layers)
        # 7 output rows: uneven Shard(0) split across 2 ranks.
        self.action_head = nn.Linear(dim, 7)
        # 1 output row: rank 1 holds an empty shard.
        self.value_head = nn.Linear(dim, 1)
        self.register_buffer("action_scale", torch.linspace(0.5, 1.5, 7))

    def forward(self, x):
        h = self.encoder(self.input_proj(x))
        return self.action_head(h) * self.action_scale + self.value_head(h)


class TinyPolicy(nn.Module):
    def __init__(self, dim: int = 32, n_layers: int = 2):
        super().__init__()
        self.model = _Core(dim, n_layers)

    def forward(self, x):
        return self.model(x)


LORA_KWARGS = dict(
    r=4, lora_alpha=8, target_modules=["linear1", "linear2", "encoder_env_state_input_proj"]
)
LORA_MODULES_TO_SAVE = ["action_head"]
# A tiny ACT: 7 action rows (an uneven Shard(0) split across 2 ranks).
ACT_FEATURES = dict(
    input_features={
        "observation.state": {"type": "STATE", "shape": [5]},
        "observation.environment_state": {"type": "ENV", "shape": [6]},
    },
    output_features={"action": {"type": "ACTION", "shape": [7]}},
)


def tiny_act():
    from lerobot_pipe.policies.act import ACTConfig, ACTPolicy

    return ACTPolicy(ACTConfig.tiny(**ACT_FEATURES))


def _act_loss(model: nn.Module, generator: torch.Generator) -> torch.Tensor:
    batch = {
        "observation.state": torch.randn(3, 5, generator=generator),
        "observation.environment_state": torch.randn(3, 6, generator=generator),
        "action": torch.randn(3, 10, 7, generator=generator),
        "action_is_pad": torch.zeros(3, 10, dtype=torch.bool),
    }
    return model(batch)[0]


def _tiny_loss(model: nn.Module, generator: torch.Generator) -> torch.Tensor:
    return model(torch.randn(3, 4, 5, generator=generator)).pow(2).mean()


def _shard_and_step(
    model: nn.Module, core: nn.Module, trainable, loss_fn: Callable
) -> torch.optim.Optimizer:
    from torch.distributed.fsdp import fully_shard

    for layer in core.encoder.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    g = torch.Generator().manual_seed(1234 + torch.distributed.get_rank())
    loss = loss_fn(model, g)
    loss.backward()
    opt.step()
    opt.zero_grad()
    # Optimizer DCP next to the model, like the trainer: the converter must not read it.
    return opt


def _write_aux_files(pretrained: Path) -> None:
    (pretrained / C.CONFIG_NAME).write_text(json.dumps({"type": "tiny", "dim": 32}))
    (pretrained / C.TRAIN_CONFIG_NAME).write_text(json.dumps({"steps": 1}, indent=4))
    from safetensors.torch import save_file

    for name in (C.POLICY_PREPROCESSOR_NAME, C.POLICY_POSTPROCESSOR_NAME):
        step_file = f"{name}_step_0_normalizer_processor.safetensors"
        (pretrained / f"{name}.json").write_text(
            json.dumps({"name": name, "steps": [{"registry_name": "n", "state_file": step_file}]})
        )
        save_file({"action.mean": torch.arange(7.0)}, str(pretrained / step_file))


def _save_plain(step_dir: str, reference: str) -> None:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    with _gloo_group() as rank:
        torch.manual_seed(0)
        model = TinyPolicy()
        opt = _shard_and_step(model, model.model, model.parameters(), _tiny_loss)
        pretrained = Path(step_dir) / C.PRETRAINED_MODEL_DIR
        dcp.save(get_model_state_dict(model), checkpoint_id=str(pretrained / C.MODEL_DCP_DIR))
        dcp.save(
            get_optimizer_state_dict(model, opt),
            checkpoint_id=str(Path(step_dir) / C.TRAINING_STATE_DIR / C.OPTIMIZER_DCP_DIR),
        )
        full = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if rank == 0:
            save_file({k: v.contiguous() for k, v in full.items()}, reference)
            _write_aux_files(pretrained)


def _save_peft(step_dir: str, reference: str) -> None:
    import torch.distributed.checkpoint as dcp
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    with _gloo_group() as rank:
        torch.manual_seed(0)
        base = tiny_act()
        config = LoraConfig(**LORA_KWARGS, modules_to_save=LORA_MODULES_TO_SAVE)
        model = get_peft_model(base, config)
        trainable = [p for p in model.parameters() if p.requires_grad]
        _shard_and_step(model, base.model, trainable, _act_loss)
        pretrained = Path(step_dir) / C.PRETRAINED_MODEL_DIR
        dcp.save(get_model_state_dict(model), checkpoint_id=str(pretrained / C.MODEL_DCP_DIR))
        full = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if rank == 0:
            adapter = get_peft_model_state_dict(model, state_dict=full)
            save_file({k: v.contiguous() for k, v in adapter.items()}, reference)
            model.peft_config["default"].save_pretrained(str(pretrained))
            _write_aux_files(pretrained)
            base.config.save_pretrained(pretrained)  # the converter builds the policy from it


def _make_checkpoint(root: Path, fn: Callable) -> tuple[Path, Path]:
    step_dir = root / C.CHECKPOINTS_DIR / "000001"
    (step_dir / C.PRETRAINED_MODEL_DIR).mkdir(parents=True)
    reference = root / "reference.safetensors"
    run_distributed(fn, 2, str(step_dir), str(reference))
    write_manifest(step_dir)
    return step_dir, reference


def write_manifest(step_dir: Path) -> None:
    """training_step.json with the file manifest, written last as the trainer does."""
    (step_dir / C.TRAINING_STATE_DIR).mkdir(exist_ok=True)
    info = {"step": int(step_dir.name), "files": file_manifest(step_dir)}
    write_json_atomic(step_dir / C.TRAINING_STATE_DIR / C.TRAINING_STEP, info)


@pytest.fixture(scope="session")
def _plain_template(tmp_path_factory) -> tuple[Path, Path]:
    return _make_checkpoint(tmp_path_factory.mktemp("plain"), _save_plain)


@pytest.fixture(scope="session")
def _peft_template(tmp_path_factory) -> tuple[Path, Path]:
    return _make_checkpoint(tmp_path_factory.mktemp("peft"), _save_peft)


def _copy_step(template: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run" / C.CHECKPOINTS_DIR / template.name
    shutil.copytree(template, dst, symlinks=True)
    return dst


@pytest.fixture
def dcp_step(_plain_template, tmp_path) -> tuple[Path, Path]:
    """A fresh copy of a real 2-rank FSDP2 step folder with the model as DCP, and the
    full-gathered reference weights (model.safetensors of a ``safetensors`` run)."""
    step_dir, reference = _plain_template
    return _copy_step(step_dir, tmp_path), reference


@pytest.fixture
def peft_step(_peft_template, tmp_path) -> tuple[Path, Path]:
    """Like ``dcp_step`` for a LoRA run; the reference is get_peft_model_state_dict."""
    step_dir, reference = _peft_template
    return _copy_step(step_dir, tmp_path), reference


@pytest.fixture
def make_act() -> Callable[[], nn.Module]:
    """Builds the tiny ACT policy of the PEFT checkpoint (for tests that build their own)."""
    return tiny_act


@pytest.fixture
def peft_step_of(tmp_path) -> Callable[[nn.Module], Path]:
    """A single-process step folder of a PEFT-wrapped ACT policy: the model DCP, config.json,
    adapter_config.json (of the ``default`` adapter) and the manifest."""

    def make(model: nn.Module) -> Path:
        import warnings

        import torch.distributed.checkpoint as dcp

        step = tmp_path / "run" / C.CHECKPOINTS_DIR / "000001"
        pretrained = step / C.PRETRAINED_MODEL_DIR
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.distributed is disabled"
            dcp.save(
                model.state_dict(), checkpoint_id=str(pretrained / C.MODEL_DCP_DIR), no_dist=True
            )
        model.peft_config["default"].save_pretrained(str(pretrained))
        model.get_base_model().config.save_pretrained(pretrained)
        write_manifest(step)
        return step

    return make
