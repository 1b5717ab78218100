"""`lerobot-pipe report` (make report) on a run that has not finished, here one that has not
started: Snakemake refuses the finished run's report, so the report of what exists is written
(an empty table, figures without points); a bad snakemake argument fails with Snakemake's own
error. The report during a real run: test_flow_pipeline.py."""

from __future__ import annotations

import pytest
from snakemake_runs import RUN, Workspace

from lerobot_pipe.scripts import cli


def test_the_command_says_what_it_does(capsys):
    assert cli.main(["report", "--help"]) == 0
    usage = capsys.readouterr().out
    assert "usage: lerobot-pipe report" in usage and "--configfile and --config" in usage


@pytest.mark.slow  # three snakemake runs (~30 s)
def test_a_run_not_yet_started_reports_what_exists(tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    written = workspace.command("lerobot-pipe", "report", f"--output={RUN}/report.html")
    assert written.returncode == 0, written.stdout[-3000:]
    assert "writing the report of what exists now" in written.stdout
    report = workspace.path(f"{RUN}/report.html").read_text()
    assert "report/now/checkpoints.html" in report and "report/now/eval.svg" in report
    table = workspace.path(f"{RUN}/report/now/checkpoints.html").read_text()
    assert "<th>step</th>" in table and "<td>" not in table  # no checkpoint yet


def test_a_bad_snakemake_argument_is_snakemakes_error(tmp_path):
    workspace = Workspace.fresh(tmp_path / "repo")
    args = ("--output=r.html", "--configfile", "missing.yaml")
    failed = workspace.command("lerobot-pipe", "report", *args)
    assert failed.returncode == 1
    assert "lerobot-pipe report: error: snakemake could not write the report" in failed.stdout
    assert "missing.yaml" in failed.stdout and not workspace.path("r.html").exists()
