"""Render a study's ``report.html`` in headless Chromium and save a screenshot (a check that the page renders).

    python scripts/screenshot_report.py runs/study-demo docs/figures/report_demo.png [--height 3200]

Needs a Chromium (Debian: ``apt-get install chromium``); the flags keep it off the network, which a
report never needs (its figures are embedded).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--hide-scrollbars",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a study directory holding report.html")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=3200)
    args = parser.parse_args(argv)
    page = (args.run_dir / "report.html").resolve()
    if not page.is_file():
        print(f"no report.html in {args.run_dir}", file=sys.stderr)
        return 2
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("no Chromium found (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            browser,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={args.width},{args.height}",
            f"--screenshot={args.out.resolve()}",
            page.as_uri(),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not args.out.is_file():
        print(f"chromium failed ({done.returncode}): {done.stderr[-500:]}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
