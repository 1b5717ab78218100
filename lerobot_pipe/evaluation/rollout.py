"""Rollouts of a policy in a vector environment, with LeRobot 0.6.1's semantics, and their
per-episode results keyed by episode index.

One rollout (``rollout``) runs a batch of ``env.num_envs`` episodes from ``env.reset(seed=...)``
until every sub-env has ended once (or ``max_episode_steps``): per step the raw observation is
mapped to the policy's keys (``envs.factory.preprocess_observation``), the task string added
(``task_description`` of the sub-envs, else ``task``, else ""), then the policy's preprocessor,
``select_action`` under inference_mode, its postprocessor, ``env.step``. A step's success comes
from ``info["final_info"]["is_success"]`` (a sub-env that just ended), else
``info["is_success"]``.

``episode_results`` applies LeRobot's mask: an episode's sum and max reward and its success are
taken over the steps up to its first done **plus one** (``arange <= done + 1``). With one env per
batch there is no step after the last; with several, that step belongs to the sub-env's
auto-reset next episode (SAME_STEP autoreset), a known quirk of LeRobot kept here so the figures
match its lerobot-eval.

``evaluate`` runs the episodes in batches: episode ``i`` gets seed ``start_seed + i``, batch ``b``
holds episodes ``b*n .. b*n+n-1`` (a last partial batch still runs full, its extra episodes are
dropped, as LeRobot's). Results are keyed by episode index, so a later caller can split the
episodes (their indices and seeds) across ranks and gather the results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lerobot_pipe.constants import SAMPLE_KEY
from lerobot_pipe.envs.factory import TASK_ATTRIBUTES, preprocess_observation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeResult:
    index: int
    seed: int | None
    sum_reward: float
    max_reward: float
    success: bool
    done_step: int  # the step (0-based) at which the episode ended


def _task_strings(env) -> list[str]:
    if hasattr(env, "task_attribute"):  # probed by make_env (an AsyncVectorEnv)
        name = env.task_attribute
        return list(env.call(name)) if name else [""] * env.num_envs
    for name in TASK_ATTRIBUTES:
        try:
            return list(env.call(name))
        except (AttributeError, NotImplementedError):
            continue
    return [""] * env.num_envs


def _step_successes(info: dict, n: int) -> list[bool]:
    if "final_info" in info:
        final = info["final_info"]
        if isinstance(final, dict):
            ok = final.get("is_success", [False] * n)
            return ok.tolist() if hasattr(ok, "tolist") else [bool(ok)] * n
        return [
            bool(item.get("is_success", False)) if isinstance(item, dict) else False
            for item in final
        ]
    if "is_success" in info:
        ok = info["is_success"]
        return ok.tolist() if hasattr(ok, "tolist") else [bool(ok)] * n
    return [False] * n


def _render(env, count: int) -> np.ndarray:
    if hasattr(env, "envs"):  # SyncVectorEnv
        return np.stack([env.envs[i].render() for i in range(count)])
    return np.stack(list(env.call("render"))[:count])


def rollout(
    env,
    policy,
    preprocessor: Callable[[dict], dict],
    postprocessor: Callable[[torch.Tensor], torch.Tensor],
    seeds: list[int] | None,
    render_count: int = 0,
    *,
    step_keys: Callable[[int], torch.Tensor] | None = None,
    all_done: Callable[[bool], bool] | None = None,
    padding: bool = False,
) -> dict[str, Any]:
    """One batch of episodes: ``reward``, ``success``, ``done`` (cumulative) as (batch, steps)
    tensors, and with ``render_count`` the first sub-envs' frames ``(count, steps + 1, H, W, 3)``.

    ``step_keys(step)``: the sub-envs' int64 keys of that step, given to the policy as
    ``batch["sample_key"]`` (the draws of a stochastic policy). ``all_done(done_here)``: whether
    every rank's batch has ended (a collective). With it the policy is called once per round on
    every rank until all have ended: a batch that has ended here (or a ``padding`` batch, which
    ends at its reset) calls it again on its last observation, its actions dropped, so that a
    policy whose forward is a collective (FSDP2) runs its forwards in lockstep."""
    policy.reset()
    observation, _ = env.reset(seed=seeds)
    frames = [_render(env, render_count)] if render_count else []
    rewards, successes, dones = [], [], []
    done = np.full(env.num_envs, padding, dtype=bool)
    max_steps = env.call("_max_episode_steps")[0]
    step = 0
    batch = None
    while True:
        ended = bool(np.all(done)) or step >= max_steps
        if all_done(ended) if all_done is not None else ended:
            break
        if batch is None or not ended:
            batch = preprocess_observation(observation)
            batch["task"] = _task_strings(env)
            if step_keys is not None:
                batch[SAMPLE_KEY] = step_keys(step)
            batch = preprocessor(batch)
        with torch.inference_mode():
            action = policy.select_action(batch)
        if ended:  # a lockstep call: this rank's episodes are over
            continue
        action = postprocessor(action)
        action_numpy = action.to("cpu").numpy()
        if action_numpy.ndim != 2:
            raise ValueError(
                f"the policy's action must be (batch, action_dim), got {action_numpy.shape}"
            )
        observation, reward, terminated, truncated, info = env.step(action_numpy)
        if render_count:
            frames.append(_render(env, render_count))
        done = terminated | truncated | done
        if step + 1 == max_steps:
            done = np.ones_like(done, dtype=bool)
        rewards.append(torch.from_numpy(np.asarray(reward)))
        successes.append(torch.tensor(_step_successes(info, env.num_envs)))
        dones.append(torch.from_numpy(done))
        step += 1
    if not rewards:  # a padding batch: no step taken
        return {}
    out: dict[str, Any] = {
        "reward": torch.stack(rewards, dim=1),
        "success": torch.stack(successes, dim=1),
        "done": torch.stack(dones, dim=1),
    }
    if render_count:
        out["frames"] = np.stack(frames, axis=1)
    return out


def episode_results(
    data: dict[str, Any], indices: list[int], seeds: list[int] | None
) -> list[EpisodeResult]:
    """Per-episode results of one rollout, with LeRobot's mask (steps up to done + 1)."""
    n_steps = data["done"].shape[1]
    done_indices = torch.argmax(data["done"].to(int), dim=1)  # the first done
    mask = (torch.arange(n_steps)[None, :] <= (done_indices + 1)[:, None]).int()
    sums = (data["reward"] * mask).sum(dim=1).tolist()
    maxes = (data["reward"] * mask).amax(dim=1).tolist()
    success = (data["success"] * mask).any(dim=1).tolist()
    return [
        EpisodeResult(
            index=i,
            seed=None if seeds is None else seeds[k],
            sum_reward=float(sums[k]),
            max_reward=float(maxes[k]),
            success=bool(success[k]),
            done_step=int(done_indices[k]),
        )
        for k, i in enumerate(indices)
    ]


