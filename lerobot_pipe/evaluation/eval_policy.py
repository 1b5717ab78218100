"""What ``lerobot-eval`` (scripts/eval.py) and the pipeline's evaluate job run: roll a trained
policy out in simulation, with LeRobot 0.6.1's flags, rollout semantics and ``eval_info.json``.

    lerobot-eval --policy.path=outputs/train/act/checkpoints/last/pretrained_model \\
        --env.type=pusht --eval.n_episodes=10 --eval.batch_size=2
    lerobot-eval --policy.path=me/act_synthetic --env.type=synthetic --env.cameras='["top"]'

``--policy.path``: a pretrained-model folder, a checkpoint step folder (or ``last``), an EMA
policy folder (``<step>/pretrained_model_ema``), a LoRA adapter folder, or a Hub repo id. The
policy's own processors (from its folder) normalize its inputs and unnormalize its actions.

Writes ``<output_dir>/eval_info.json`` and the first 10 episodes' videos under
``<output_dir>/videos/<task_group>_<task_id>/``. Bad input (a flag, an unknown env type, a
missing simulator, a policy whose features the environment does not deliver) exits with status 2
before any rollout, with a one-line reason; a failed evaluation exits with 1.
"""

from __future__ import annotations

import datetime as dt
import logging
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from lerobot_pipe import envs  # noqa: F401 - registers the --env.type choices
from lerobot_pipe.configs.envs import EnvConfig

MAX_VIDEOS = 10  # LeRobot's lerobot-eval renders the first 10 episodes

log = logging.getLogger("lerobot_pipe.eval")


@dataclass
class EvalPolicyOptions:
    # the policy: a local pretrained-model / checkpoint / LoRA folder or a Hub repo id
    path: str | None = None
    device: str | None = None  # cpu, cuda, cuda:1 ... (default: the GPU if there is one)
    use_amp: bool | None = None  # autocast the forward (default: the policy config's use_amp)


@dataclass
class EvalOptions:
    n_episodes: int = 50  # episodes to roll out
    # environments stepped together (a vector env); 0: LeRobot's rule, 70 % of the CPU cores
    # (at least 1), at most n_episodes and 64
    batch_size: int = 0
    # sub-environments in their own processes (AsyncVectorEnv, forkserver) when batch_size > 1
    use_async_envs: bool = True


@dataclass
class EvalPipelineOptions:
    """Evaluate a policy in a simulated environment (LeRobot 0.6.1's lerobot-eval): episode i is
    seeded --seed + i; success, sum and max reward per episode as LeRobot computes them."""

    env: EnvConfig | None = None  # --env.type=pusht|aloha|synthetic, then --env.<field>
    eval: EvalOptions = field(default_factory=EvalOptions)
    policy: EvalPolicyOptions = field(default_factory=EvalPolicyOptions)
    output_dir: str | None = None  # default: outputs/eval/<date>/<time>_<job_name>
    job_name: str | None = None  # default: <env type>_<policy type>
    seed: int | None = 1000  # the first episode's seed (and the RNGs'); null: unseeded
    # environment observation key -> the policy's key, applied by the policy's preprocessor
    rename_map: dict[str, str] = field(default_factory=dict)


class BadInput(ValueError):
    """Refused before any rollout (exit status 2)."""


def _device(requested: str | None) -> str:
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise BadInput(f"--policy.device={requested}: no CUDA device is available (pass cpu)")
    return requested


