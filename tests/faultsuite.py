"""The bad-input suite's harness (issue 40): every case of ``tests/test_fault_*.py`` ends in one outcome, and
the outcomes are counted per class of fault.

A case is built by its class's generator (a small function yielding parametrised cases), runs the command line
in this process (:func:`cli`; a subprocess where the fault must be the whole process's: a file size limit) or
the library, and is judged (:func:`judge`) as one of

* ``right``: the right number (checked another way: a clean twin, a direct computation, NaN where nothing can be
  known), or the right files;
* ``refused``: exit 2 (or a user error of the library) with one line naming the fault;
* ``traceback``: an exception that is not a user error (a bug's traceback);
* ``silent_wrong``: exit 0 (or a value returned) with a number or file that is wrong, or no word where one is due;
* ``loss``: data that was there before is gone or changed (a table, an export, a record);
* ``hang``: a command that did not end within its time (or its memory: :func:`cli_batch`);
* ``other``: anything else (a refusal where a number was due, a refusal without its line).

Each case records its outcome before it asserts the one expected, so a run on code without the fixes counts
what goes wrong there. ``python -m pytest tests/test_fault_*.py`` prints the counts per class at the end
(``tests/conftest.py``'s terminal summary): cases, right numbers, one-line refusals, tracebacks, silent wrongs,
losses.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTCOMES = ("right", "refused", "traceback", "silent_wrong", "loss", "hang", "other")
CLASSES = {
    "nonfinite": "non-finite numbers",
    "records": "records and neutral settings",
    "empty": "empty values",
    "io": "output and input failures",
    "loss": "nothing destroyed",
    "options": "options dropped on the way",
    # issue 54
    "runfiles": "damaged run files",
    "passthrough": "settings passed through",
    "degenerate": "degenerate inputs",
    "passes": "two-pass measures",
    "unbounded": "unbounded requests",
    "leftovers": "what a refusal leaves",
}
TALLY: dict[str, Counter] = {name: Counter() for name in CLASSES}


@dataclass
class Run:
    """What one command did: its exit status, stdout, stderr, and the exception that escaped (a traceback)."""

    code: Any
    out: str
    err: str
    error: BaseException | None = None
    trace: str = ""
    hung: bool = False

    @property
    def lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]

    def one_error_line(self, phrase: str = "") -> bool:
        """Exit 2 and exactly one ``error:`` line on stderr, the last, holding ``phrase`` (case-insensitive),
        no traceback."""
        errors = [line for line in self.lines if "error:" in line]
        return (
            self.error is None
            and self.code == 2
            and len(errors) == 1
            and self.lines[-1] == errors[0]
            and "Traceback" not in self.err
            and phrase.lower() in errors[0].lower()
        )


def cli(argv: list[str]) -> Run:
    """``posgeom ARGV`` in this process: stdout and stderr captured, SystemExit turned into the status, any other
    exception kept (its traceback is the outcome ``traceback``)."""
    from timm_posgeom.cli import main

    out, err = io.StringIO(), io.StringIO()
    error, trace, code = None, "", None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _log_handlers_to(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
        except Exception as e:  # noqa: BLE001  (the suite counts it)
            error, trace = e, traceback.format_exc()
    return Run(code, out.getvalue(), err.getvalue(), error, trace)


@contextlib.contextmanager
def _log_handlers_to(stream: io.StringIO) -> Iterator[None]:
    """Every library logger's stream handler pointed at ``stream`` for the call, then back. A library such as
    datasets 2.18 binds its handler to the ``sys.stderr`` of the moment it was imported, which in this process is
    an earlier test's capture, closed since: its next warning would print a logging error instead of itself (a
    command runs in a process of its own, where the two are the same stream)."""
    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    handlers = [h for lg in loggers for h in lg.handlers if type(h) is logging.StreamHandler]
    old = [h.stream for h in handlers]
    for h in handlers:  # not setStream: it flushes the old stream, which may be closed
        h.stream = stream
    try:
        yield
    finally:
        for h, s in zip(handlers, old):
            h.stream = s


def cli_process(
    argv: list[str], *, file_limit: int | None = None, wrap: list[str] | None = None, timeout: float = 300
) -> Run:
    """``posgeom ARGV`` in a new process (``python -m timm_posgeom.cli``), optionally under a file size limit
    (RLIMIT_FSIZE, SIGXFSZ ignored, so that a write beyond it fails with EFBIG as a full disk fails with
    ENOSPC) or inside ``wrap`` (e.g. a mount namespace). A traceback on stderr is the outcome ``traceback``."""
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"limit = {file_limit if file_limit is not None else -1}\n"
        "if limit >= 0: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))\n"
        "from timm_posgeom.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    cmd = [*(wrap or []), sys.executable, "-c", code, *map(str, argv)]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg", TQDM_DISABLE="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    error = RuntimeError("traceback") if "Traceback (most recent call last)" in done.stderr else None
    return Run(done.returncode, done.stdout, done.stderr, error, done.stderr if error else "")


_BATCH = """
import contextlib, io, json, resource, signal, sys, traceback
hard = resource.getrlimit(resource.RLIMIT_AS)[1]  # never above a limit the parent has
resource.setrlimit(resource.RLIMIT_AS, ({memory} if hard < 0 else min({memory}, hard), hard))
from timm_posgeom.cli import main

