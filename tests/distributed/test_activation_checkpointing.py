"""``--accelerator.activation_checkpointing.mode`` (LeRobot main's field): its config (left out of
train_config.json at ``none``, refused at an unknown mode before launch) and the recomputation on
a plain module tree: same gradients, each unit recomputed once (a unit inside another one by the
outer unit's recomputation only), nothing recomputed without gradients. SmolVLA under FSDP2:
tests/policies/test_smolvla_sharded.py::test_activation_checkpointing_gives_the_same_gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lerobot_pipe.configs.loading import parse_train_config
from lerobot_pipe.configs.parser import ConfigError, to_dict
from lerobot_pipe.distributed.activation_checkpointing import (
    apply_activation_checkpointing,
    checkpointed_units,
)
from lerobot_pipe.training.config_checks import validate_config


def test_mode_is_written_only_when_set_and_checked_before_launch():
    cfg, _ = parse_train_config(["--policy.type=act"])
    assert "activation_checkpointing" not in to_dict(cfg)["accelerator"]
    cfg, _ = parse_train_config(
        ["--policy.type=act", "--accelerator.activation_checkpointing.mode=full"]
    )
    assert to_dict(cfg)["accelerator"]["activation_checkpointing"] == {"mode": "full"}
    cfg, _ = parse_train_config(
        [
            "--policy.type=act",
            "--dataset.root=/x",
            "--accelerator.activation_checkpointing.mode=some",
        ]
    )
    with pytest.raises(
        ConfigError,
        match=r"--accelerator\.activation_checkpointing\.mode='some': choose one of none, full",
    ):
        validate_config(cfg)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return x + self.inner(self.norm(x))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), Block(), Block(), nn.Linear(8, 2))


def _gradients(model: nn.Module, calls: dict) -> dict[str, torch.Tensor]:
    for name in calls:
        model.get_submodule(name).register_forward_pre_hook(
            lambda m, a, name=name: calls.__setitem__(name, calls[name] + 1)
        )
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    model(x).square().sum().backward()
    return {n: p.grad for n, p in model.named_parameters()}


# torch.utils.checkpoint's recomputation of nested units is torch's own behaviour.
@pytest.mark.torch_range
def test_each_unit_recomputed_once_with_the_same_gradients():
    # Modules inside the units (a unit's own hooks run once: its recomputation calls its forward).
    watched = ["1.norm", "1.inner.0", "2.inner.0"]
    plain_calls, calls = dict.fromkeys(watched, 0), dict.fromkeys(watched, 0)
    plain = _gradients(_model(), plain_calls)
    model = _model()
    # Block 1 and its nested inner unit; block 2's inner alone.
    assert apply_activation_checkpointing(model, ["1", "1.inner", "2.inner"]) == 3
    grads = _gradients(model, calls)
    assert plain.keys() == grads.keys()
    for name, grad in plain.items():
        assert torch.equal(grads[name], grad), name
    assert plain_calls == dict.fromkeys(watched, 1)
    assert calls == dict.fromkeys(watched, 2)  # the nested unit too: recomputed by block 1 only
    with torch.no_grad():
        model(torch.zeros(1, 4))
    assert calls == dict.fromkeys(watched, 3)  # no recomputation without gradients
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in _model().named_parameters()]


def test_units_by_class_unsharded_and_a_clear_error_without_any():
    model = _model()
    assert checkpointed_units(model, None, ["Block"], None) == ["1", "2"]
    assert checkpointed_units(model, ["Linear"], ["Block"], None)[:2] == ["0", "1.inner.0"]
    assert checkpointed_units(model, None, ["Block"], ("2",)) == ["2"]  # the FSDP2 units
    with pytest.raises(ConfigError, match=r"none of the classes \['Missing'\].*wrap_modules"):
        checkpointed_units(model, None, ["Missing"], None)