def prepare(options: EvalPipelineOptions):
    """Everything checked and built before the first rollout: (env config, policy config,
    policy folder, vector env, batch size). BadInput when something does not fit."""
    from lerobot_pipe.configs.policies import PreTrainedConfig
    from lerobot_pipe.envs.factory import (
        EnvError,
        _import_env_package,
        auto_batch_size,
        check_policy_features,
        delivered_features,
        make_env,
    )
    from lerobot_pipe.utils.locate import local_policy_folder

    if options.env is None:
        raise BadInput(
            f"--env.type is required; choose one of: {', '.join(EnvConfig.known_choices())}"
        )
    if not options.policy.path:
        raise BadInput("--policy.path is required (a policy folder, a checkpoint or a Hub repo id)")
    if options.eval.n_episodes < 1:
        raise BadInput(f"--eval.n_episodes={options.eval.n_episodes}: at least 1")
    if options.eval.batch_size < 0:
        raise BadInput(f"--eval.batch_size={options.eval.batch_size}: 0 (auto) or more")
    env_cfg = options.env
    try:
        _import_env_package(env_cfg)
    except EnvError as e:
        raise BadInput(str(e)) from None
    try:
        folder = local_policy_folder(options.policy.path)
        policy_cfg = PreTrainedConfig.from_pretrained(folder)
    except (FileNotFoundError, ValueError) as e:
        raise BadInput(f"--policy.path={options.policy.path}: {e}") from None
    policy_cfg.device = _device(options.policy.device)
    if options.policy.use_amp is not None:
        policy_cfg.use_amp = options.policy.use_amp
    batch_size = options.eval.batch_size or auto_batch_size(options.eval.n_episodes)
    batch_size = min(batch_size, options.eval.n_episodes)
    try:
        env = make_env(env_cfg, batch_size, options.eval.use_async_envs)
    except EnvError as e:  # what to install, or the simulator that failed to start
        raise BadInput(str(e)) from None
    try:
        delivered = delivered_features(env.single_observation_space, env.single_action_space)
        check_policy_features(
            policy_cfg.input_features,
            policy_cfg.output_features,
            delivered,
            options.rename_map,
            f"--env.type={env_cfg.type} ({env_cfg.gym_id})",
        )
    except EnvError as e:
        env.close()
        raise BadInput(str(e)) from None
    return env_cfg, policy_cfg, folder, env, batch_size


def run(options: EvalPipelineOptions) -> dict:
    """Prepare (BadInput), then evaluate and write eval_info.json; returns it."""
    import torch

    from lerobot_pipe.evaluation.info import eval_info, task_metrics, write_eval_info
    from lerobot_pipe.evaluation.rollout import evaluate
    from lerobot_pipe.policies.factory import make_pre_post_processors
    from lerobot_pipe.policies.peft import load_pretrained_policy
    from lerobot_pipe.processors.pipeline import ProcessorError
    from lerobot_pipe.utils.random import seed_everything

    env_cfg, policy_cfg, folder, env, batch_size = prepare(options)
    try:
        job_name = options.job_name or f"{env_cfg.type}_{policy_cfg.type}"
        if options.output_dir:
            output_dir = Path(options.output_dir)
        else:
            now = dt.datetime.now()
            output_dir = Path("outputs/eval") / f"{now:%Y-%m-%d}" / f"{now:%H-%M-%S}_{job_name}"
        overrides = {
            "device_processor": {"device": policy_cfg.device},
            "rename_observations_processor": {"rename_map": dict(options.rename_map)},
        }
        try:
            pre, post = make_pre_post_processors(
                policy_cfg, folder, preprocessor_overrides=overrides
            )
        except (FileNotFoundError, ProcessorError) as e:
            raise BadInput(f"--policy.path={options.policy.path}: {e}") from None
        if options.seed is not None:
            seed_everything(options.seed)
        policy = load_pretrained_policy(folder, policy_cfg).to(policy_cfg.device)
        policy.eval()
        log.info(
            "evaluating %s on %s: %d episodes, %d envs, seeds from %s, output %s",
            folder,
            env_cfg.gym_id,
            options.eval.n_episodes,
            batch_size,
            options.seed,
            output_dir,
        )
        ((task_group, task_id),) = env_cfg.task_groups()
        device_type = torch.device(policy_cfg.device).type
        amp = torch.autocast(device_type=device_type) if policy_cfg.use_amp else nullcontext()
        with torch.no_grad(), amp:
            result = evaluate(
                env,
                policy,
                pre,
                post,
                options.eval.n_episodes,
                options.seed,
                videos_dir=output_dir / "videos" / f"{task_group}_{task_id}",
                max_videos=MAX_VIDEOS,
                fps=env.metadata.get("render_fps", env_cfg.fps),
            )
    finally:
        env.close()
    metrics = task_metrics(result["episodes"], result["video_paths"])
    info = eval_info([(task_group, task_id, metrics)], result["eval_s"])
    write_eval_info(output_dir / "eval_info.json", info)
    overall = info["overall"]
    log.info(
        "success %.1f %%, avg sum reward %.4f, avg max reward %.4f (%d episodes, %.1f s)",
        overall["pc_success"],
        overall["avg_sum_reward"],
        overall["avg_max_reward"],
        overall["n_episodes"],
        overall["eval_s"],
    )
    print(output_dir / "eval_info.json")
    return info
