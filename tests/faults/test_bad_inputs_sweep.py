"""Bad inputs of the other stages (conversion, publishing, dataset, validation, resume helper):
each fails early with a clear message and writes nothing. Together with
tests/training/test_bad_inputs.py this is the table in docs/bad-inputs.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tiny import run_train, tiny_act_flags

from lerobot_pipe.scripts.cli import main as pipe_main
from lerobot_pipe.scripts.convert_dcp import main as convert_main

DOCS = Path(__file__).resolve().parents[2] / "docs/bad-inputs.md"


@pytest.fixture(scope="module")
def checkpoint(dataset_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("ck") / "out"
    run_train(
        [
            *tiny_act_flags(**{"dataset.root": dataset_root, "steps": 2, "save_freq": 2}),
            f"--output_dir={out}",
        ]
    )
    return out / "checkpoints/000002"


# (id, command, argv ("{ck}" = a real checkpoint, "{tmp}" = an empty folder), expected fragment)
CASES = [
    ("convert-missing-dir", "convert", ["--checkpoint_dir={tmp}/nope"], "does not exist"),
    ("convert-nothing", "convert", ["--checkpoint_dir={tmp}"], "nothing to convert"),
    (
        "convert-unknown-flag",
        "convert",
        ["--checkpoint_dir={ck}", "--bogus=1"],
        "--bogus: unknown flag",
    ),
    (
        "convert-url",
        "convert",
        ["--checkpoint_dir=https://example.org/ckpt"],
        "refusing to read a checkpoint from a URL",
    ),
    (
        "convert-bad-bool",
        "convert",
        ["--checkpoint_dir={ck}", "--delete_dcp=maybe"],
        "expected true or false",
    ),
    (
        "convert-bad-repo",
        "convert",
        ["--checkpoint_dir={ck}", "--push_to_hub=../evil"],
        "--push_to_hub",
    ),
    (
        "publish-no-repo",
        "pipe",
        ["publish", "--pretrained_dir={ck}/pretrained_model", "--step=2"],
        "--repo_id is required",
    ),
    (
        "publish-bad-repo",
        "pipe",
        ["publish", "--pretrained_dir={ck}/pretrained_model", "--step=2", "--repo_id=a/../../b"],
        "repo",
    ),
    (
        "publish-bad-step",
        "pipe",
        ["publish", "--pretrained_dir={ck}/pretrained_model", "--step=two", "--repo_id=a/b"],
        "--step='two': expected an integer",
    ),
    (
        "publish-unknown-flag",
        "pipe",
        ["publish", "--pretrained_dir={ck}", "--step=2", "--repo_id=a/b", "--tokn=x"],
        "--tokn: unknown flag",
    ),
    (
        "dataset-zero-episodes",
        "pipe",
        ["make-dataset", "--root={tmp}/ds", "--num_episodes=0"],
        "num_episodes",
    ),
    (
        "dataset-unknown-flag",
        "pipe",
        ["make-dataset", "--root={tmp}/ds", "--episodes=3"],
        "--episodes: unknown flag",
    ),
    (
        "validate-world-size",
        "pipe",
        [
            "validate",
            "--nproc_per_node=3",
            "--policy.type=act",
            "--dataset.root={tmp}",
            "--parallelism.dp_shard=2",
        ],
        "--parallelism.dp_shard=2 does not divide the world size 3",
    ),
    ("resume-args-no-dir", "pipe", ["resume-args"], "--output_dir is required"),
    ("unknown-command", "pipe", ["frobnicate"], "lerobot-pipe"),
]


@pytest.mark.parametrize(
    ("command", "argv", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_stage_input(checkpoint, tmp_path, capsys, command, argv, expected):
    argv = [a.replace("{ck}", str(checkpoint)).replace("{tmp}", str(tmp_path)) for a in argv]
    before = sorted(p.name for p in checkpoint.rglob("*"))
    code = (convert_main if command == "convert" else pipe_main)(argv)
    captured = capsys.readouterr()
    assert code != 0
    assert expected in captured.err, captured.err
    assert "Traceback" not in captured.err
    assert (
        list(tmp_path.iterdir()) == [] and sorted(p.name for p in checkpoint.rglob("*")) == before
    )


def _load_training_table():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "training/test_bad_inputs.py"
    spec = importlib.util.spec_from_file_location("training_bad_inputs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_case_is_in_the_docs():
    training_table = _load_training_table()
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", DOCS.read_text(), flags=re.M))
    ids = {c[0] for c in CASES} | {c[0] for c in training_table.CASES}
    assert ids <= documented, sorted(ids - documented)
    assert len(ids) >= 40
