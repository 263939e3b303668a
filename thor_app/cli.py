"""`thor` — one console entry point over the runtime, the agent and calibration.

Exit codes: 0 ok, 2 bad input (one line on stderr, no traceback), 3 no valid plan.
Each subcommand module defines ``register(subparsers)``; its parser sets ``func(args) -> int``.
The modules import their heavy dependencies inside the handlers, so ``thor --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from thor_app.commands import calib, engines, generate, models, plan, ros, selftest, serve
from thor_app.tools import bench
from thor_runtime.errors import ThorError

COMMANDS = (generate, plan, bench, calib, models, engines, selftest, serve, ros)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default prints usage; we keep one line, exit 2
        raise ThorError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="thor", description="thor-runtime: on-robot LLM planning runtime")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for mod in COMMANDS:
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except ThorError as e:
        print(f"thor: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("thor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
