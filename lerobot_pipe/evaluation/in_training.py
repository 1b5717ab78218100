"""Rollouts in simulation during training (``--env.*`` every ``--env_eval_freq`` steps), on every
rank, with per-episode results that do not depend on the world size or the topology.

The episodes are lerobot-eval's (:mod:`lerobot_pipe.evaluation.rollout`): episode ``i`` seeded
``--seed + i``, in batches of ``--eval.batch_size`` (one vector env of that many sub-envs, a last
partial batch run full), so each batch is the same rollout whichever rank runs it. Batch ``b``
runs on rank ``b mod W`` in round ``b // W``. Under FSDP2 / HSDP a forward is a collective, so
the ranks roll out in lockstep: a rank with no batch left in a round runs a padding batch
(reset, then nothing), and within a round every rank calls the policy once per step until every
rank's batch has ended (one all-reduce of a flag per step), a rank whose episodes are over
calling it again on its last observation and dropping the actions. The policies call their
forward after a fixed number of ``select_action`` calls since their ``reset``, so the ranks'
forwards stay in step. With DDP (the policy whole on every rank) each rank runs its own batches
at its own pace and skips the padding. A stochastic policy's draws are keyed
by (seed, episode, step) (``batch["sample_key"]``, :func:`rollout_keys`), not by the rank.
The main rank gathers the results and writes ``<output_dir>/eval/<step>/eval_info.json``
(lerobot-eval's layout, :mod:`lerobot_pipe.evaluation.info`) and the first
:data:`MAX_VIDEOS` episodes' videos under ``<output_dir>/eval/<step>/videos/``; checkpoint
folders are never touched.

LeRobot 0.6.1 instead rolls out on the main process only (the other ranks wait), with torch's
global RNG, and writes no results file; its main branch refuses to evaluate a sharded model.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lerobot_pipe import constants as C
from lerobot_pipe.configs.envs import EnvConfig
from lerobot_pipe.datasets.transforms import sample_keys
from lerobot_pipe.distributed.runtime import broadcast_from_main, gather_objects
from lerobot_pipe.evaluation.info import eval_info, task_metrics, write_eval_info
from lerobot_pipe.evaluation.rollout import EpisodeResult, batches, episode_results, rollout
from lerobot_pipe.evaluation.video import write_video

log = logging.getLogger(__name__)

MAX_VIDEOS = 4  # LeRobot's lerobot-train renders the first 4 episodes of each evaluation
# Rollout keys are sample_keys at stream positions from 2**62 on (the training stream starts at
# 0, the held-out frames at 2**63): episode e, step t at 2**62 + e * 2**24 + t.
ROLLOUT_KEY_BASE = np.uint64(2**62)
ROLLOUT_STEP_BITS = 24


def rollout_keys(seed: int, episodes: list[int], step: int) -> torch.Tensor:
    """The int64 keys of ``episodes`` at ``step``: a pure function of (seed, episode, step)."""
    positions = (
        ROLLOUT_KEY_BASE
        + (np.asarray(episodes, dtype=np.uint64) << np.uint64(ROLLOUT_STEP_BITS))
        + np.uint64(step)
    )
    return torch.from_numpy(sample_keys(seed, positions).view(np.int64).copy())


def rank_rounds(
    n_episodes: int, batch_size: int, rank: int, world_size: int
) -> list[tuple[list[int], bool]]:
    """This rank's batches, one per round: (episode indices, is padding). Every rank gets the
    same number of rounds; a padding batch's indices lie past every real batch's."""
    everything = batches(n_episodes, batch_size)
    rounds = math.ceil(len(everything) / world_size)
    out = []
    for k in range(rounds):
        b = k * world_size + rank
        if b < len(everything):
            out.append((everything[b], False))
        else:
            out.append((list(range(b * batch_size, (b + 1) * batch_size)), True))
    return out


def _all_done(device: torch.device):
    """The lockstep collective: whether every rank's batch has ended (no process group: this
    one's)."""
    if not dist.is_initialized():
        return lambda ended: ended
    flag = torch.zeros(1, dtype=torch.int32, device=device)

    def all_done(ended: bool) -> bool:
        flag.fill_(0 if ended else 1)
        dist.all_reduce(flag, op=dist.ReduceOp.SUM)
        return int(flag.item()) == 0

    return all_done


def eval_batch_size(n_episodes: int, batch_size: int) -> int:
    """``--eval.batch_size`` (0: lerobot-eval's rule on the main rank's machine, the same on
    every rank: the batches decide the episodes' results), at most ``n_episodes``."""
    from lerobot_pipe.envs.factory import auto_batch_size

    size = batch_size or broadcast_from_main(auto_batch_size(n_episodes))
    return min(size, n_episodes)


