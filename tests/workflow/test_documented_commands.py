"""The commands users are told to type run as typed, so that the docs cannot drift from the code:
every command of the ```bash blocks of README.md, config/README.md and docs/*.md, and every
command (in backquotes) of the pipeline's own messages: the summary at the end of a run and the
hint about a stale lock.

They run in a copy of a finished default run, after the README's set-up (`make run`, then
`source .venv/bin/activate`: here the test's venv first on PATH and as `.venv/`), in order, in
one folder, so that a command may use what an earlier one wrote (the run's converted policies,
the dataset of `lerobot-pipe make-dataset`, the checkpoints of the tiny lerobot-train run). A
```yaml block whose first line is `# <name>.yaml` is written to that file first. A command that
needs what a test machine lacks is checked as far as it can be (RULES, first match wins):
lerobot-train runs of minutes by `lerobot-pipe validate` (lerobot-train's own parsing and
checks, for the same world size), an 8-GPU pipeline by a dry run, a benchmark by its flags'
parsing; the others are left out saying why.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from snakemake_runs import REPO, RUN, VENV_BIN, pipeline_env

pytestmark = pytest.mark.slow

# The documents with commands: every ```bash block of docs/ too.
DOCS = tuple(
    str(path.relative_to(REPO))
    for path in (REPO / "README.md", REPO / "config/README.md", *sorted(REPO.glob("docs/*.md")))
    if "```bash" in path.read_text()
)
# Besides the workflow files a clone has: what the documented commands read (the benchmarks
# import the test suite's helpers).
DOC_FILES = (
    "README.md",
    "Makefile",
    "pyproject.toml",
    "lerobot_pipe_commands",
    "constraints-cpu.txt",
    "bench",
    "tests",
)

SKIP, VALIDATE, DRY_RUN, FLAGS, RUN_IT = "skip", "validate", "dry run", "flags", "run"
# (pattern searched in the command, how it is checked, why)
RULES = [
    (
        r"\.\.\.|<\w+>|\[--",
        SKIP,
        "a template: `...`, `<name>` and `[--flag]` stand for what the user fills in",
    ),
    (
        r"^make (test|test-fast|lint)\b",
        SKIP,
        "the test suite and linters themselves (CI runs them)",
    ),
    (r"^make gpu-check|TORCH_INDEX=\S*/cu\d+|^sudo ", SKIP, "a CUDA machine's set-up"),
    (
        r"--profile workflow/profiles/slurm",
        SKIP,
        "needs a SLURM cluster (tests/workflow/test_slurm.py)",
    ),
    (
        r"hub_repo_id=|push_to_hub|=me/",
        SKIP,
        "needs a Hub account and its repositories (test_pipeline.py publishes to a local Hub)",
    ),
    (r"^\.venv/bin/python bench/", FLAGS, "a benchmark of minutes: its flags parsed (`--help`)"),
    (r"^snakemake --cores 8\b", DRY_RUN, "needs 8 GPUs: planned with --dry-run"),
    (
        r"^snakemake --cores 2 -R (convert|evaluate)$",
        DRY_RUN,
        "run on a finished run by test_pipeline.py::test_rerun_convert_does_not_train and "
        "test_evaluate_pipeline.py::test_rerun_evaluate_does_not_train_or_convert",
    ),
    (r"^torchrun --nproc-per-node=\d+ \$\(which lerobot-train\) ", VALIDATE, "GPU-sized"),
    (r"^lerobot-train .*--output_dir=outputs/act ", VALIDATE, "GPU-sized (~14 s a step on a CPU)"),
]


def bash_commands(markdown: str) -> list[str]:
    """The commands of the ```bash blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", markdown, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = strip_comment(line).strip()
            if command:
                commands.append(re.sub(r"\s+", " ", command))
    return commands


def strip_comment(line: str) -> str:
    """The line up to a `#` that starts a shell comment (not one inside quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def yaml_files(markdown: str) -> dict[str, str]:
    """```yaml blocks that name their file on their first line (`# gpu8.yaml`)."""
    return {
        name: body
        for name, body in re.findall(
            r"^```yaml\n# ([\w.-]+\.yaml)\n(.*?)^```", markdown, re.M | re.S
        )
    }


