"""`thor engines build|list|verify|prune` — the hash-pinned engine cache.

build exports (and for tensorrt, builds) every graph of a model into one cache entry, with a
progress bar (TensorRT's profiles follow --prefill-chunk and the --spec flags, by default those
of `thor serve`'s config); list shows the usable entries (interrupted builds are never shown as
usable); verify re-hashes every file against its manifest (exit 2 on any mismatch); prune removes
interrupted builds and entries that fail verification (--all: everything).
"""

from __future__ import annotations

import json
import sys

from thor_app.commands.common import add_engine_build_args
from thor_app.flags import add_config_args, config_from_args
from thor_runtime.errors import ThorError


def register(sub) -> None:
    p = sub.add_parser("engines", help="build, list, verify or prune the engine cache")
    verbs = p.add_subparsers(dest="verb", required=True, parser_class=type(p))
    b = verbs.add_parser("build", help="export / build the engines of a model")
    add_engine_build_args(b)
    b.set_defaults(func=run_build)
    for name, fn, helptext in (
        ("list", run_list, "list cache entries"),
        ("verify", run_verify, "re-hash every file against its manifest"),
        ("prune", run_prune, "remove interrupted builds and bad entries"),
    ):
        q = verbs.add_parser(name, help=helptext)
        add_config_args(q, ("engine",), only={"engine.cache_dir"})
        q.add_argument("--json", action="store_true")
        if name == "verify":
            q.add_argument("key", nargs="?", default=None)
        if name == "prune":
            q.add_argument("--all", action="store_true", help="remove every entry")
        q.set_defaults(func=fn)


def _cache(args):
    from engines.backend import BackendOptions
    from engines.cache import EngineCache

    return EngineCache(
        BackendOptions(cache_dir=config_from_args(args).engine.cache_dir or None).root
    )


def run_build(args) -> int:
    from thor_app.assembly import backend_options, build_speculation, load_model, make_backend

    config = config_from_args(args)
    if config.engine.backend == "torch":
        raise ThorError(
            "the torch backend needs no engines; choose --backend onnxruntime or tensorrt"
        )
    backend_options(config)  # a bad option combination fails before the model loads
    loaded = load_model(config)
    b = make_backend(config, loaded, build_speculation(config, loaded), attach=False)
    print(f"{b.entry.key}  {b.name}  {len(b.plan)} graphs  {b.entry.path}")
    return 0


def run_list(args) -> int:
    rows = _cache(args).scan()
    if args.json:
        print(json.dumps({"entries": rows}))
        return 0
    usable = [r for r in rows if r["status"] == "ok"]
    for r in usable:
        print(
            f"{r['key']}  {r['backend']:<11} {r['form']:<8} {r['precision']:<5} "
            f"{r['bytes'] / 1e6:8.1f} MB  "
            f"{r['model']}  {r['runtime']}  {r['created']}"
        )
    other = len(rows) - len(usable)
    if other:
        print(
            f"({other} interrupted or unreadable build(s) not usable; "
            "`thor engines prune` removes them)",
            file=sys.stderr,
        )
    return 0


def run_verify(args) -> int:
    res = _cache(args).verify(args.key)
    if args.json:
        print(json.dumps({"entries": res}))
    else:
        for k, problems in res.items():
            print(f"{k}  {'ok' if not problems else 'BAD: ' + '; '.join(problems)}")
    bad = [k for k, p in res.items() if p]
    if bad:
        raise ThorError(
            f"{len(bad)} engine cache entr{'y' if len(bad) == 1 else 'ies'} failed verification: "
            f"{', '.join(bad)}"
        )
    return 0


def run_prune(args) -> int:
    removed = _cache(args).prune(everything=args.all)
    if args.json:
        print(json.dumps({"removed": removed}))
    else:
        print(
            f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}"
            + (f": {', '.join(removed)}" if removed else "")
        )
    return 0
