"""LeRobot 0.6.1's own ``lerobot-train``, with pi0 / pi0.5's ``dummy`` variant patched in: what
bench/bench_vs_lerobot.py starts on LeRobot's side for its ``pi0-dummy`` / ``pi05-dummy``
configurations, in LeRobot's venv.

LeRobot 0.6.1 builds only its full-size Gemma variants. This script imports
tests/policies/lerobot_pi_driver.py, whose import patches LeRobot in this process only (the
variant check, the Gemma sizes, the SigLIP sizes; nothing else), then runs ``lerobot-train``'s
``main`` on this command line, as the console script would. Start it as the console script is
started: ``python bench/lerobot_pi_train.py <lerobot-train flags>`` for one process, and
``accelerate launch --multi_gpu --num_processes=2 bench/lerobot_pi_train.py <flags>`` for DDP
(every rank runs this file, so every rank is patched).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "policies"))

import lerobot_pi_driver  # noqa: E402, F401 - patches LeRobot's pi0 / pi0.5 at import
from lerobot.scripts.lerobot_train import main  # noqa: E402

if __name__ == "__main__":
    main()