def batches(n_episodes: int, batch_size: int) -> list[list[int]]:
    """The episode indices of each rollout: full batches (the last one padded past
    ``n_episodes``, as LeRobot's eval_policy runs it)."""
    count = -(-n_episodes // batch_size)
    return [list(range(b * batch_size, (b + 1) * batch_size)) for b in range(count)]


def evaluate(
    env,
    policy,
    preprocessor: Callable[[dict], dict],
    postprocessor: Callable[[torch.Tensor], torch.Tensor],
    n_episodes: int,
    start_seed: int | None,
    *,
    episode_batches: list[list[int]] | None = None,
    videos_dir: Path | None = None,
    max_videos: int = 0,
    fps: int = 10,
) -> dict[str, Any]:
    """Roll out ``n_episodes`` (or the given ``episode_batches`` of episode indices, each as
    long as ``env.num_envs``): ``{"episodes": {index: EpisodeResult}, "video_paths": [...],
    "eval_s": seconds}``. Episodes at index >= ``n_episodes`` run (padding) and are dropped."""
    start = time.time()
    was_training = policy.training
    policy.eval()
    results: dict[int, EpisodeResult] = {}
    video_paths: list[str] = []
    try:
        for indices in episode_batches or batches(n_episodes, env.num_envs):
            if len(indices) != env.num_envs:
                raise ValueError(f"a batch of {len(indices)} episodes for {env.num_envs} envs")
            seeds = None if start_seed is None else [start_seed + i for i in indices]
            render_count = min(max(0, max_videos - len(video_paths)), env.num_envs)
            render_count = render_count if videos_dir is not None else 0
            data = rollout(env, policy, preprocessor, postprocessor, seeds, render_count)
            batch_results = episode_results(data, indices, seeds)
            for result in batch_results:
                if result.index < n_episodes:
                    results[result.index] = result
            for k in range(render_count):
                if batch_results[k].index >= n_episodes:
                    break
                from lerobot_pipe.evaluation.video import write_video

                videos_dir.mkdir(parents=True, exist_ok=True)
                path = videos_dir / f"eval_episode_{len(video_paths)}.mp4"
                write_video(path, data["frames"][k][: batch_results[k].done_step + 1], fps)
                video_paths.append(str(path))
            done = sum(r.success for r in results.values())
            log.info("episodes %d/%d, %d successes", len(results), n_episodes, done)
    finally:
        policy.train(was_training)
    return {"episodes": results, "video_paths": video_paths, "eval_s": time.time() - start}
