"""SmolVLA (a SmolVLM with a flow-matching action expert), registered as policy type "smolvla".

The model needs transformers (``pip install 'lerobot_pipe[smolvla]'``); its config and processor
steps import without it."""

from lerobot_pipe.policies.smolvla.configuration_smolvla import SMOLVLA_TINY_PRESET, SmolVLAConfig
from lerobot_pipe.policies.smolvla.modeling_smolvla import SmolVLAPolicy, VLAFlowMatching
from lerobot_pipe.policies.smolvla.processor_smolvla import (
    NewLineTaskProcessorStep,
    TokenizerProcessorStep,
)

__all__ = [
    "SMOLVLA_TINY_PRESET",
    "NewLineTaskProcessorStep",
    "SmolVLAConfig",
    "SmolVLAPolicy",
    "TokenizerProcessorStep",
    "VLAFlowMatching",
]
