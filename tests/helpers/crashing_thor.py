"""``python -m tests.helpers.crashing_thor ARGS`` (as torchrun's worker): ``thor ARGS``, except
that one worker dies once, hard, as `calib distill` begins a given training step — the lost
worker that torchrun's ``--max-restarts`` recovers from.

CRASH_AT="RANK:STEP:MARKER": the worker of rank RANK exits as step STEP begins unless the file
MARKER exists; it creates MARKER first, so the restarted group runs through.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> int:
    import calib.distill as distill
    from thor_app.cli import main as thor

    rank, step, marker = os.environ["CRASH_AT"].split(":", 2)
    schedule = distill.lr_at

    def lr_at(s, cfg):  # the training loop asks for each step's rate as the step begins
        if s == int(step) and os.environ.get("RANK") == rank and not Path(marker).exists():
            Path(marker).touch()
            os._exit(17)  # no cleanup, no exception handling: as a process that was killed
        return schedule(s, cfg)

    distill.lr_at = lr_at
    return thor(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
