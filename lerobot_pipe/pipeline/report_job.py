"""``lerobot-pipe report`` (``make report``): the run's Snakemake HTML report, also while the run
goes on or after it failed.

``snakemake --report`` refuses a report file that does not exist yet, and the figures of the
finished run (rule all's plot_training, plot_eval, checkpoint_table) exist only once every
checkpoint is evaluated. So the report of the whole run is tried first; when Snakemake cannot
write it (the run has not finished: its figures are missing, or jobs are running), the report is
written from the ``report_now`` rule's figures and table instead: made from what exists at that
moment (the metrics logged so far, each finished evaluation, conversion and publish receipt),
by jobs without inputs, so they never start or wait for another job, and under ``--nolock``, so
they run beside the snakemake that trains.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

REPORT_METADATA = "workflow/report/metadata.yaml"
NOW_TARGET = "report_now"
# Snakemake's words when the finished run's report files do not exist (yet).
_NOT_FINISHED = ("marked for report but does not exist", "seem to be incomplete")


class ReportError(RuntimeError):
    """Snakemake could not write the report; the message holds its own error lines."""


def snakemake_command() -> list[str]:
    """The snakemake of this venv (beside this Python), else the one on PATH."""
    beside = Path(sys.executable).parent / "snakemake"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("snakemake")
    if found is None:
        raise ReportError("snakemake is not installed here: pip install 'lerobot_pipe[pipeline]'")
    return [found]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*snakemake_command(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )


def _error_lines(output: str) -> str:
    """Snakemake's error (from its exception's name on), else the end of its output."""
    lines = output.strip().splitlines()
    for at, line in enumerate(lines):
        if line.rstrip().endswith("Error:") or "Exception" in line.split(":")[0]:
            return "\n".join(lines[at:])
    return "\n".join(lines[-15:])


def write_report(output: str, snakemake_args: list[str]) -> str:
    """Write the report to ``output``; returns ``"run"`` (the finished run's) or ``"now"`` (what
    exists now). ``snakemake_args``: the run's --configfile / --config, as typed for snakemake."""
    report = ["--report", output, "--report-metadata", REPORT_METADATA]
    whole = _run([*report, *snakemake_args])
    if whole.returncode == 0:
        log.info("report of the finished run written to %s", output)
        return "run"
    if not any(words in whole.stdout for words in _NOT_FINISHED):
        raise ReportError(_error_lines(whole.stdout))
    reason = _error_lines(whole.stdout).splitlines()[-1].strip()
    log.info(
        "the run has not finished (%s): writing the report of what exists now", reason.rstrip(".")
    )
    figures = _run([NOW_TARGET, "--forceall", "--cores", "1", "--nolock", *snakemake_args])
    if figures.returncode != 0:
        raise ReportError(_error_lines(figures.stdout))
    now = _run([*report, NOW_TARGET, *snakemake_args])
    if now.returncode != 0:
        raise ReportError(_error_lines(now.stdout))
    log.info("report of what exists now written to %s", output)
    return "now"
