"""LeRobot's own policy class, trained by our trainer: :class:`LeRobotPolicy` builds LeRobot's
module from the config's LeRobot config and takes its children as its own, so the state dict,
the FSDP2 units (LeRobot's classes, by name) and the checkpoint keys are LeRobot's; every call
(``forward``, ``select_action``, ...) runs LeRobot's code."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from lerobot_pipe.policies.lerobot_bridge.config import LeRobotPolicyConfig, config_class
from lerobot_pipe.policies.pretrained import PreTrainedPolicy


def upstream_policy_class(policy_type: str) -> type:
    """LeRobot's policy class of ``policy_type`` (its modeling module imported now)."""
    from lerobot.policies.factory import get_policy_class

    return get_policy_class(policy_type)


class LeRobotPolicy(PreTrainedPolicy):
    """LeRobot's policy of ``config.type`` inside our base class. Its modules are the LeRobot
    policy's children (same names, same objects); LeRobot's policy itself is kept outside the
    module tree and runs every call."""

    # LeRobot's classes declare no FSDP2 units (0.6.1): --accelerator.fsdp.wrap_modules names them.
    _fsdp_wrap_modules: list[str] = []
    # vqbet trains only its VQ-VAE for n_vqvae_training_steps, leaving the rest without gradients.
    ddp_find_unused_parameters = True

    def __init__(self, config: LeRobotPolicyConfig, *, pretrained_parts: bool = True) -> None:
        super().__init__(config)
        upstream = upstream_policy_class(config.type)(config.upstream())
        own = [name for name, _ in upstream.named_parameters(recurse=False)]
        own += [name for name, _ in upstream.named_buffers(recurse=False)]
        if own:
            raise ValueError(
                f"LeRobot's {type(upstream).__name__} holds {own} on itself, outside its "
                "submodules: not trained here"
            )
        for name, child in upstream.named_children():
            self.add_module(name, child)
        # Not a submodule: its children are ours already.
        self.__dict__["upstream"] = upstream
        self.train(upstream.training)

    def train(self, mode: bool = True) -> LeRobotPolicy:
        super().train(mode)
        self.upstream.training = mode
        return self

    def forward(self, batch: dict[str, Tensor], **kwargs: Any) -> tuple[Tensor, dict]:
        """LeRobot's forward: its loss (reduced as LeRobot's class reduces it) and its dict."""
        with self._in_compute_dtype():
            return self.upstream.forward(batch, **kwargs)

    def select_action(self, batch: dict[str, Tensor], **kwargs: Any) -> Tensor:
        with self._in_compute_dtype():
            return self.upstream.select_action(batch, **kwargs)

    def predict_action_chunk(self, batch: dict[str, Tensor], **kwargs: Any) -> Tensor:
        with self._in_compute_dtype():
            return self.upstream.predict_action_chunk(batch, **kwargs)

    @contextlib.contextmanager
    def _in_compute_dtype(self) -> Iterator[None]:
        """Under FSDP2 mixed precision (its parameters gathered in bf16 or fp16), LeRobot's code
        runs under autocast to that dtype: LeRobot trains with autocast, never with low-precision
        weights, and its code makes fp32 tensors of its own (ACT's zero latent in inference, an
        observation the inference methods pass on uncast) that would meet bf16 weights.
        Otherwise (fp32 parameters; DDP's bf16 is the trainer's own autocast) nothing changes."""
        low = next(
            (p for p in self.parameters() if p.dtype in (torch.bfloat16, torch.float16)), None
        )
        if low is None or torch.is_autocast_enabled(low.device.type):
            yield
            return
        with torch.autocast(device_type=low.device.type, dtype=low.dtype):
            yield

    def reset(self) -> None:
        self.upstream.reset()

    def get_optim_params(self) -> list[dict]:
        groups = self.upstream.get_optim_params()
        if isinstance(groups, dict):  # a LeRobot policy with one optimizer per part (SAC-like)
            raise ValueError(
                f"LeRobot's {self.config.type} trains several optimizers "
                f"({', '.join(groups)}): not trained here"
            )
        groups = list(groups)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        return groups


@functools.cache
def policy_class(policy_type: str) -> type[LeRobotPolicy]:
    """The policy class of LeRobot's ``policy_type`` (registered nowhere: a type we implement
    keeps our class)."""
    upstream = upstream_policy_class(policy_type)
    return type(
        f"LeRobot{upstream.__name__}",
        (LeRobotPolicy,),
        {
            "config_class": config_class(policy_type),
            "upstream_forward": upstream.forward,  # its signature: reduction="none" or not
            "__module__": __name__,
        },
    )
