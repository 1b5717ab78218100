"""pi0.5 (policy type "pi05"): pi0's model (lerobot_pipe/policies/pi0/modeling_pi0.py) with
AdaRMS norms in the expert conditioned on the flow time, and no state token."""

from __future__ import annotations

from lerobot_pipe.policies.pi0.modeling_pi0 import PiPolicyBase
from lerobot_pipe.policies.pi05.configuration_pi05 import PI05Config


class PI05Policy(PiPolicyBase):
    """pi0.5 (policy type "pi05")."""

    config_class = PI05Config
    name = "pi05"
    _pi05 = True
    # LeRobot's default pi0.5 LoRA targets: pi0's pattern (so pi0.5's time_mlp_* is not
    # targeted).
    _peft_target_modules = (
        r"(.*\.gemma_expert\..*\.self_attn\.(q|v)_proj|model\.(state_proj|action_in_proj"
        r"|action_out_proj|action_time_mlp_in|action_time_mlp_out))"
    )
