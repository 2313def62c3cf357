from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import timm_posgeom  # noqa: F401  (registers the models)

# Real images: the project's shared Imagenette copy beside the checkout, or POSGEOM_IMAGENETTE (e.g. when
# the tests run from an unpacked sdist).
IMAGENETTE = Path(
    os.environ.get("POSGEOM_IMAGENETTE")
    or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "imagenette"
)
# CI sets POSGEOM_REQUIRE_IMAGENETTE=1: it has the copy, so a test that would skip without it must run there
if os.environ.get("POSGEOM_REQUIRE_IMAGENETTE") == "1" and not IMAGENETTE.is_dir():
    raise pytest.UsageError(f"POSGEOM_REQUIRE_IMAGENETTE=1, but {IMAGENETTE} is not there: its tests would skip")


# torch threads per test process: under pytest-xdist, its share of the cores (CI: 2 workers on 2 cores, 1 thread
# each, rather than 2 processes of 2 threads fighting over 2 cores); alone, torch's default.
SESSION_THREADS = max(1, torch.get_num_threads() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
torch.set_num_threads(SESSION_THREADS)
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    # and the same share for the processes a test starts (a study's trainings, the commands, accelerate's
    # launches): two workers' children of 2 threads each on 2 cores made two demo studies at once take 70 s
    # against 57 s with 1 thread each (CONTRIBUTING.md, "What CI runs")
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(SESSION_THREADS))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    """Every test starts from torch seed 0, and the torch thread count it found is set back after it (a test that
    changes the count does not leave it to the next)."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# Every test that takes over SLOW_SECONDS (setup, call and teardown together) is marked `slow` (CONTRIBUTING.md;
# CI still runs it): the run's summary lists those that are not.
SLOW_SECONDS = 5.0
_seconds: dict[str, float] = {}
_marked_slow: set[str] = set()


# Marked here rather than at each test: every user of a module fixture that takes over 5 s to build (whichever of
# them runs first pays for it), and the slow parameter of a fast test whose cases come from a table.
SLOW_FIXTURES = {
    "demo_study",
    "zoo",
    "study_figures",
    "zoo_of_two",
    "rows_by_batch",
    "study_numbers_by_batch",
    "tiny_plan_run",
}
# (a DataLoader worker process of its own; a large timm model built)
SLOW_CASES = {
    "test_support_row[dla]",
    "test_support_row[vgg]",
    "test_probe_and_fragility_name_a_damaged_image_in_one_line[1]",
}


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or item.name in SLOW_CASES:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    if "slow" in report.keywords:
        _marked_slow.add(report.nodeid)


def pytest_terminal_summary(terminalreporter) -> None:
    _fault_counts(terminalreporter)
    unmarked = sorted(((t, n) for n, t in _seconds.items() if t > SLOW_SECONDS and n not in _marked_slow), reverse=True)
    if unmarked:
        terminalreporter.write_sep("=", f"{len(unmarked)} tests over {SLOW_SECONDS:g} s not marked slow")
        for seconds, nodeid in unmarked:
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}")
    path = os.environ.get("POSGEOM_DURATIONS")
    if path and _seconds:  # .ci/run: the durations report it commits (.ci/durations.txt)
        write_durations(Path(path), _seconds, _marked_slow, terminalreporter.config)


def _fault_counts(terminalreporter) -> None:
    """After a run that included cases of the bad-input suite (``tests/test_fault_*.py``): their outcomes counted
    per class (``tests/faultsuite.py``)."""
    suite = sys.modules.get("faultsuite")
    lines = suite.table() if suite is not None else []
    if lines:
        terminalreporter.write_sep("-", "bad-input suite: outcomes per class (tests/faultsuite.py)")
        for line in lines:
            terminalreporter.write_line(line)


def write_durations(path: Path, seconds: dict[str, float], slow: set[str], config: Any, over: float = 0.5) -> None:
    """Every test's seconds (setup, call and teardown), slowest first, those over ``over`` s; ``slow`` after the
    tests so marked."""
    workers = getattr(config.option, "numprocesses", None) or 1
    rows = sorted(((t, n) for n, t in seconds.items() if t > over), reverse=True)
    lines = [
        f"# python -m pytest -q with {workers} worker(s): {len(seconds)} tests, {sum(seconds.values()):.0f} s of "
        f"test time; those over {over:g} s (setup + call + teardown), slowest first. Written by .ci/run.",
        *(f"{t:7.2f}s {n}{'  slow' if n in slow else ''}" for t, n in rows),
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def one_thread():
    """Tiny tensors: one torch thread is faster than two fighting over a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def imagenette_path() -> Path:
    if not IMAGENETTE.exists():
        pytest.skip("../shared/data/imagenette is not present")
    return IMAGENETTE


# --------------------------------------------------------------------------------------------


