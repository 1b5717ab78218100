"""Config of pi0.5: pi0's fields (lerobot_pipe/policies/pi0/configuration_pi0.py) with LeRobot
0.6.1's pi0.5 defaults: quantile normalization (q01/q99 in the dataset's stats) and a 200-token
prompt (the task and the discretized state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lerobot_pipe.configs.policies import PreTrainedConfig
from lerobot_pipe.policies.pi0.configuration_pi0 import PiConfigBase


@PreTrainedConfig.register_subclass("pi05")
@dataclass
class PI05Config(PiConfigBase):
    """pi0.5: no state token (the preprocessor writes the state into the prompt); the expert's
    norms are AdaRMS conditioned on the flow time (``time_mlp_*``)."""

    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {
            "VISUAL": "IDENTITY",
            "STATE": "QUANTILES",
            "ACTION": "QUANTILES",
        }
    )
    tokenizer_max_length: int = 200  # the prompt (task and state bins) is padded to this

    def processor_steps(self, defaults: Any) -> tuple[list, list]:
        """LeRobot 0.6.1's pi0.5 pipelines: rename, to_batch, relative actions (disabled),
        normalizer, state-into-prompt, tokenizer, device; unnormalizer, absolute actions
        (disabled), device (cpu)."""
        from lerobot_pipe.policies.pi0.processor_pi0 import pi_processor_steps

        return pi_processor_steps(self, defaults)
