"""Every code block of README.md and docs/*.md marked runnable runs, on small data (CONTRIBUTING.md, "Examples
that run").

A block's mark is an HTML comment on the line right before its fence (neither GitHub nor the site shows it):

    <!-- runnable -->               run as written (python: the whole block; bash: command by command)
    <!-- runnable: continues -->    run after the marked block before it on the page, in the same folder
                                    (python: with the same names)
    <!-- runnable: dry-run -->      bash: every posgeom command runs with --dry-run
    <!-- runnable: parser -->       bash: every posgeom command's arguments are parsed by its subcommand's parser
    <!-- runnable: tests/FILE.py -->  run and checked by that test module (the README's library example)
    <!-- not runnable: REASON -->   a block that cannot run here (an install, a download, a cluster script)

Every ``bash`` and ``python`` block carries one of these marks. ``NAME=value`` words in a mark set shell
variables for the block (``<!-- runnable: parser NODE=0 -->``). A bash block is run by bash itself, with
``posgeom``, ``accelerate``, ``torchrun`` and ``pip`` defined as functions that record their arguments and no
other program on the PATH, so its words are split and expanded exactly as a user's shell does; then each
recorded command is run (``accelerate launch ... -m timm_posgeom.cli ARGS`` and ``torchrun`` run ``ARGS`` in one
process), dry-run or parsed; ``pip install 'timm-posgeom[EXTRA]'`` is checked against the package's extras.
Both run in this process, in a folder of their own (``posgeom`` as ``timm_posgeom.cli.main.main(ARGS)``, python
by ``exec``): a fresh interpreter per command would cost more than most of the examples.

What the test changes, here only:

- DATA: the data the examples name is mapped to the project's local copy: ``imagenette2-320`` (the folder the
  fastai archive unpacks to, docs/guide.md "Getting the data") is tests/conftest.py's IMAGENETTE. Where that copy
  is absent, a bash block that names it is parsed instead of run, and such a python block is skipped.
- SMALL: tiny subsets through the project's own flags: appended to each command (argparse: the last value wins;
  ``--set``: the last one wins), and python's ``subset=``, ``max_images=`` and ``probe_images=`` capped, and its
  default RPI permutations (``protocol.RPI_PERMUTATIONS``) 2, as the commands' ``--rpi-permutations 2``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import IMAGENETTE

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```+|~~~+)\s*([\w-]*)")
MARK = re.compile(r"^<!--\s*(runnable|not runnable)\s*(?::\s*(.*?))?\s*-->\s*$")
MODES = {"run", "continues", "dry-run", "parser"}
CODE_LANGS = {"bash", "sh", "shell", "console", "python", "py"}
DATA = {"imagenette2-320": IMAGENETTE}
SMALL_IMAGES = 16
_MEASURE = ["--max-images", str(SMALL_IMAGES), "--batch-size", str(SMALL_IMAGES), "--no-progress"]
SMALL = {
    "probe": [*_MEASURE, "--rpi-permutations", "2"],
    "attention": [*_MEASURE, "--rpi-permutations", "2"],
    "localise": [*_MEASURE, "--rpi-permutations", "2", "--colours", "2"],
    "fragility": _MEASURE,
    "sweep": [*_MEASURE, "--probe-images", str(SMALL_IMAGES), "--rpi-permutations", "2"],
    "zoo": [*_MEASURE, "--probe-images", str(SMALL_IMAGES), "--rpi-permutations", "2"],
    "extrapolate": [*_MEASURE, "--probe-images", "8", "--rpi-permutations", "2", "--num-workers", "0"],
    "train": [
        "--no-progress",
        *[
            a
            for kv in (
                "epochs=1",
                "max_train_images=128",
                "max_val_images=32",
                "warmup_epochs=0",
                "eval_every=1",
                "probe_images=0",
                "disk_cache=false",
            )
            for a in ("--set", kv)
        ],
    ],
}
SMALL_PY = re.compile(r"\b(subset|max_images|probe_images)=(\d+)")
# bash: the programs a runnable block may call, each a function that records its arguments (\x1f between
# words, \x1e after a command); any other program is not found and recorded as such
RECORDER = r"""
_rec() { printf '%s\x1f' "$@" >> "$DOC_LOG"; printf '\x1e' >> "$DOC_LOG"; }
posgeom() { _rec posgeom "$@"; }
accelerate() { _rec accelerate "$@"; }
torchrun() { _rec torchrun "$@"; }
pip() { _rec pip "$@"; }
command_not_found_handle() { _rec "NOT-ALLOWED:$1"; return 127; }
set -e
"""


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    mark: str | None  # "runnable", "not runnable" or None
    words: list[str] = field(default_factory=list)  # the mark's words after the colon

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def modes(self) -> set[str]:
        return {w for w in self.words if "=" not in w and "/" not in w} or {"run"}

    @property
    def variables(self) -> dict[str, str]:
        return dict(w.split("=", 1) for w in self.words if "=" in w)

    @property
    def checked_by(self) -> str | None:
        return next((w for w in self.words if "/" in w), None)


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a page, with the mark on the line before it (if any)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(m.group(1)))
        mark = MARK.match(lines[i - 1].strip()) if i else None
        words = (mark.group(2) or "").split() if mark else []
        if mark and mark.group(1) == "runnable":
            words = [w for w in shlex.split(mark.group(2) or "")]
        found.append(
            Block(
                page,
                i + 1,
                m.group(2).lower(),
                "\n".join(lines[i + 1 : end]) + "\n",
                mark.group(1) if mark else None,
                words,
            )
        )
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def chains() -> list[list[Block]]:
    """The runnable blocks, each with the blocks that continue it."""
    out: list[list[Block]] = []
    for b in ALL:
        if b.mark != "runnable" or b.checked_by:
            continue
        if "continues" in b.modes:
            assert out and out[-1][0].page == b.page, f"{b.where}: 'continues' without a runnable block before it"
            out[-1].append(b)
        else:
            out.append([b])
    return out


def _python(lang: str) -> bool:
    return lang in ("python", "py")


# ---------------------------------------------------------------------------------------------- the marks


def test_every_code_block_is_marked():
    unmarked = [b.where for b in ALL if b.lang in CODE_LANGS and b.mark is None]
    assert not unmarked, f"bash/python blocks without <!-- runnable --> or <!-- not runnable: REASON -->: {unmarked}"


def test_marks_are_well_formed():
    text_marks = sum(len(re.findall(r"<!--\s*(?:not )?runnable", p.read_text(encoding="utf-8"))) for p in PAGES)
    assert text_marks == sum(b.mark is not None for b in ALL), "a mark not on the line right before a fence"
    for b in ALL:
        if b.mark == "not runnable":
            assert b.words, f"{b.where}: say why it cannot run"
        elif b.mark == "runnable":
            assert b.lang in CODE_LANGS, f"{b.where}: a runnable block is bash or python, not {b.lang!r}"
            assert b.modes <= MODES, f"{b.where}: unknown mode {b.modes - MODES}"
            if _python(b.lang):
                assert b.modes <= {"run", "continues"}, f"{b.where}: python blocks run"
            if b.checked_by:
                test = ROOT / b.checked_by
                assert test.is_file() and "Using the library" in test.read_text(), f"{b.where}: {b.checked_by}"
    assert len(chains()) >= 8


def test_user_docs_do_not_depend_on_this_repository_s_shared_folder():
    for page in PAGES:  # the user's pages (CONTRIBUTING.md says where the tests find their data)
        assert "shared/data" not in page.read_text(encoding="utf-8"), f"{page.name} names ../shared/data"


# ---------------------------------------------------------------------------------------------- bash


def record(block: Block, tmp: Path) -> list[list[str]]:
    """The commands a bash block calls, as its shell expands them (nothing runs)."""
    log = tmp / f"commands-{block.line}.log"
    log.write_bytes(b"")
    empty = tmp / "no-programs"
    empty.mkdir(exist_ok=True)
    env = {"PATH": str(empty), "HOME": str(tmp), "DOC_LOG": str(log), **block.variables}
    done = subprocess.run(
        ["/bin/bash", "-c", RECORDER + block.code], cwd=tmp, env=env, capture_output=True, text=True, timeout=60
    )
    commands = [c.split("\x1f")[:-1] for c in log.read_text().split("\x1e")[:-1]]
    bad = [c[0][len("NOT-ALLOWED:") :] for c in commands if c[0].startswith("NOT-ALLOWED:")]
    assert not bad, f"{block.where}: calls {bad}: a runnable block calls posgeom, accelerate, torchrun or pip"
    assert done.returncode == 0, f"{block.where}: bash failed: {done.stderr[-2000:]}"
    assert commands, f"{block.where}: no command"
    return commands


def posgeom_args(command: list[str], where: str) -> list[str] | None:
    """The posgeom arguments of a recorded command (None for pip, checked separately)."""
    if command[0] == "posgeom":
        return command[1:]
    if command[0] == "pip":
        return None
    assert "-m" in command and command[command.index("-m") + 1] == "timm_posgeom.cli", (
        f"{where}: {command[0]} that does not run timm_posgeom.cli: {command}"
    )
    return command[command.index("-m") + 2 :]


def check_pip(command: list[str], where: str) -> None:
    """``pip install 'timm-posgeom[EXTRA,...]'``: every extra it names is declared (by the installed package)."""
    from importlib.metadata import metadata

    extras = metadata("timm-posgeom").get_all("Provides-Extra") or []
    named = [
        e for word in command if (m := re.fullmatch(r"timm-posgeom\[([\w,-]+)\]", word)) for e in m.group(1).split(",")
    ]
    assert command[1] == "install" and named, f"{where}: a pip command that installs no extra of ours: {command}"
    assert set(named) <= set(extras), f"{where}: timm-posgeom has no extra {set(named) - set(extras)}"


def parse(args: list[str], where: str, capsys) -> None:
    """The command's arguments pass its subcommand's parser and the checks made before anything runs."""
    from timm_posgeom.cli._options import apply_renamed, check_counts
    from timm_posgeom.cli.main import build_parser, command_parser

    parser = build_parser()
    try:
        parsed = parser.parse_args(args)
    except SystemExit as e:
        pytest.fail(f"{where}: posgeom {shlex.join(args)}: exit {e.code}: {capsys.readouterr().err.strip()}")
    apply_renamed(parsed, command_parser(parser, parsed.command))
    check_counts(parsed)
    err = capsys.readouterr().err
    assert "deprecated" not in err, f"{where}: the docs use a former name: {err.strip()}"


def local_data(args: list[str]) -> list[str] | None:
    """The arguments with the examples' data mapped to the local copy; None where that copy is absent."""
    out = []
    for a in args:
        key = a.split("=", 1)[-1]
        if key in DATA:
            if not DATA[key].exists():
                return None
            a = a[: len(a) - len(key)] + str(DATA[key])
        out.append(a)
    return out