def backquoted(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def how_to_check(command: str) -> tuple[str, str]:
    for pattern, action, why in RULES:
        if re.search(pattern, command):
            return action, why
    return RUN_IT, ""


def as_validate(command: str) -> str:
    """lerobot-train's flags through `lerobot-pipe validate`, for the torchrun world size."""
    words = shlex.split(command)
    nproc = 1
    if words[0] == "torchrun":
        nproc = int(words[1].split("=")[1])
        words = words[4:]  # torchrun --nproc-per-node=N $(which lerobot-train): 4 words
    else:
        words = words[1:]
    return shlex.join(["lerobot-pipe", "validate", f"--nproc_per_node={nproc}", *words])


@pytest.fixture(scope="module")
def workspace(default_run, tmp_path_factory):
    """The finished default run, with the files the documented commands read, and a stand-in
    for `.venv/` (make's VENV): the test's venv, behind a stamp that make never rebuilds."""
    work = default_run.clone(tmp_path_factory.mktemp("documented") / "repo")
    for name in DOC_FILES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name, work.path(name), ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(REPO / name, work.path(name))
    venv = work.path(".venv")
    venv.mkdir()
    for name in ("bin", "lib", "pyvenv.cfg"):
        (venv / name).symlink_to(VENV_BIN.parent / name)
    (venv / ".installed").touch()
    write_imagenet_resnet18(work.path("torch_home"))
    return work


def write_imagenet_resnet18(torch_home: Path) -> None:
    """A stand-in for torchvision's ImageNet ResNet-18 in the torch.hub cache, as a machine that
    has downloaded it holds it: the GPU-sized commands use LeRobot's default backbone weights,
    which this machine cannot download (validate checks the file, nothing reads its values)."""
    from lerobot_pipe.policies.vision import resnet_backbone, resolve_weights

    url = resolve_weights("resnet18", "ResNet18_Weights.IMAGENET1K_V1")
    state = {**resnet_backbone("resnet18").state_dict()}
    state.update({"fc.weight": torch.zeros(1000, 512), "fc.bias": torch.zeros(1000)})
    path = torch_home / "hub" / "checkpoints" / url.rsplit("/", 1)[1]  # torch.hub's cache
    path.parent.mkdir(parents=True)
    torch.save(state, path)


def run(workspace, command: str) -> subprocess.CompletedProcess:
    env = pipeline_env({"TORCH_HOME": str(workspace.path("torch_home"))})
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=workspace.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(f"$ {command}  # exit {result.returncode}")
    return result


def assert_all_ran(workspace, commands: list[str]) -> None:
    failed = []
    for command in commands:
        result = run(workspace, command)
        if result.returncode != 0:
            failed.append(
                f"$ {command}\n(exit {result.returncode})\n{result.stdout[-1500:]}"
                f"{result.stderr[-3000:]}"
            )
    assert not failed, "\n\n".join(failed)


def test_the_commands_of_the_summary_run_and_the_report_lands_beside_the_run(
    default_run, workspace
):
    summary = default_run.first_result.output.split("Results of run", 1)[1]
    commands = backquoted(summary)
    assert "make report" in commands
    assert_all_ran(workspace, commands)
    report = workspace.path(f"{RUN}/report.html").read_text()
    # It opens on its landing page (Snakemake's app does when the metadata is not empty), the
    # run's description, which holds the three figures (inline SVG) and the checkpoint table.
    assert re.search(r'var metadata = \{"', report)
    description = json.loads(re.search(r'var workflow_desc = ("(?:[^"\\]|\\.)*")', report)[1])
    assert description.count("<svg") == 3 and "<table" in description
    assert "throughput" in description and "loss" in description and "success" in description


def test_the_commands_of_the_stale_lock_hint_run(workspace):
    locks = workspace.path(".snakemake/locks")
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.input.lock").write_text("")
    hint = run(workspace, "snakemake -n --cores 2")
    commands = [c for c in backquoted(hint.stdout + hint.stderr) if "unlock" in c]
    assert len(commands) == 2, hint.stdout + hint.stderr
    for command in commands:
        locks.mkdir(parents=True, exist_ok=True)
        (locks / "0.input.lock").write_text("")
        assert_all_ran(workspace, [command])
        assert not locks.exists() or not any(locks.iterdir())


@pytest.mark.parametrize("doc", DOCS)
def test_the_commands_of_the_docs_run_as_typed(workspace, doc):
    text = (REPO / doc).read_text()
    for name, body in yaml_files(text).items():
        workspace.path(name).write_text(body)
    to_run = []
    for command in bash_commands(text):
        action, why = how_to_check(command)
        if action == SKIP:
            print(f"left out: {command}  ({why})")
        elif action == VALIDATE:
            to_run.append(as_validate(command))
        elif action == DRY_RUN:
            to_run.append(f"{command} --dry-run")
        elif action == FLAGS:
            to_run.append(f"{command} --help")
        else:
            to_run.append(command)
    assert bash_commands(text), f"no command found in {doc}'s bash blocks"
    assert_all_ran(workspace, to_run)


def test_every_rule_is_used():
    """A rule that matches no documented command is a leftover."""
    commands = [c for doc in DOCS for c in bash_commands((REPO / doc).read_text())]
    unused = [p for p, _, _ in RULES if not any(re.search(p, c) for c in commands)]
    assert not unused
