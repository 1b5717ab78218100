"""``lerobot-convert-dcp``: merge a step's model DCP shards into safetensors, offline.

    lerobot-convert-dcp --checkpoint_dir=outputs/train/act/checkpoints/005000
    lerobot-convert-dcp --checkpoint_dir=.../005000/pretrained_model --output_dir=exported/005000
    lerobot-convert-dcp --checkpoint_dir=.../last --delete_dcp=true --push_to_hub=me/act_policy

Writes ``model.safetensors`` (``adapter_model.safetensors`` for a PEFT run) next to the DCP folder
``pytorch_model_fsdp_0/``, or a complete pretrained-model folder into ``--output_dir``. No GPU and
no process group are needed; only the model's DCP folder is read. Running it again is a no-op.
The output appears atomically (temporary file + rename); it is fsynced only with --delete_dcp,
before the shards go (otherwise the shards stay the source, and a file damaged by a power cut is
found and rewritten by the next run).

SECURITY: DCP's ``.metadata`` is a Python pickle (loading it can run code), so --checkpoint_dir
must be a LOCAL folder written by your own run. URLs and Hub repo ids are refused.
"""

from __future__ import annotations

import argparse
import logging
import sys

PROG = "lerobot-convert-dcp"
FLAGS = ("--checkpoint_dir", "--output_dir", "--delete_dcp", "--push_to_hub", "--private")
_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}

log = logging.getLogger("lerobot_pipe.convert")


def parse_bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true/false/1/0/yes/no, got {value!r}")


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # exit status 2 with our one-line message, raised to main
        raise _UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--checkpoint_dir",
        required=True,
        help="LOCAL step folder (checkpoints/005000, checkpoints/last) or its pretrained_model/. "
        "Never a URL or Hub id: DCP metadata is a pickle.",
    )
    parser.add_argument(
        "--output_dir",
        default=None,
        help="write a complete pretrained-model folder here (configs and processors copied); "
        "default: write the weights into the source pretrained_model/",
    )
    parser.add_argument(
        "--delete_dcp",
        type=parse_bool,
        nargs="?",
        const=True,
        default=False,
        help="delete pytorch_model_fsdp_0/ after the written file was read back, compared "
        "tensor by tensor with the shards and fsynced (default: false)",
    )
    parser.add_argument(
        "--push_to_hub",
        default=None,
        metavar="REPO_ID",
        help="after converting, publish the pretrained-model folder to this Hub repo",
    )
    parser.add_argument(
        "--private",
        type=parse_bool,
        nargs="?",
        const=True,
        default=False,
        help="create the Hub repo as private (default: false)",
    )
    return parser


def _setup_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.INFO,
            format="%(levelname)s %(asctime)s %(name)s: %(message)s",
            datefmt="%H:%M:%S",
            stream=sys.stderr,
        )
    logging.getLogger("lerobot_pipe").setLevel(logging.INFO)


def _error(message: str) -> None:
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            flag = unknown[0].split("=", 1)[0]
            kind = "flag" if flag.startswith("-") else "argument"
            raise _UsageError(f"unknown {kind} {flag!r}; allowed flags: {', '.join(FLAGS)}")
    except _UsageError as e:
        _error(e)
        print(parser.format_usage().rstrip(), file=sys.stderr)
        return 2

    _setup_logging()
    if args.push_to_hub:  # a bad repo id fails before anything is converted
        from lerobot_pipe.hub.publish import PublishError, validate_repo_id

        try:
            validate_repo_id(args.push_to_hub)
        except PublishError as e:
            _error(f"--push_to_hub: {e}")
            return 2
    from lerobot_pipe.convert.dcp_to_safetensors import ConversionError, convert_checkpoint

    try:
        weights = convert_checkpoint(
            args.checkpoint_dir, output_dir=args.output_dir, delete_dcp=args.delete_dcp
        )
    except ConversionError as e:
        _error(e)
        return 1
    except KeyboardInterrupt:
        _error("interrupted; nothing was deleted")
        return 130
    except Exception as e:  # never a torch traceback on the console
        log.debug("conversion failed", exc_info=True)
        _error(f"conversion failed: {type(e).__name__}: {e}")
        return 1
    print(weights)

    if args.push_to_hub:
        folder = weights.parent  # the (output or source) pretrained-model folder
        try:
            from lerobot_pipe.hub.publish import PublishError, publish_folder
        except ImportError as e:
            _error(f"cannot push to the Hub: {e}")
            return 1
        try:
            receipt = publish_folder(folder, args.push_to_hub, private=args.private)
        except PublishError as e:
            _error(f"push to {args.push_to_hub} failed: {e}")
            return 1
        log.info("Pushed %s to %s (commit %s)", folder, receipt.repo_id, receipt.commit_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
