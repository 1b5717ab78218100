"""A small dataset with PushT's features (observation.image 96x96, observation.state (2,),
action (2,)), recorded in gym-pusht by a random-walk agent, for policies that lerobot-eval then
rolls out in --env.type=pusht."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lerobot_pipe.datasets.writer import DatasetWriter, camera_feature

FEATURES = {
    "observation.image": camera_feature("image", 96, 96),
    "observation.state": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
    "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
}
TASK = "Push the T-shaped block onto the T-shaped target."


def write_pusht_dataset(root: Path, episodes: int = 4, length: int = 30, seed: int = 0) -> Path:
    import gym_pusht  # noqa: F401 - registers gym_pusht/PushT-v0
    import gymnasium as gym

    env = gym.make("gym_pusht/PushT-v0", obs_type="pixels_agent_pos", disable_env_checker=True)
    rng = np.random.default_rng(seed)
    writer = DatasetWriter(root, 10, FEATURES, robot_type="2d pointer")
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        images, states, actions = [], [], []
        target = obs["agent_pos"].copy()
        for _ in range(length):
            target = np.clip(target + rng.normal(0, 15, size=2), 0, 512)
            images.append(obs["pixels"])
            states.append(obs["agent_pos"])
            actions.append(target)
            obs, *_ = env.step(target)
        writer.add_episode(
            {
                "observation.state": np.array(states, dtype=np.float32),
                "action": np.array(actions, dtype=np.float32),
            },
            TASK,
            {"observation.image": np.stack(images)},
        )
    writer.finish()
    env.close()
    return root