@dataclass
class InTrainingEval:
    """The run's environment (made once, on every rank) and what each evaluation needs."""

    env_cfg: EnvConfig
    n_episodes: int
    batch_size: int
    seed: int
    output_dir: Path
    total_steps: int
    rank: int
    world_size: int
    device: torch.device
    lockstep: bool  # the policy's forward is a collective (FSDP2 / HSDP)
    use_async_envs: bool = False
    env: Any = None

    def open(self) -> InTrainingEval:
        from lerobot_pipe.envs.factory import make_env

        self.env = make_env(self.env_cfg, self.batch_size, self.use_async_envs)
        return self

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    def step_dir(self, step: int) -> Path:
        from lerobot_pipe.checkpoint.layout import step_folder_name

        return self.output_dir / C.EVAL_DIR / step_folder_name(step, self.total_steps)

    def run(
        self,
        policy,
        preprocessor,
        postprocessor,
        step: int,
        autocast: contextlib.AbstractContextManager | None = None,
    ) -> dict[str, Any] | None:
        """Collective: every rank rolls out its share; the main rank writes eval_info.json and
        returns it (None elsewhere). ``policy`` is the (possibly sharded) policy itself, put in
        eval mode for the rollouts and back in training mode after."""
        start = time.perf_counter()
        env = self.env
        ((task_group, task_id),) = self.env_cfg.task_groups()
        videos_dir = self.step_dir(step) / C.EVAL_VIDEOS_DIR / f"{task_group}_{task_id}"
        fps = env.metadata.get("render_fps", self.env_cfg.fps)
        all_done = _all_done(self.device) if self.lockstep else None
        results: dict[int, EpisodeResult] = {}
        videos: dict[int, str] = {}
        policy.eval()
        try:
            with torch.no_grad(), autocast or contextlib.nullcontext():
                for indices, padding in rank_rounds(
                    self.n_episodes, self.batch_size, self.rank, self.world_size
                ):
                    if padding and all_done is None:
                        continue
                    seeds = [self.seed + i for i in indices]
                    shown = (
                        0 if padding else sum(i < min(MAX_VIDEOS, self.n_episodes) for i in indices)
                    )
                    data = rollout(
                        env,
                        policy,
                        preprocessor,
                        postprocessor,
                        seeds,
                        shown,
                        step_keys=lambda t, ix=indices: rollout_keys(self.seed, ix, t),
                        all_done=all_done,
                        padding=padding,
                    )
                    if padding:
                        continue
                    batch_results = episode_results(data, indices, seeds)
                    results |= {r.index: r for r in batch_results if r.index < self.n_episodes}
                    for k in range(shown):
                        videos_dir.mkdir(parents=True, exist_ok=True)
                        path = videos_dir / f"eval_episode_{indices[k]}.mp4"
                        write_video(path, data["frames"][k][: batch_results[k].done_step + 1], fps)
                        videos[indices[k]] = str(path)
        finally:
            policy.train()
        gathered = gather_objects((results, videos))
        if gathered is None:
            return None
        episodes: dict[int, EpisodeResult] = {}
        paths: dict[int, str] = {}
        for rank_results, rank_videos in gathered:
            episodes |= rank_results
            paths |= rank_videos
        if sorted(episodes) != list(range(self.n_episodes)):
            raise RuntimeError(f"gathered episodes {sorted(episodes)} of {self.n_episodes}")
        metrics = task_metrics(episodes, [paths[i] for i in sorted(paths)])
        info = eval_info([(task_group, task_id, metrics)], time.perf_counter() - start)
        write_eval_info(self.step_dir(step) / C.EVAL_INFO, info)
        return info


def summary(info: dict[str, Any], step: int) -> dict[str, Any]:
    """The metrics.jsonl record of one evaluation (the trackers get it as ``eval/<key>``:
    LeRobot's ``eval/pc_success``, ``eval/avg_sum_reward``, ``eval/eval_s`` ...)."""
    overall = info["overall"]
    eval_s = overall["eval_s"]
    return {
        "step": step,
        "pc_success": overall["pc_success"],
        "avg_sum_reward": overall["avg_sum_reward"],
        "avg_max_reward": overall["avg_max_reward"],
        "n_episodes": overall["n_episodes"],
        "eval_s": eval_s,
        "episodes_per_s": overall["n_episodes"] / eval_s if eval_s > 0 else 0.0,
    }


def describe(record: dict[str, Any], env_type: str) -> str:
    """The log line of one evaluation's summary record."""
    return (
        f"step {record['step']}: {env_type} success {record['pc_success']:.1f} %, avg sum "
        f"reward {record['avg_sum_reward']:.4f}, avg max reward {record['avg_max_reward']:.4f} "
        f"({record['n_episodes']} episodes, {record['eval_s']:.1f} s)"
    )


def check_env(env_cfg: EnvConfig, policy_cfg, rename_map: dict[str, str]) -> None:
    """Before launch: the simulator is installed, the environment starts, and it delivers what
    the policy takes (lerobot-eval's checks, on one sub-env). ValueError (one line) otherwise."""
    from lerobot_pipe.envs.factory import check_policy_features, delivered_features, make_env

    env = make_env(env_cfg, 1)  # EnvError (a ValueError): what to install, or why it failed
    try:
        delivered = delivered_features(env.single_observation_space, env.single_action_space)
    finally:
        env.close()
    check_policy_features(
        policy_cfg.input_features,
        policy_cfg.output_features,
        delivered,
        rename_map,
        f"--env.type={env_cfg.type} ({env_cfg.gym_id})",
    )
