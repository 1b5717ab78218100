"""Simulated environments for evaluation (``--env.type``): their configs (configs.py), how they
are made and checked against a policy (factory.py), and the synthetic reaching task as a
gymnasium environment (synthetic.py, needs gymnasium)."""

from lerobot_pipe.envs.configs import AlohaEnv, PushtEnv, SyntheticEnv, make_env_config

__all__ = ["AlohaEnv", "PushtEnv", "SyntheticEnv", "make_env_config"]