def lock_holder(out: Path) -> subprocess.Popen:
    """Another process that holds the run lock of ``out`` (``app.rundir.RunLock``) and sleeps; returned once it
    holds it (kill it to end the hold, as a killed run ends it)."""
    code = "import sys, time\nfrom timm_posgeom.app.rundir import RunLock\nlock = RunLock(sys.argv[1])\n"
    code += "lock.acquire()\nprint('held', flush=True)\ntime.sleep(120)\n"
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held", "the lock holder did not start"
    return proc


# --------------------------------------------------------------------------------------------
# launched processes (accelerate launch / torchrun)
# --------------------------------------------------------------------------------------------
LAUNCH_MARK = "POSGEOM_TEST_LAUNCH"


def free_port() -> int:
    """A TCP port free on this machine now, for one launch's rendezvous: two launches never share the
    default 29500, and port 0 is no port to the workers (see timm_posgeom.measuring.distributed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signal_launched(token: str, sig: int) -> None:
    """Send ``sig`` to every live process of the launch marked ``token`` (this one excepted)."""
    import psutil  # accelerate's dependency: there wherever a launch can run

    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError):
            if p.environ().get(LAUNCH_MARK) == token:
                p.send_signal(sig)


def run_launched(cmd: list[str], *, env: dict[str, str], timeout: float, cwd=None) -> subprocess.CompletedProcess:
    """Run a launcher command (accelerate launch, torchrun) to its end, and leave none of its processes behind.

    The launcher runs in a session of its own, and torchrun starts every worker in yet another session, so a
    timeout that killed the launcher (``subprocess.run``'s) would orphan the workers, which may then block the
    next launch. Every process of this launch carries a token in its environment (inherited by every
    descendant); on timeout each dumps its Python stack into the captured output (faulthandler, SIGABRT), all
    are killed, and the test fails with that output. After a normal exit any process left over is killed too.
    """
    token = uuid.uuid4().hex
    env = dict(env, PYTHONFAULTHANDLER="1", **{LAUNCH_MARK: token})
    timed_out = False
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_launched(token, signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        finally:  # also when the test is interrupted
            _signal_launched(token, signal.SIGKILL)
            if proc.poll() is None:  # not yet reaped: its process group cannot be another's
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if timed_out:
        pytest.fail(
            f"{' '.join(map(str, cmd))} ran past {timeout} s; every process it started was killed.\n"
            f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-8000:]}",
            pytrace=False,
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


# -- helpers several test files share --------------------------------------------------------------------------
def accelerate_launch_argv(*target: str, processes: int = 2) -> list[str]:
    """The one ``accelerate launch`` command line of the tests: ``processes`` CPU processes on this machine
    (with ``ACCELERATE_USE_CPU=1`` in the environment, see :func:`launch_env`), then ``target`` (a script and its
    arguments, or ``-m module ...``).

    accelerate 1.x's ``launch --cpu`` starts ONE process (several only with an MPI hostfile): several CPU
    processes come from its torchrun-based launcher (``--multi_gpu``) with ``ACCELERATE_USE_CPU`` set (gloo). A
    free port of our own, not the default 29500 another launch may hold, nor 0: accelerate before 1.7 hands
    ``--main_process_port 0`` to the workers as port 0, where they wait forever."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        *target,
    ]


def launch_env() -> dict[str, str]:
    """The environment of a launched measurement (tests/test_distributed.py, tests/test_attention.py): one thread
    per process (deterministic and kind to a shared machine), CPU, no launch variables of ours leaking in."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", ACCELERATE_USE_CPU="1")
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def assert_json_close(a, b, tol: float, path: str = "") -> None:
    """``a`` and ``b`` (JSON values) equal: ints, bools, strings and None exactly; floats within ``tol``."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_json_close(a[k], b[k], tol, f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_json_close(x, y, tol, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert isinstance(b, (int, float)) and abs(a - b) <= tol, (path, a, b)
    else:
        assert a == b and type(a) is type(b), (path, a, b)


def parquet_set(root: Path) -> Path:
    """A tiny Hub-layout set with two configurations (``small``: 3 classes, ``big``: 4), each with a train
    and a validation split of distinct images, as the Hub lays out ``configs:`` in the README."""
    import io

    import datasets
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for config, classes in (("small", 3), ("big", 4)):
        for split, n in (("train", 12), ("validation", 6)):
            images = []
            for _ in range(n):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(buf, format="JPEG")
                images.append({"bytes": buf.getvalue(), "path": None})
            features = datasets.Features(
                {"image": datasets.Image(), "label": datasets.ClassLabel(names=[f"c{i}" for i in range(classes)])}
            )
            ds = datasets.Dataset.from_dict(
                {"image": images, "label": [i % classes for i in range(n)]}, features=features
            )
            (root / config).mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(root / config / f"{split}-00000-of-00001.parquet"))
    card = ["---", "configs:"]
    for config in ("small", "big"):
        card += [f"- config_name: {config}", "  data_files:"]
        card += [f"  - split: {s}\n    path: {config}/{s}-*.parquet" for s in ("train", "validation")]
    (root / "README.md").write_text("\n".join(card + ["---", ""]))
    return root
