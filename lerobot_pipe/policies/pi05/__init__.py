"""pi0.5 (pi0's backbone with AdaRMS time conditioning and the state in the prompt), registered
as policy type "pi05"."""

from lerobot_pipe.policies.pi05.configuration_pi05 import PI05Config
from lerobot_pipe.policies.pi05.modeling_pi05 import PI05Policy

__all__ = ["PI05Config", "PI05Policy"]
