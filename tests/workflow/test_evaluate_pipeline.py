"""The evaluate stage, as users run it: the default config (the synthetic task without a camera,
300 steps on 2 processes) trained, converted and every checkpoint rolled out with lerobot-eval in
the session's one default run (conftest.py's `default_run`), shared by the tests below: the best
checkpoint by the rule, success rising across the checkpoints far above an untrained policy's,
`-R evaluate` alone, `publish.steps: best` to the local test Hub, and retention that keeps the
best checkpoint while a new checkpoint evaluates only itself."""

from __future__ import annotations

import json

import pytest
from snakemake_runs import RUN, Workspace

from lerobot_pipe.constants import MODEL_SAFETENSORS, PINS_DIR, PRETRAINED_MODEL_DIR

pytestmark = pytest.mark.slow

# The default config, then a test's override over it.
CONFIG = ("--configfile", "config/config.yaml")
STEPS = ["000100", "000200", "000300"]
N_EPISODES = 20


def overall(workspace: Workspace, step: str) -> dict:
    return eval_info(workspace, step)["overall"]


def eval_info(workspace: Workspace, step: str) -> dict:
    return json.loads(workspace.path(f"{RUN}/eval/{step}/eval_info.json").read_text())


def best(workspace: Workspace) -> dict:
    return json.loads(workspace.path(f"{RUN}/eval/best.json").read_text())


def pins(workspace: Workspace) -> list[str]:
    folder = workspace.path(f"{RUN}/train/{PINS_DIR}")
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".tmp"))


def test_every_checkpoint_is_evaluated_and_the_best_follows_the_rule(default_run):
    jobs = default_run.first_result.jobs()
    assert (jobs["train"], jobs["convert"], jobs["evaluate"], jobs["best"]) == (1, 3, 3, 1)
    figures = {}
    for step in STEPS:
        info = eval_info(default_run, step)
        assert info["overall"]["n_episodes"] == N_EPISODES
        assert info["per_task"][0]["metrics"]["seeds"] == list(range(1000, 1000 + N_EPISODES))
        o = info["overall"]
        figures[step] = (o["pc_success"], o["avg_max_reward"], o["avg_sum_reward"], int(step))
    chosen = best(default_run)
    assert chosen["step"] == max(figures, key=figures.get)
    assert pins(default_run) == [f"{chosen['step']}.best"]
    assert f"best {chosen['step']}" in default_run.first_result.output  # the run's summary
    assert default_run.path(f"{RUN}/report/eval.svg").stat().st_size > 0
    table = default_run.path(f"{RUN}/report/checkpoints.html").read_text()
    assert "success %" in table and ">best<" in table


def test_success_rises_across_checkpoints_far_above_an_untrained_policy(default_run, tmp_path):
    """The default's success rises from checkpoint to checkpoint to at least 70 % at the last
    (measured here: 40, 80, 85 %); the same tiny ACT trained 1 step on the same dataset,
    evaluated on the same 20 seeds, scores 5-15 %."""
    success = [overall(default_run, step)["pc_success"] for step in STEPS]
    assert success == sorted(success) and success[-1] >= 70.0, success
    from tiny import run_train, tiny_act_flags

    from lerobot_pipe.scripts.eval import main

    flags = {"dataset.root": default_run.path(f"{RUN}/dataset"), "steps": 1, "save_freq": 1}
    run_train([*tiny_act_flags(**flags, batch_size=4), f"--output_dir={tmp_path / 'train'}"])
    untrained = tmp_path / "train/checkpoints/000001" / PRETRAINED_MODEL_DIR
    argv = [
        f"--policy.path={untrained}",
        "--env.type=synthetic",
        f"--eval.n_episodes={N_EPISODES}",
        "--eval.batch_size=10",
        "--eval.use_async_envs=false",
        "--policy.device=cpu",
        f"--output_dir={tmp_path / 'eval'}",
    ]
    assert main(argv) == 0
    baseline = json.loads((tmp_path / "eval/eval_info.json").read_text())["overall"]["pc_success"]
    trained = best(default_run)["pc_success"]
    print(f"default run: best {trained} % success, untrained {baseline} % ({N_EPISODES} episodes)")
    assert trained >= 60.0 and baseline <= 25.0 and trained >= baseline + 40.0