class Hung(BaseException):
    pass

def alarm(signum, frame):
    raise Hung
signal.signal(signal.SIGALRM, alarm)
for line in sys.stdin:
    argv = json.loads(line)
    out, err, code, trace, hung = io.StringIO(), io.StringIO(), None, "", False
    signal.alarm({seconds})
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except Hung:
            hung = True
        except BaseException:  # MemoryError past the limit included: a traceback
            trace = traceback.format_exc()
    signal.alarm(0)
    print(json.dumps(dict(code=code, out=out.getvalue()[-50000:], err=err.getvalue()[-20000:], trace=trace, hung=hung)))
    sys.stdout.flush()
    if "MemoryError" in trace or "allocate" in trace:  # its address space may stay taken: the next in a new process
        sys.exit(3)
"""


def cli_batch(argvs: list[list[Any]], *, memory: int = 6 * 2**30, seconds: int = 60) -> list[Run]:
    """``posgeom ARGV`` for each of ``argvs``, one after another in one new process (one start for many cases)
    whose address space is limited to ``memory`` bytes (a request that grows past it ends in a MemoryError:
    ``traceback``) and where each command has ``seconds`` (past them: ``hang``). A case that kills the process (an
    allocator's abort) is a ``traceback``, and a new process goes on with the next."""
    code = _BATCH.replace("{memory}", str(memory)).replace("{seconds}", str(seconds))
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg", TQDM_DISABLE="1")
    runs: list[Run] = []
    while len(runs) < len(argvs):
        rest = argvs[len(runs) :]
        stdin = "".join(json.dumps([str(a) for a in argv]) + "\n" for argv in rest)
        done = subprocess.run(
            [sys.executable, "-c", code],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=seconds * len(rest) + 120,
        )
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                error = RuntimeError("traceback") if r["trace"] else None
                runs.append(Run(r["code"], r["out"], r["err"], error, r["trace"], r["hung"]))
        if len(runs) < len(argvs) and done.returncode != 3:  # the case after the last answered killed the process
            died = f"the process died (exit {done.returncode}): {done.stderr[-2000:]}"
            runs.append(Run(done.returncode, "", done.stderr[-2000:], RuntimeError(died), died))
    return runs


def library(fn: Any) -> tuple[Any, BaseException | None, str]:
    """(what ``fn()`` returned, the exception it raised, its traceback)."""
    try:
        return fn(), None, ""
    except Exception as e:  # noqa: BLE001
        return None, e, traceback.format_exc()


def refused(run: Run, phrase: str = "") -> str:
    """The outcome of a case that must be refused in one line holding ``phrase``."""
    if run.hung:
        return "hang"
    if run.error is not None:
        return "traceback"
    if run.one_error_line(phrase):
        return "refused"
    return "silent_wrong" if run.code == 0 else "other"


def right(run: Run, ok: bool) -> str:
    """The outcome of a case that must end with exit 0 and ``ok`` (the right number, the right word)."""
    if run.hung:
        return "hang"
    if run.error is not None:
        return "traceback"
    if run.code != 0:
        return "other"
    return "right" if ok else "silent_wrong"


def library_refused(error: BaseException | None, phrase: str = "") -> str:
    """The outcome of a library call that must raise a user error whose one line holds ``phrase``."""
    from timm_posgeom.errors import user_error_line

    if error is None:
        return "silent_wrong"
    line = user_error_line(error)  # None: no user error, a bug's traceback
    if line is not None and phrase.lower() in line.lower():
        return "refused"
    return "traceback" if line is None else "other"


def judge(cls: str, outcome: str, expected: str, detail: Any = "") -> None:
    """Count ``outcome`` for ``cls``, then assert it is ``expected``."""
    assert outcome in OUTCOMES, outcome
    TALLY[cls][outcome] += 1
    assert outcome == expected, f"{cls}: {outcome}, expected {expected}: {str(detail)[-3000:]}"


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path -> SHA-1 of its bytes) and every folder (-> ``"dir"``): what
    must be there unchanged after a refusal."""
    found = {}
    for path in sorted(Path(root).rglob("*")):
        rel = path.relative_to(root).as_posix()
        found[rel] = "dir" if path.is_dir() else hashlib.sha1(path.read_bytes()).hexdigest()
    return found


def table() -> list[str]:
    """The counts per class whose cases ran, as markdown lines (empty when no case ran)."""
    if not any(TALLY.values()):
        return []
    head = "| class | cases | right numbers | one-line refusals | tracebacks | silent wrongs | losses | hangs | other |"
    lines = [head, "|" + "---|" * 9]
    total = Counter()
    for name, label in CLASSES.items():
        c = TALLY[name]
        if not c:  # a class none of whose cases ran
            continue
        total.update(c)
        lines.append(f"| {label} | {sum(c.values())} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |")
    lines.append(f"| all | {sum(total.values())} | " + " | ".join(str(total[o]) for o in OUTCOMES) + " |")
    return lines


def fake_study(root: Path, data: Path, seeds: int = 2) -> tuple[Path, list[str]]:
    """A study folder as ``posgeom study --preset demo --data DATA --conditions nope --num-seeds SEEDS`` leaves it
    after training (plan.json with the data's identity; each run's recipe.yaml, export, summary.json and an
    eval.json with no part measured yet), made in seconds. Returns (the folder, the argv that resumes it)."""
    import timm
    import yaml

    from timm_posgeom.app.hub import export_for_hub
    from timm_posgeom.app.records import RunEval, RunSummary
    from timm_posgeom.app.study import preset_config
    from timm_posgeom.app.study.measure import eval_settings
    from timm_posgeom.app.study.plan import make_plan, write_plan
    from timm_posgeom.data import data_identity, load_split
    from timm_posgeom.models.pretrained import weights_sha1

    out = root / "study"
    config = preset_config("demo", data=str(data), conditions=("nope",), seeds=seeds)
    plan = make_plan(config, out)
    val = load_split(str(data), "validation")
    identity = (
        data_identity(val, content=True) if "content" in data_identity.__code__.co_varnames else data_identity(val)
    )
    out.mkdir(parents=True)
    write_plan(config, out, plan.to_json(), data=identity)
    for run in plan.runs:
        run.run_dir.mkdir(parents=True)
        (run.run_dir / "recipe.yaml").write_text(yaml.safe_dump(run.recipe.to_dict(), sort_keys=False))
        model = timm.create_model(
            run.recipe.model, num_classes=val.num_classes, img_size=run.recipe.img_size, **run.recipe.model_kwargs
        )
        export_for_hub(
            model,
            run.run_dir / "export",
            dict(num_classes=val.num_classes, img_size=run.recipe.img_size, **run.recipe.model_kwargs),
        )
        sha1 = weights_sha1(run.run_dir / "export" / "model.safetensors")
        RunSummary(
            model=run.recipe.model,
            steps=1,
            epochs=1.0,
            train_images=4,
            val_images=len(val),
            processes=1,
            time_s=1.0,
            export_sha1=sha1,
        ).write(run.run_dir / "summary.json")
        RunEval(settings=eval_settings(config, val), weights_sha1=sha1).write(run.run_dir / "eval.json")
    argv = [
        "study",
        "--preset",
        "demo",
        "--data",
        data,
        "--conditions",
        "nope",
        "--num-seeds",
        str(seeds),
        "--out",
        out,
        "--resume",
    ]
    return out, argv
