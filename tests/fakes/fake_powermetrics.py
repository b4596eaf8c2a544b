"""A stand-in for macOS ``powermetrics`` that replays a recorded plist stream.

Run as ``python fake_powermetrics.py --file REC [replay options] <powermetrics options>``.
It accepts the real tool's options that the meter passes, rejects anything else the way
a real command line would (exit status 2), and prints one recorded sample per ``-i``
milliseconds on a fixed grid, NUL-separated, until ``-n`` samples or SIGTERM.  Like the
real tool it reports the time that actually elapsed: ``elapsed_ns``, ``timestamp`` and
the ``*_energy`` fields are rewritten; the power values and tasks are replayed as
recorded (after the pid substitutions below), cycling through the recording.

Replay options (the test controls them, the meter never sees them):

``--pid P`` / ``--child-pid C``
    put P (and C) in place of the recorded measured process (and its child), so that
    the meter finds "itself" in the task list;
``--log FILE``
    append one JSON line per printed sample: recording index ``k`` and the
    ``time.perf_counter`` interval ``[t0, t1]`` it stands for (the ground truth; on
    Linux and macOS that clock is system-wide, so the test can compare);
``--refuse-sudo``
    behave like ``sudo -n`` without a sudoers rule: print sudo's message, exit 1;
``--fail-after N`` / ``--stall-after N``
    after N samples, die with an error message, or stay alive and print nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import plistlib
import sys
import time
from collections.abc import Sequence
from typing import Any

RECORDED_PID = 41357  # the measured python process in the recording
RECORDED_CHILD_PID = 41362  # its child process
RECORDED_POWERMETRICS_PID = 41377  # powermetrics itself, which lists itself too

KNOWN_SAMPLERS = {
    "tasks",
    "battery",
    "network",
    "disk",
    "interrupts",
    "cpu_power",
    "gpu_power",
    "ane_power",
    "thermal",
    "sfi",
    "default",
    "all",
}
RECORDED_SAMPLERS = {"tasks", "cpu_power", "gpu_power"}
SUDO_REFUSAL = "sudo: a password is required\n"
FAILURE_MESSAGE = "powermetrics: sampler cpu_power failed: (ipc/send) invalid destination port\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="powermetrics", allow_abbrev=False)
    # replay controls
    parser.add_argument("--file", required=True)
    parser.add_argument("--pid", type=int)
    parser.add_argument("--child-pid", type=int)
    parser.add_argument("--log")
    parser.add_argument("--refuse-sudo", action="store_true")
    parser.add_argument("--fail-after", type=int)
    parser.add_argument("--stall-after", type=int)
    # the real tool's options
    parser.add_argument("-i", "--sample-rate", "--sample-interval", type=int, default=5000)
    parser.add_argument("-n", "--sample-count", type=int, default=0)
    parser.add_argument("-f", "--format", default="text")
    parser.add_argument("-s", "--samplers", default="default")
    parser.add_argument("-b", "--buffer-size", type=int)
    parser.add_argument("--show-process-energy", action="store_true")
    args = parser.parse_args(argv)
    if args.sample_rate <= 0:
        parser.error(f"-i must be a positive number of ms, got {args.sample_rate}")
    if args.format != "plist":
        parser.error(f"this replay prints only -f plist, not {args.format!r}")
    samplers = set(args.samplers.split(","))
    unknown = samplers - KNOWN_SAMPLERS
    if unknown:
        parser.error(f"unrecognized sampler(s): {', '.join(sorted(unknown))}")
    if not samplers <= RECORDED_SAMPLERS:
        parser.error(
            f"the recording holds only {sorted(RECORDED_SAMPLERS)}, not {sorted(samplers)}"
        )
    args.sampler_set = samplers
    return args


def load_recording(path: str) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        raw = f.read()
    docs = [plistlib.loads(part.strip()) for part in raw.split(b"\0") if part.strip()]
    if not docs:
        raise SystemExit(f"no samples in {path}")
    return docs


def render(
    doc: dict[str, Any], args: argparse.Namespace, elapsed_ns: int, now: dt.datetime
) -> bytes:
    """One sample as powermetrics would print it for these options."""
    out = dict(doc)
    out["elapsed_ns"] = elapsed_ns
    out["timestamp"] = now
    elapsed_s = elapsed_ns / 1e9
    pid_map = {RECORDED_POWERMETRICS_PID: os.getpid()}
    if args.pid is not None:
        pid_map[RECORDED_PID] = args.pid
    if args.child_pid is not None:
        pid_map[RECORDED_CHILD_PID] = args.child_pid
    taken = set(pid_map.values())
    if "tasks" in args.sampler_set:
        tasks = []
        for task in doc["tasks"]:
            task = dict(task)
            pid = task["pid"]
            if pid in pid_map:
                task["pid"] = pid_map[pid]
            elif pid in taken:  # a recorded bystander must not pose as a live process
                task["pid"] = pid + 1_000_000
            task["interval_ns"] = elapsed_ns
            if not args.show_process_energy:
                task.pop("energy_impact", None)
                task.pop("energy_impact_per_s", None)
            tasks.append(task)
        out["tasks"] = tasks
    else:
        out.pop("tasks", None)
        out.pop("all_tasks", None)
    if "cpu_power" in args.sampler_set:
        processor = dict(doc["processor"])
        for name in ("cpu", "gpu", "ane"):
            processor[f"{name}_energy"] = round(processor[f"{name}_power"] * elapsed_s)
        out["processor"] = processor
    else:
        out.pop("processor", None)
    if "gpu_power" in args.sampler_set:
        gpu = dict(doc["gpu"])
        gpu["gpu_energy"] = round(doc["processor"]["gpu_power"] * elapsed_s)
        out["gpu"] = gpu
    else:
        out.pop("gpu", None)
    return plistlib.dumps(out, sort_keys=False) + b"\0"


def _utc_now() -> dt.datetime:
    """Naive UTC, as plist dates carry no zone."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.refuse_sudo:
        sys.stderr.write(SUDO_REFUSAL)
        return 1
    recording = load_recording(args.file)
    interval_s = args.sample_rate / 1000.0
    log = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115
    out = sys.stdout.buffer
    start_t = prev_t = time.perf_counter()
    n = 0
    try:
        while args.sample_count <= 0 or n < args.sample_count:
            if args.fail_after is not None and n >= args.fail_after:
                sys.stderr.write(FAILURE_MESSAGE)
                return 1
            if args.stall_after is not None and n >= args.stall_after:
                time.sleep(3600)  # alive but silent, until terminated
            # A fixed grid like the real sampler's, so that late wake-ups do not drift.
            time.sleep(max(0.0, start_t + (n + 1) * interval_s - time.perf_counter()))
            now_t = time.perf_counter()
            k = n % len(recording)
            frame = render(recording[k], args, round((now_t - prev_t) * 1e9), _utc_now())
            if log is not None:
                log.write(json.dumps({"k": k, "t0": prev_t, "t1": now_t}) + "\n")
                log.flush()
            out.write(frame)
            out.flush()
            prev_t = now_t
            n += 1
    except BrokenPipeError:
        return 0  # the reader went away, as when the meter stops
    finally:
        if log is not None:
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
