"""Runs a command and records its output with the time of each line, then names its longest silences.

    python tools/silences.py --log build/fresh-book.log -- make book

Every line the command writes (stdout and stderr together, through a pipe, as in CI or a log file; a bar's redraw
ends a line too) is written to the log as ``<seconds since the start> <line>``. At the end the five longest
silences are printed, each with the line that broke it, and whether any lasted longer than ``--limit`` (15 s):
exit 1 if one did, else the command's own status.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True, help="where the stamped output goes")
    ap.add_argument("--limit", type=float, default=15.0, help="the longest silence allowed (seconds)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given")
    t0 = last = time.monotonic()
    gaps, line = [], b""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
    with open(args.log, "w", encoding="utf-8", buffering=1) as log:
        while chunk := proc.stdout.read(65536):  # unbuffered: what one read of the pipe returns
            now = time.monotonic()
            *done, line = (line + chunk).replace(b"\r", b"\n").split(b"\n")
            for text in (d.decode(errors="replace") for d in done):
                if text.strip():
                    gaps.append((now - last, round(now - t0, 1), text))
                    last = now
                    log.write(f"{now - t0:8.1f} {text}\n")
                    print(text, flush=True)
        rc = proc.wait()
        end = time.monotonic()
        gaps.append((end - last, round(end - t0, 1), f"(the command ended with status {rc})"))
        log.write(f"{end - t0:8.1f} (the command ended with status {rc})\n")
    longest = sorted(gaps, reverse=True)[:5]
    print(f"\n{len(gaps)} lines in {end - t0:.0f} s; the longest silences (seconds, ended at, by the line):",
          file=sys.stderr)
    for gap, at, text in longest:
        print(f"  {gap:6.1f} s, ended at {at:7.1f} s: {text[:100]}", file=sys.stderr)
    over = [g for g in gaps if g[0] > args.limit]
    print(f"{len(over)} silences longer than {args.limit:.0f} s", file=sys.stderr)
    return 1 if over else rc


if __name__ == "__main__":
    sys.exit(main())