def test_rerun_evaluate_does_not_train_or_convert(default_run, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    training = run.training_files_mtimes(RUN)
    converted = run.mtimes(f"{RUN}/converted/*/{PRETRAINED_MODEL_DIR}/*")
    before = {step: eval_info(run, step) for step in STEPS}
    result = run.run_ok("--cores", "2", "-R", "evaluate")
    assert result.jobs() == {
        "evaluate": 3,
        "best": 1,
        "plot_eval": 1,
        "checkpoint_table": 1,
        "all": 1,
    }
    assert run.training_files_mtimes(RUN) == training
    assert run.mtimes(f"{RUN}/converted/*/{PRETRAINED_MODEL_DIR}/*") == converted
    for step in STEPS:  # the same seeds, a deterministic policy: the same episodes
        again = eval_info(run, step)["per_task"][0]["metrics"]
        for key in ("successes", "sum_rewards", "max_rewards", "seeds"):
            assert again[key] == before[step]["per_task"][0]["metrics"][key], (step, key)
    assert best(run)["step"] == best(default_run)["step"]


def test_publish_steps_best_publishes_the_best_checkpoint(default_run, hub_server, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    override = run.write_config("best.yaml", {"publish": {"steps": "best"}})
    repo_id = "alice/tiny-act-best"
    hub = ["--config", f"hub_repo_id={repo_id}", f"hub_endpoint={hub_server.url}"]
    result = run.run_ok("--cores", "2", *CONFIG, override, *hub, env=hub_server.env())
    # With segments (the default), after each checkpoint's evaluation the best so far too (here,
    # every evaluation done, the final best each time: one commit, then none).
    jobs = {"publish": 1, "publish_best_so_far": 3, "checkpoint_table": 1, "all": 1}
    assert result.jobs() == jobs
    step = best(run)["step"]
    receipt = json.loads(run.path(f"{RUN}/published/{step}.json").read_text())
    assert receipt["repo_id"] == repo_id and receipt["revision"] == "main"
    published = run.path(f"{RUN}/published")
    files = sorted(p.name for p in published.iterdir() if not p.name.startswith("."))
    assert files == [f"{step}.json", "best_so_far"]  # and the commit lock
    so_far = [json.loads(p.read_text()) for p in sorted(published.glob("best_so_far/*.json"))]
    assert [r["best_step"] for r in so_far] == [step] * 3
    assert {r["commit_id"] for r in so_far} == {receipt["commit_id"]}
    weights = run.path(f"{RUN}/converted/{step}/{PRETRAINED_MODEL_DIR}/{MODEL_SAFETENSORS}")
    assert hub_server.read_file(repo_id, MODEL_SAFETENSORS) == weights.read_bytes()
    assert pins(run) == [f"{step}.best"]  # the publish pin went with the job


def test_retention_keeps_the_best_and_a_new_checkpoint_evaluates_only_itself(default_run, tmp_path):
    """10 more steps with checkpoint_keep_last: 1: only the new step 310 is converted and
    evaluated; retention deleted steps 100 and 200 but kept the best one, pinned, though
    `last` had moved on to 310."""
    run = default_run.clone(tmp_path / "repo")
    chosen = best(run)["step"]
    evaluated = run.mtimes(f"{RUN}/eval/0*/eval_info.json")
    override = run.write_config("more.yaml", {"train": {"steps": 310, "checkpoint_keep_last": 1}})
    result = run.run_ok("--cores", "2", *CONFIG, override)
    jobs = result.jobs()
    assert (jobs["train"], jobs["convert"], jobs["evaluate"], jobs["best"]) == (1, 1, 1, 1)
    assert "step=000310" in result.output
    kept = run.complete_checkpoints(RUN)
    assert kept == sorted({chosen, "000310"})
    after = run.mtimes(f"{RUN}/eval/0*/eval_info.json")
    assert {path: after[path] for path in evaluated} == evaluated  # none evaluated again
    new_best = best(run)
    assert sorted(new_best["candidates"]) == kept
    assert pins(run) == [f"{new_best['step']}.best"]


def test_evaluation_is_off_without_an_env(default_run, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    override = run.write_config("off.yaml", {"eval": {"env": None}})
    result = run.run_ok("--cores", "2", "-n", *CONFIG, override)
    assert "evaluate" not in result.jobs() and "best" not in result.jobs()
    bad = run.write_config("bad.yaml", {"eval": {"env": None}, "publish": {"steps": "best"}})
    refused = run.snakemake("-n", *CONFIG, bad)
    assert refused.returncode != 0
    assert "publish.steps: best needs evaluation: set eval.env" in refused.output


def test_bad_eval_flag_fails_before_training(default_run, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    override = run.write_config("bad.yaml", {"eval": {"env": {"type": "synthetic", "fpss": 3}}})
    result = run.snakemake("-n", *CONFIG, override)
    assert result.returncode != 0
    assert "eval.env.fpss" in result.output, result.output[-2000:]


def test_an_eval_setting_change_reruns_evaluation_only(default_run, tmp_path):
    run = default_run.clone(tmp_path / "repo")
    override = run.write_config("more_episodes.yaml", {"eval": {"n_episodes": 30}})
    result = run.run_ok("-n", *CONFIG, override)
    jobs = result.jobs()
    assert jobs["evaluate"] == 3 and not {"train", "validate", "convert"} & jobs.keys()
    assert "before: '--eval.n_episodes=20' now: '--eval.n_episodes=30'" in result.output
