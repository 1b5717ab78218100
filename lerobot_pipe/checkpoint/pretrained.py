"""The ``pretrained_model/`` folder of a checkpoint, as LeRobot's tools load it: the policy's
config.json and weights (PEFT: the adapter and the base's config), its processors and
train_config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lerobot_pipe import constants as C
from lerobot_pipe.configs.parser import to_dict
from lerobot_pipe.policies.peft import write_adapter, write_adapter_config
from lerobot_pipe.policies.pretrained import PreTrainedPolicy
from lerobot_pipe.processors import PolicyProcessorPipeline
from lerobot_pipe.utils.faults import fault_point


@dataclass(frozen=True)
class PolicyFiles:
    """Writes a checkpoint's pretrained_model/ (a :class:`~.stateful.TrainState`'s
    ``pretrained``). Reads only what training does not change."""

    policy: PreTrainedPolicy
    trainee: nn.Module  # the policy, or its PeftModel wrapper with PEFT
    pre: PolicyProcessorPipeline
    post: PolicyProcessorPipeline
    cfg: Any  # the TrainConfig, written as train_config.json

    def __call__(self, directory: Path, full_state: dict[str, torch.Tensor] | None) -> None:
        if self.trainee is not self.policy:  # PEFT: the adapter only, plus the base's config
            self.policy.config.save_pretrained(directory)
            if full_state is not None:
                write_adapter(directory, self.trainee, full_state)
            else:
                write_adapter_config(directory, self.trainee)
        elif full_state is not None:
            self.policy.save_pretrained(directory, state_dict=full_state)
        else:
            self.policy.config.save_pretrained(directory)
        fault_point("save:after_model_file")
        self.pre.save_pretrained(directory)
        self.post.save_pretrained(directory)
        fault_point("save:after_processors")
        config = to_dict(self.cfg)
        # Where one launch stopped is not the run's config: a resume from this checkpoint with
        # its train_config.json must not stop there again.
        config.pop("stop_after_step", None)
        text = json.dumps(config, indent=4) + "\n"
        (directory / C.TRAIN_CONFIG_NAME).write_text(text)