def run_posgeom(args: list[str], where: str, capsys) -> None:
    from timm_posgeom.cli.main import main

    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    assert code in (0, None), f"{where}: posgeom {shlex.join(args)}: exit {code}\n{out.out[-2000:]}\n{out.err[-3000:]}"
    assert "deprecated" not in out.err, f"{where}: the docs use a former name: {out.err[-2000:]}"


def run_bash(block: Block, cwd: Path, capsys) -> None:
    for command in record(block, cwd):
        args = posgeom_args(command, block.where)
        if args is None:
            check_pip(command, block.where)
            continue
        mode = "parser" if "parser" in block.modes else "dry-run" if "dry-run" in block.modes else "run"
        if mode == "dry-run" and "--dry-run" not in args:
            args = [*args, "--dry-run"]
        parse(args, block.where, capsys)  # every command, whatever its mode
        local = local_data(args)
        if mode == "parser" or local is None:
            continue
        run_posgeom(local + (SMALL.get(local[0], []) if mode == "run" else []), block.where, capsys)


# ---------------------------------------------------------------------------------------------- python


def small_python(code: str) -> str | None:
    """The code with the examples' data mapped to the local copy and its image counts capped; None where the
    local copy is absent."""
    for key, path in DATA.items():
        if f'"{key}"' in code:
            if not path.exists():
                return None
            code = code.replace(f'"{key}"', repr(str(path)))
    return SMALL_PY.sub(lambda m: f"{m.group(1)}={min(int(m.group(2)), SMALL_IMAGES)}", code)


