"""Run LeRobot's lerobot-eval several times in one process (its import costs ~20 s): argv[1] is
a JSON file holding a list of argument lists, each one lerobot-eval command line. Run with
LeRobot's Python (tests/upstream.py); never imported by the tests."""

import json
import sys
from pathlib import Path

from lerobot.scripts import lerobot_eval
from lerobot.utils.import_utils import register_third_party_plugins
from lerobot.utils.utils import init_logging

init_logging()
register_third_party_plugins()
for args in json.loads(Path(sys.argv[1]).read_text()):
    sys.argv = ["lerobot-eval", *args]  # eval_main's parser and its config read sys.argv
    lerobot_eval.eval_main()
