"""Our lerobot-eval against LeRobot 0.6.1's on the same checkpoints, in gym-pusht.

Two tiny ACTs on PushT's features (observation.image 96x96, observation.state, action (2,)),
trained 2 steps on a small recorded dataset: one by lerobot_pipe, one by LeRobot's lerobot-train.
Each is evaluated by both lerobot-evals with --eval.batch_size 1 and 2 (3 episodes, so the second
batch of 2 is padded, 50 steps): the per-episode sum reward, max reward and success must be
the same (successes identical; rewards to REL, see there), and our eval_info.json must carry
every key of LeRobot's.

LeRobot needs gym-pusht in its venv (``lerobot[pusht]``); LEROBOT_UPSTREAM_SIM_PATH names a folder
to put on its PYTHONPATH instead (``pip install --no-deps --target``). LeRobot runs with
--eval.use_async_envs=false: 0.6.1's AsyncVectorEnv workers (forkserver) do not import gym_pusht
and fail with NamespaceNotFound. Ours runs batch 2 both ways.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import tiny_act_flags
from upstream import find_upstream

sys.path.insert(0, str(Path(__file__).parent))

pytestmark = pytest.mark.interop
pytest.importorskip("gym_pusht", reason="the [sim] extra (gym-pusht) is not installed")

from pusht_data import write_pusht_dataset  # noqa: E402

SIM_PATH = "LEROBOT_UPSTREAM_SIM_PATH"
STEPS = 2
EPISODES, LENGTH = 3, 50
TIMEOUT = 300
# Our ACT and LeRobot's agree to float32 rounding, not bit for bit (other torch builds); where the
# agent pushes the T, PushT's contact physics carries that to ~1e-6 relative in 50 steps (as a
# batch of 2 instead of 1 does within LeRobot itself). Where it does not, the figures are equal.
REL = 1e-5
ACT = {
    "policy.pretrained_backbone_weights": "null",
    "batch_size": 4,
    "steps": STEPS,
    "save_freq": STEPS,
}
# (checkpoint, batch size, our use_async_envs)
CASES = [
    (ckpt, batch, use_async)
    for ckpt in ("ours", "lerobot")
    for batch, use_async in ((1, False), (2, False), (2, True))
]


def _case_name(ckpt: str, batch: int, use_async: bool) -> str:
    return f"{ckpt}_b{batch}{'_async' if use_async else ''}"


def _eval_args(policy: Path, batch: int, use_async: bool, out: Path) -> list[str]:
    return [
        f"--policy.path={policy}",
        "--env.type=pusht",
        f"--env.episode_length={LENGTH}",
        f"--eval.n_episodes={EPISODES}",
        f"--eval.batch_size={batch}",
        f"--eval.use_async_envs={str(use_async).lower()}",
        "--policy.device=cpu",
        f"--output_dir={out}",
    ]


@pytest.fixture(scope="module")
def upstream_sim():
    found, why = find_upstream()
    if found is None:
        pytest.skip(why)
    extra = {"PYTHONPATH": os.environ[SIM_PATH]} if os.environ.get(SIM_PATH) else {}
    probe = subprocess.run(
        [str(found.python), "-c", "import gym_pusht"],
        env=found.env(Path("/tmp"), **extra),
        capture_output=True,
    )
    if probe.returncode:
        pytest.skip(
            f"LeRobot's venv has no gym_pusht: install lerobot[pusht]==0.6.1 there, or set "
            f"{SIM_PATH}=<folder of `pip install --no-deps --target DIR gym-pusht pymunk pygame "
            "shapely cffi pycparser`>"
        )
    return found, extra


@pytest.fixture(scope="module")
def evaluations(upstream_sim, tmp_path_factory):
    """{case: (LeRobot's eval_info, ours)} for every case."""
    from tiny import run_train

    from lerobot_pipe.configs.parser import parse_options
    from lerobot_pipe.evaluation.eval_policy import EvalPipelineOptions, run

    upstream, extra = upstream_sim
    root = tmp_path_factory.mktemp("pusht_eval")
    dataset = write_pusht_dataset(root / "pusht", episodes=4, length=30)
    le_train = upstream.start(
        [
            "lerobot-train",
            *tiny_act_flags(**ACT),
            "--dataset.repo_id=local/pusht",
            f"--dataset.root={dataset}",
            "--wandb.enable=false",
            "--policy.device=cpu",
            "--policy.push_to_hub=false",
            f"--output_dir={root / 'le_train'}",
        ],
        cwd=root,
        log=root / "le_train.log",
    )
    run_train(
        [*tiny_act_flags(**ACT, **{"dataset.root": dataset}), f"--output_dir={root / 'our_train'}"]
    )
    if le_train.wait(TIMEOUT) != 0:
        pytest.fail(f"LeRobot's lerobot-train failed:\n{le_train.tail()}", pytrace=False)
    policies = {
        "ours": root / "our_train/checkpoints/000002/pretrained_model",
        "lerobot": root / "le_train/checkpoints/000002/pretrained_model",
    }
    le_cases = sorted({(c, b) for c, b, _ in CASES})
    le_out = {case: root / "le" / f"{case[0]}_b{case[1]}" for case in le_cases}
    runs_file = root / "le_runs.json"
    runs_file.write_text(
        json.dumps([_eval_args(policies[c], b, False, le_out[(c, b)]) for c, b in le_cases])
    )
    driver = Path(__file__).with_name("lerobot_eval_driver.py")
    with open(root / "le_eval.log", "w") as log:
        le_eval = subprocess.Popen(
            [str(upstream.python), str(driver), str(runs_file)],
            env=upstream.env(root / ".hf_home", **extra),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        ours = {}
        for c, b, a in CASES:
            args = _eval_args(policies[c], b, a, root / "ours" / _case_name(c, b, a))
            options, _ = parse_options(EvalPipelineOptions, args)
            ours[(c, b, a)] = run(options)
        rc = le_eval.wait(TIMEOUT)
    if rc != 0:
        tail = (root / "le_eval.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"LeRobot's lerobot-eval failed:\n{tail}", pytrace=False)
    theirs = {case: json.loads((le_out[case] / "eval_info.json").read_text()) for case in le_cases}
    return {case: (theirs[case[:2]], ours[case]) for case in CASES}


# The cases' ids, written out for docs/compatibility.md's check.
CASE_IDS = ["ours_b1", "ours_b2", "ours_b2_async", "lerobot_b1", "lerobot_b2", "lerobot_b2_async"]
assert [_case_name(*c) for c in CASES] == CASE_IDS


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_same_episodes_as_lerobot_eval(evaluations, case):
    theirs, ours = evaluations[case]
    le, our = theirs["per_task"][0]["metrics"], ours["per_task"][0]["metrics"]
    assert our["successes"] == le["successes"]
    for key in ("sum_rewards", "max_rewards"):
        assert our[key] == pytest.approx(le[key], rel=REL, abs=1e-12), key
    assert our["seeds"] == [1000 + i for i in range(EPISODES)]
    assert ours["overall"]["n_episodes"] == theirs["overall"]["n_episodes"] == EPISODES
    assert ours["overall"]["pc_success"] == theirs["overall"]["pc_success"]
    # Videos of the evaluated episodes only; LeRobot also renders the padding of a last partial
    # batch (3 episodes in batches of 2: 4 videos).
    batch = case[1]
    assert len(our["video_paths"]) == EPISODES
    assert len(le["video_paths"]) == -(-EPISODES // batch) * batch
    assert all(Path(v).stat().st_size > 0 for v in our["video_paths"])


def test_rollouts_are_not_trivial(evaluations):
    """The policies move the T in some episode (its reward changes): the comparison covers the
    policies' actions and the physics, not only the seeded start."""
    moved = 0
    for theirs, _ in evaluations.values():
        m = theirs["per_task"][0]["metrics"]
        pairs = zip(m["sum_rewards"], m["max_rewards"], strict=True)
        moved += sum(abs(total - LENGTH * top) > 1e-9 for total, top in pairs)
    assert moved > 0


def _keys(value, path=""):
    if isinstance(value, dict):
        out = set()
        for k, v in value.items():
            out |= {f"{path}/{k}"} | _keys(v, f"{path}/{k}")
        return out
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return _keys(value[0], f"{path}[]")
    return set()


def test_eval_info_has_every_key_of_lerobots(evaluations):
    theirs, ours = evaluations[("ours", 1, False)]
    assert _keys(theirs) <= _keys(ours), sorted(_keys(theirs) - _keys(ours))
    assert _keys(ours) - _keys(theirs) == {"/per_task[]/metrics/seeds"}
