"""``lerobot-pipe report``: the run's Snakemake HTML report (``make report`` runs it), also while
the run goes on (:mod:`lerobot_pipe.pipeline.report_job`).

    lerobot-pipe report --output=results/default/report.html
    lerobot-pipe report --output=results/big/report.html --configfile config/config.yaml big.yaml

Run it in the workflow's folder, with the run's own --configfile and --config (the pipeline's
summary at the end of a run prints the whole command).
"""

from __future__ import annotations

import argparse
import sys

from lerobot_pipe.pipeline.report_job import ReportError, write_report
from lerobot_pipe.scripts.logs import report_error

PROG = "lerobot-pipe report"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Write the run's Snakemake HTML report: the whole run's once it has "
        "finished, else the loss, evaluations, conversions and Hub uploads that exist now.",
        epilog="Every other argument goes to snakemake (the run's --configfile and --config).",
    )
    p.add_argument(
        "--output", required=True, help="the report file, e.g. results/<run>/report.html"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        options, snakemake_args = parser().parse_known_args(argv)
    except SystemExit as e:  # --help (0) or a missing --output (2): argparse has printed it
        return int(e.code or 0)
    try:
        write_report(options.output, snakemake_args)
    except ReportError as e:
        report_error(PROG, "snakemake could not write the report")
        print(str(e), file=sys.stderr)
        return 1
    return 0
