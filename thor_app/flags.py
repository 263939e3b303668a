"""The CLI spelling of the runtime config: flags derived from RuntimeConfig's field table.

``add_config_args`` adds one flag per field (name, help, choices and default from the field's
metadata); ``config_from_args`` reads them back into a validated ``RuntimeConfig``. A command
states only where it deliberately differs (``defaults``, e.g. `thor generate` decodes plainly).
No torch and no engines here: every ``--help`` answers without them.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from thor_runtime.config import SECTIONS, RuntimeConfig, meta
from thor_runtime.errors import ThorError

PREFIX = "cfg__"
TITLES = {
    "model": "model",
    "engine": "engines (the dense segments)",
    "speculation": "speculative decoding",
    "sampling": "sampling",
    "planner": "planner",
}


def _dest(section: str, name: str) -> str:
    return f"{PREFIX}{section}__{name}"


# A str field's value in --help where the field's own name does not say what to give.
METAVARS = {
    "name": "MODEL",
    "kv_scales": "FILE",
    "fp8_scales": "FILE",
    "weight_cache": "DIR",
    "cache_dir": "DIR",
    "drafter": "DIR",
    "log_requests": "DIR",
    "int4_kernel": "KERNEL",
}


def _metavar(f) -> str | None:
    """What --help shows after the flag: argparse would show the dest (CFG__MODEL__DEVICE).
    None where argparse lists the choices itself."""
    if meta(f).choices is not None:
        return None
    if f.default is None or type(f.default) is int:
        return "N"
    if type(f.default) is float:
        return "X"
    return METAVARS.get(f.name, f.name.upper())


def flag_fields(section: str):
    return [f for f in fields(SECTIONS[section]) if meta(f).flag is not None]


def add_config_args(
    p: argparse.ArgumentParser,
    sections,
    defaults: dict | None = None,
    only: set[str] | None = None,
    titles: dict | None = None,
) -> None:
    """``sections``: which parts of the tree the command reads. ``defaults``: {"section.field":
    value} where the command differs from the table. ``only``: restrict to these "section.field"."""
    defaults = defaults or {}
    for section in sections:
        g = p.add_argument_group((titles or {}).get(section, TITLES[section]))
        for f in flag_fields(section):
            key = f"{section}.{f.name}"
            if only is not None and key not in only:
                continue
            s, default = meta(f), defaults.get(key, f.default)
            kw = {"dest": _dest(section, f.name), "default": default, "help": s.help}
            if isinstance(f.default, bool):  # the flag turns the default around
                if default:  # a setting's help says what it does when on
                    kw["help"] = f"do not {s.help}"
                g.add_argument(s.flag, action="store_false" if default else "store_true", **kw)
                continue
            kind = type(f.default) if f.default is not None else int
            g.add_argument(s.flag, type=kind, choices=s.choices, metavar=_metavar(f), **kw)


def config_from_args(args, base: RuntimeConfig | None = None) -> RuntimeConfig:
    """The flags a command has, over ``base`` (the table's defaults); errors name the flag."""
    base = base or RuntimeConfig()
    values: dict[str, dict] = {}
    for dest, v in vars(args).items():
        if dest.startswith(PREFIX):
            section, name = dest[len(PREFIX) :].split("__")
            values.setdefault(section, {})[name] = v
    parts = {}
    try:
        for section in SECTIONS:
            current = getattr(base, section)
            given = values.get(section, {})
            parts[section] = type(current)(**{**_as_dict(current), **given}) if given else current
        return RuntimeConfig(**parts)
    except ThorError as e:
        raise ThorError(_flag_words(str(e))) from None


def _as_dict(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _flag_words(msg: str) -> str:
    """ "model.prefill_chunk must be >= 0" -> "--prefill-chunk must be >= 0"."""
    for section in SECTIONS:
        for f in flag_fields(section):
            msg = msg.replace(f"{section}.{f.name} ", f"{meta(f).flag} ").replace(
                f"{section}.{f.name}:", f"{meta(f).flag}:"
            )
    return msg
