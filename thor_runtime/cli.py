"""`thor` — one console entry point; each subcommand registers itself from its own module.

Exit codes: 0 ok, 2 bad input (one line on stderr, no traceback), 3 no valid plan.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .errors import ThorError

# subcommand -> module with `register(subparsers)`; the module's parser sets `func(args) -> int`.
COMMANDS = {
    "generate": "thor_runtime.commands.generate",
    "plan": "agent.cli",
    "bench": "thor_runtime.commands.bench",
    "calib": "calib.cli",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's default prints usage; we keep one line, exit 2
        raise ThorError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="thor", description="thor-runtime: on-robot LLM planning runtime")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                continue  # that part of the product is not installed in this build
            raise
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
