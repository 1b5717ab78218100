"""pi0 (a PaliGemma with a flow-matching Gemma action expert), registered as policy type "pi0";
pi0.5 shares its backbone (lerobot_pipe/policies/pi05)."""

from lerobot_pipe.policies.pi0.configuration_pi0 import PI_TINY_PRESET, PI0Config, PiConfigBase
from lerobot_pipe.policies.pi0.modeling_pi0 import PI0Policy, PiFlowMatching, PiPolicyBase
from lerobot_pipe.policies.pi0.processor_pi0 import (
    Pi0NewLineProcessor,
    Pi05PrepareStateTokenizerProcessorStep,
)

__all__ = [
    "PI0Config",
    "PI0Policy",
    "PI_TINY_PRESET",
    "Pi05PrepareStateTokenizerProcessorStep",
    "Pi0NewLineProcessor",
    "PiConfigBase",
    "PiFlowMatching",
    "PiPolicyBase",
]