def run_python(code: str, where: str) -> None:
    exec(compile(code, where, "exec"), {"__name__": "__doc_example__"})  # a failure raises with its traceback


# ---------------------------------------------------------------------------------------------- the examples


def _chain_id(chain: list[Block]) -> str:
    return "+".join(b.where for b in chain)


def _params():
    for chain in chains():  # all but the parsed ones build models and read images: over 5 s (slow, CI runs them)
        parsed = all("parser" in b.modes for b in chain)
        yield pytest.param(chain, id=_chain_id(chain), marks=[] if parsed else [pytest.mark.slow])


@pytest.mark.parametrize("chain", list(_params()))
def test_runnable_block(chain: list[Block], tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if _python(chain[0].lang):
        assert all(_python(b.lang) for b in chain), f"{_chain_id(chain)}: python continued by another language"
        code = small_python("\n".join(b.code for b in chain))
        if code is None:
            pytest.skip(f"{_chain_id(chain)} reads Imagenette; the local copy is absent ({IMAGENETTE})")
        from timm_posgeom import protocol

        monkeypatch.setattr(protocol, "RPI_PERMUTATIONS", 2)  # as the commands' --rpi-permutations 2 (SMALL)
        run_python(code, _chain_id(chain))
        return
    for block in chain:
        assert block.lang in ("bash", "sh", "shell", "console"), f"{block.where}: {block.lang}"
        run_bash(block, tmp_path, capsys)


# ---------------------------------------------------------------------------------------------- what the docs say


FASTAI_CLASSES = ("n01440764", "n02102040", "n03000684")  # WordNet ids, as the archive's class folders


@pytest.mark.slow
def test_the_fastai_archive_layout_reads_as_the_guide_says(tmp_path: Path, capsys):
    """docs/guide.md "Getting the data": imagenette2-320/{train,val}/<wnid>/*.JPEG, a CSV beside them, is an
    ImageFolder tree whose `val` is the validation split, classes the sorted WordNet ids (made here: a few
    JPEGs of plain colours, in the archive's layout)."""
    from PIL import Image

    import timm_posgeom

    root = tmp_path / "imagenette2-320"
    for split, n in (("train", 3), ("val", 2)):
        for c, wnid in enumerate(reversed(FASTAI_CLASSES)):
            folder = root / split / wnid
            folder.mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (96 + 8 * i, 80), (40 * c, 60 * i, 90)).save(folder / f"{wnid}_{i}.JPEG")
    (root / "noisy_imagenette.csv").write_text("path,noisy_labels_0\n")
    val = timm_posgeom.load_split(root, "validation")
    assert val.classes == list(FASTAI_CLASSES) and len(val) == 6
    assert sorted(val.labels) == [0, 0, 1, 1, 2, 2]
    assert timm_posgeom.load_split(root, "train").classes == list(FASTAI_CLASSES)
    run_posgeom(
        [
            "probe",
            "posgeom_vit_micro_patch8_64_ape",
            "--data",
            str(root),
            "--max-images",
            "4",
            "--out",
            str(tmp_path / "probe"),
            "--no-progress",
            "--device",
            "cpu",
        ],
        "fastai layout",
        capsys,
    )
    assert (tmp_path / "probe" / "ssdc.json").is_file()


def test_the_readme_s_cpu_torch_line_is_the_index_ci_uses():
    """README: one optional line for PyTorch's CPU build; .ci/torch_cpu.sh installs from the same index."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = [x for x in readme.splitlines() if "--index-url" in x]
    assert len(line) == 1 and "pip install torch torchvision --index-url" in line[0], line
    index = re.search(r"--index-url (\S+?)`", line[0]).group(1)
    ci = (ROOT / ".ci" / "torch_cpu.sh").read_text(encoding="utf-8")
    assert f'TORCH_CPU_INDEX="${{TORCH_CPU_INDEX:-{index}}}"' in ci
    assert '--index-url "$TORCH_CPU_INDEX"' in ci and "torch torchvision" in ci
