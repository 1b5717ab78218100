"""The synthetic reaching task as an environment (--env.type=synthetic): the dataset's dynamics
and frames exactly, its scripted expert succeeds every time, an untrained policy rarely, and
evaluation episodes are never the dataset's."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("gymnasium", reason="the [sim] extra (gymnasium) is not installed")

from lerobot_pipe.datasets.synthetic import _rollout, render  # noqa: E402
from lerobot_pipe.envs.configs import SyntheticEnv  # noqa: E402
from lerobot_pipe.envs.factory import delivered_features, make_env  # noqa: E402
from lerobot_pipe.envs.synthetic import ScriptedExpert, SyntheticReachEnv  # noqa: E402
from lerobot_pipe.evaluation.info import eval_info, task_metrics  # noqa: E402
from lerobot_pipe.evaluation.rollout import evaluate  # noqa: E402


def _identity(x):
    return x


def test_stepping_a_dataset_episode_reproduces_its_states_and_frames():
    """Episode e of the dataset of seed 7 starts here from reset(options={"dataset_episode":
    [7, e]}); its actions give back its observation.state, observation.environment_state and
    both cameras' frames, bit for bit."""
    episodes, length, size = 3, 40, 32
    columns, goals = _rollout(episodes, length, 10, seed=7)
    env = SyntheticReachEnv(cameras=["top", "wrist"], image_size=size)
    for e in range(episodes):
        rows = slice(e * length, (e + 1) * length)
        states, actions = columns["observation.state"][rows], columns["action"][rows]
        obs, _ = env.reset(options={"dataset_episode": [7, e]})
        for t in range(length):
            assert obs["agent_pos"].tobytes() == states[t].tobytes(), (e, t)
            env_state = columns["observation.environment_state"][rows][t]
            assert obs["environment_state"].tobytes() == env_state.tobytes()
            for view in ("top", "wrist"):
                expected = render(view, states[t : t + 1], goals[e : e + 1], size)[0]
                assert np.array_equal(obs["pixels"][view], expected), (e, t, view)
            obs, *_ = env.step(actions[t])


def test_reward_success_and_termination():
    env = SyntheticReachEnv()
    env.reset(options={"start": [0.0, 0.0], "goal": [0.5, 0.0]})
    _, reward, terminated, truncated, info = env.step(np.array([0.3, 0.0], np.float32))
    assert reward == pytest.approx(-0.2) and not terminated and not truncated
    assert info == {"is_success": False, "distance": pytest.approx(0.2)}
    _, reward, terminated, _, info = env.step(np.array([0.45, 0.0], np.float32))
    assert terminated and info["is_success"] and reward == pytest.approx(-0.05)


def test_evaluation_seeds_are_not_the_datasets():
    """reset(seed=s) draws from [s, EVAL_STREAM], a dataset's episode e from [seed, e,
    DATASET_STREAM]: no evaluation start is a dataset start, and one seed gives one episode in
    any process."""
    env, other = SyntheticReachEnv(), SyntheticReachEnv()
    columns, _ = _rollout(50, 1, 10, seed=0)
    dataset_starts = columns["observation.state"]
    for seed in [*range(50), *range(1000, 1050)]:
        start = env.reset(seed=seed)[0]["agent_pos"]
        assert np.abs(dataset_starts - start).max(axis=1).min() > 1e-6, seed
        assert other.reset(seed=seed)[0]["agent_pos"].tobytes() == start.tobytes()


def test_declared_features_are_delivered():
    cfg = SyntheticEnv(cameras=["top", "wrist"], image_size=48)
    env = make_env(cfg, 1)
    delivered = delivered_features(env.single_observation_space, env.single_action_space)
    env.close()
    assert delivered == {
        "observation.images.top": {"type": "VISUAL", "shape": [3, 48, 48]},
        "observation.images.wrist": {"type": "VISUAL", "shape": [3, 48, 48]},
        "observation.state": {"type": "STATE", "shape": [2]},
        "observation.environment_state": {"type": "ENV", "shape": [2]},
        "action": {"type": "ACTION", "shape": [2]},
    }
    declared = {k: v["shape"] for k, v in cfg.features.items()}
    assert declared["pixels/top"] == [48, 48, 3] and declared["agent_pos"] == [2]


# (AsyncVectorEnv: evaluation/test_eval_pusht_interop.py; its workers take ~20 s to start here.)
@pytest.mark.parametrize("batch_size", [1, 4])
def test_scripted_expert_scores_100_percent(batch_size):
    """The expert (noise-free) reaches every goal within the default 50 steps (at most 29 are
    needed at 10 fps); results keyed by episode index, episode i seeded 1000 + i."""
    env = make_env(SyntheticEnv(), batch_size)
    try:
        result = evaluate(env, ScriptedExpert(), _identity, _identity, 10, 1000)
    finally:
        env.close()
    episodes = result["episodes"]
    assert sorted(episodes) == list(range(10))
    assert [episodes[i].seed for i in range(10)] == [1000 + i for i in range(10)]
    assert all(r.success for r in episodes.values())
    assert max(r.done_step for r in episodes.values()) < 29
    info = eval_info([("synthetic", 0, task_metrics(episodes, []))], result["eval_s"])
    assert info["overall"]["pc_success"] == 100.0
    json.dumps(info)  # serialisable as written


def test_untrained_policy_scores_clearly_less(untrained_policy, tmp_path):
    """lerobot-eval end to end (the console script's main) on an ACT trained one step: far below
    the expert's 100 %; eval_info.json, the seeds and the first episodes' videos are written."""
    from lerobot_pipe.scripts.eval import main

    out = tmp_path / "eval"
    argv = [
        f"--policy.path={untrained_policy}",
        "--env.type=synthetic",
        "--eval.n_episodes=6",
        "--eval.batch_size=3",
        "--eval.use_async_envs=false",
        "--policy.device=cpu",
        f"--output_dir={out}",
    ]
    assert main(argv) == 0
    info = json.loads((out / "eval_info.json").read_text())
    assert info["overall"]["n_episodes"] == 6
    print(f"untrained ACT: {info['overall']['pc_success']} % success (the expert: 100 %)")
    assert info["overall"]["pc_success"] <= 50.0, info["overall"]
    metrics = info["per_task"][0]["metrics"]
    assert metrics["seeds"] == list(range(1000, 1006))
    videos = sorted((out / "videos" / "synthetic_0").glob("eval_episode_*.mp4"))
    assert [v.name for v in videos] == [f"eval_episode_{i}.mp4" for i in range(6)]
    assert metrics["video_paths"] == [str(v) for v in videos]
    assert all(v.stat().st_size > 0 for v in videos)


def test_eval_videos_are_h264_as_lerobots(tmp_path):
    """PyAV's wheels here carry libx264 (LeRobot's codec); mpeg4 is the documented fallback."""
    import av

    from lerobot_pipe.evaluation.video import video_codec, write_video

    assert video_codec() == "libx264"
    frames = np.stack([render("top", np.zeros((1, 2)), np.ones((1, 2)) * 0.5, 33)[0]] * 4)
    path = tmp_path / "v.mp4"
    write_video(path, frames, 10)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.width, stream.height) == ("h264", 32, 32)
        assert stream.codec_context.pix_fmt == "yuv420p"
