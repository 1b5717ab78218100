"""Rollouts in simulation during training (``--env.*`` every ``--env_eval_freq`` steps) on every
rank: the same per-episode results (seeds, successes, sum and max rewards) on one process, DDP and
FSDP2 on 2 (3 episodes on 2 ranks: an uneven split, rank 1 pads), equal to lerobot-eval's on the
saved checkpoint, with the EMA weights when ``--ema.use_for_eval``; a stochastic policy (Diffusion,
DDPM sampling) draws its noise by episode and step, so it gives the same results on 1 and 2
ranks too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch import run_distributed
from tiny import DETERMINISTIC, run_train, tiny_act_flags, tiny_diffusion_flags

from lerobot_pipe import constants as C
from lerobot_pipe.evaluation.in_training import rank_rounds, rollout_keys

STEPS = 2
N_EPISODES = 3
EVAL_FLAGS = {
    "steps": STEPS,
    "save_freq": STEPS,
    "env_eval_freq": STEPS,
    "env.type": "synthetic",
    "env.episode_length": 30,
    "eval.n_episodes": N_EPISODES,
    "eval.batch_size": 1,
    "eval.use_async_envs": "false",
}
# EMA weights clearly apart from the live ones after two updates (decay 0, then 0.405).
EMA = {"ema.enable": "true"}
PER_EPISODE = ("sum_rewards", "max_rewards", "successes", "seeds")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    from lerobot_pipe.datasets import write_synthetic_dataset

    return write_synthetic_dataset(
        tmp_path_factory.mktemp("data") / "ds", num_episodes=4, episode_length=20
    )


def _eval_info(out: Path, step: int = STEPS) -> dict:
    return json.loads((out / C.EVAL_DIR / f"{step:06d}" / C.EVAL_INFO).read_text())


def _episodes(info: dict) -> dict[str, list]:
    (task,) = info["per_task"]
    return {k: task["metrics"][k] for k in PER_EPISODE}


def _assert_same_episodes(got: dict, expected: dict, rel: float = 1e-5) -> None:
    assert got["seeds"] == expected["seeds"]
    assert got["successes"] == expected["successes"]
    for key in ("sum_rewards", "max_rewards"):
        assert got[key] == pytest.approx(expected[key], rel=rel), key


@pytest.fixture(scope="module")
def act_runs(data_root, tmp_path_factory):
    """The tiny ACT (deterministic at inference), the same global batch of 4 on one process,
    DDP and FSDP2 on 2, with an EMA used for the rollouts."""
    out = tmp_path_factory.mktemp("env_eval_act")
    flags = tiny_act_flags(**DETERMINISTIC, **EVAL_FLAGS, **EMA, **{"dataset.root": data_root})
    run_train([*flags, "--batch_size=4", f"--output_dir={out / 'single'}"])
    run_distributed(run_train, 2, [*flags, "--batch_size=2", f"--output_dir={out / 'ddp'}"])
    run_distributed(
        run_train,
        2,
        [
            *flags,
            "--batch_size=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
            f"--output_dir={out / 'fsdp'}",
        ],
    )
    return out


def test_rounds_split_batches_and_pad_the_short_rank():
    assert rank_rounds(3, 1, 0, 2) == [([0], False), ([2], False)]
    assert rank_rounds(3, 1, 1, 2) == [([1], False), ([3], True)]
    # lerobot-eval's batches: the last partial one runs full (episode 3 pads episode 2's batch).
    assert rank_rounds(3, 2, 0, 2) == [([0, 1], False)]
    assert rank_rounds(3, 2, 1, 2) == [([2, 3], False)]
    assert rank_rounds(3, 2, 0, 1) == [([0, 1], False), ([2, 3], False)]


def test_rollout_keys_are_a_function_of_episode_and_step():
    keys = rollout_keys(1000, [0, 1, 2], 5)
    assert keys.tolist() == rollout_keys(1000, [2, 0, 1], 5)[[1, 2, 0]].tolist()
    assert len(set(keys.tolist())) == 3
    assert keys.tolist() != rollout_keys(1000, [0, 1, 2], 6).tolist()
    assert keys.tolist() != rollout_keys(1001, [0, 1, 2], 5).tolist()


def test_eval_info_in_lerobot_evals_layout_outside_the_checkpoint(act_runs):
    single = act_runs / "single"
    info = _eval_info(single)
    assert set(info) == {"per_task", "per_group", "overall"}
    assert info["overall"]["n_episodes"] == N_EPISODES
    assert _episodes(info)["seeds"] == [1000, 1001, 1002]
    # The first episodes' videos beside it; the checkpoint folder holds none of it.
    videos = info["overall"]["video_paths"]
    assert [Path(p).name for p in videos] == [f"eval_episode_{i}.mp4" for i in range(3)]
    assert all(
        Path(p).is_relative_to(single / C.EVAL_DIR) and Path(p).stat().st_size for p in videos
    )
    checkpoint = single / C.CHECKPOINTS_DIR / f"{STEPS:06d}"
    assert not list(checkpoint.rglob(C.EVAL_INFO)) and not list(checkpoint.rglob("*.mp4"))


@pytest.fixture(scope="module")
def hsdp_run(data_root, tmp_path_factory):
    """HSDP on 4 processes (2 replicas of 2 shards), batches of 1: 3 episodes on 4 ranks, so
    rank 3 pads the only round."""
    out = tmp_path_factory.mktemp("env_eval_hsdp") / "hsdp"
    flags = tiny_act_flags(**DETERMINISTIC, **EVAL_FLAGS, **EMA, **{"dataset.root": data_root})
    run_distributed(
        run_train,
        4,
        [
            *flags,
            "--batch_size=1",
            "--parallelism.dp_replicate=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=safetensors_dcp",
            f"--output_dir={out}",
        ],
    )
    return out


@pytest.mark.parametrize("topology", ["ddp", "fsdp", "hsdp"])
def test_same_episodes_on_two_ranks_as_on_one(act_runs, topology, request):
    """DDP and FSDP2 on 2 processes (rank 1 pads the second round), HSDP on 4 (rank 3 pads),
    as on one, the weights differing by the reduction order of the gradients only."""
    other = request.getfixturevalue("hsdp_run") if topology == "hsdp" else act_runs / topology
    single = _episodes(_eval_info(act_runs / "single"))
    _assert_same_episodes(_episodes(_eval_info(other)), single)


def test_rollouts_are_not_trivial(act_runs):
    """The episodes differ from each other (the comparison above means something)."""
    episodes = _episodes(_eval_info(act_runs / "single"))
    assert len(set(episodes["sum_rewards"])) == N_EPISODES


def _lerobot_eval(policy_dir: Path, out: Path) -> dict:
    from lerobot_pipe.scripts.eval import main

    flags = [f"--{k}={v}" for k, v in EVAL_FLAGS.items() if k.startswith(("env.", "eval."))]
    assert main([f"--policy.path={policy_dir}", *flags, "--seed=1000", f"--output_dir={out}"]) == 0
    return json.loads((out / C.EVAL_INFO).read_text())


def test_same_episodes_as_lerobot_eval_on_the_ema_policy(act_runs, tmp_path):
    """Evaluated right after the checkpoint of its step, with the EMA weights
    (--ema.use_for_eval, the default): what lerobot-eval gives on pretrained_model_ema/, not on
    the live weights of pretrained_model/."""
    step_dir = act_runs / "single" / C.CHECKPOINTS_DIR / f"{STEPS:06d}"
    in_training = _episodes(_eval_info(act_runs / "single"))
    ema = _episodes(_lerobot_eval(step_dir / C.PRETRAINED_MODEL_EMA_DIR, tmp_path / "ema"))
    assert in_training == ema
    live = _episodes(_lerobot_eval(step_dir / C.PRETRAINED_MODEL_DIR, tmp_path / "live"))
    assert live["sum_rewards"] != ema["sum_rewards"]


def test_eval_summary_in_metrics_jsonl(act_runs):
    lines = (act_runs / "fsdp" / C.METRICS_LOG).read_text().splitlines()
    (record,) = [r for r in map(json.loads, lines) if "pc_success" in r]
    overall = _eval_info(act_runs / "fsdp")["overall"]
    assert record["step"] == STEPS and record["n_episodes"] == N_EPISODES
    for key in ("pc_success", "avg_sum_reward", "avg_max_reward", "eval_s"):
        assert record[key] == overall[key]
    assert record["episodes_per_s"] == pytest.approx(N_EPISODES / overall["eval_s"])


@pytest.fixture(scope="module")
def diffusion_runs(data_root, tmp_path_factory):
    """The tiny Diffusion Policy (DDPM: noise at every denoising step) on 1 and 2 ranks."""
    out = tmp_path_factory.mktemp("env_eval_diffusion")
    one_step = {"steps": 1, "save_freq": 1, "env_eval_freq": 1}
    flags = tiny_diffusion_flags(**{**EVAL_FLAGS, **one_step, "dataset.root": data_root})
    run_train([*flags, "--batch_size=4", f"--output_dir={out / 'single'}"])
    run_distributed(run_train, 2, [*flags, "--batch_size=2", f"--output_dir={out / 'ddp'}"])
    return out


def test_stochastic_policy_same_episodes_on_two_ranks_as_on_one(diffusion_runs):
    single = _episodes(_eval_info(diffusion_runs / "single", step=1))
    _assert_same_episodes(_episodes(_eval_info(diffusion_runs / "ddp", step=1)), single)
    assert len(set(single["sum_rewards"])) == N_EPISODES


def _auto_batch_size_on_a_rank_with_its_own_cores():
    import os

    from lerobot_pipe.distributed.runtime import destroy, init_distributed
    from lerobot_pipe.evaluation.in_training import eval_batch_size

    env = init_distributed()
    os.cpu_count = lambda: 4 if env.rank == 0 else 32  # ranks on machines of their own
    try:
        return eval_batch_size(50, 0), eval_batch_size(3, 8)
    finally:
        destroy()


def test_auto_batch_size_is_the_main_ranks_on_every_rank():
    """--eval.batch_size=0: LeRobot's rule (70 % of the cores) on the main rank, used by all (the
    batches decide the episodes' results); a batch larger than the episodes is cut to them."""
    assert run_distributed(_auto_batch_size_on_a_rank_with_its_own_cores, 2) == [(2, 3), (2, 3)]


def test_rolling_out_leaves_training_as_it_was(data_root, tmp_path):
    """Rollouts at every step draw nothing from the RNGs and leave the weights and modes as they
    were: the losses of a run with dropout and the VAE (randomness each step) are those of the
    same run without --env.*, bit for bit."""
    from tiny import losses

    flags = tiny_act_flags(**{"dataset.root": data_root, "steps": 3, "save_freq": 0})
    run_train([*flags, f"--output_dir={tmp_path / 'plain'}"])
    env = {**EVAL_FLAGS, "steps": 3, "save_freq": 0, "env_eval_freq": 1, "eval.n_episodes": 1}
    run_train(
        [*tiny_act_flags(**env, **{"dataset.root": data_root}), f"--output_dir={tmp_path / 'env'}"]
    )
    assert (tmp_path / "env" / C.EVAL_DIR / "000003" / C.EVAL_INFO).is_file()
    assert losses(tmp_path / "env") == losses(tmp_path / "plain")
