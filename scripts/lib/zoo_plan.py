#!/usr/bin/env python3
"""Times remat-plan on every model of the zoo: captures each exported model once into a problem
(remat-capture, kept beside the .pt file and reused while newer than it), then runs
`remat-plan PROBLEM --budget B` for each budget and prints one row per model and budget: the
wall time of the whole command, its exit code and what it answered.

  zoo_plan.py --manifest build/zoo/manifest.json --bin build/bin [--budgets 50,80]
              [--remat-plan PATH] [--models a,b] [--modes traced] [--timeout S]
              [-- extra remat-plan options]

Only the standard library: the drivers need no torch (the capture is remat-capture's)."""
import argparse
import json
import os
import re
import subprocess
import sys
import time


def shape_options(inputs):
    options = []
    for spec in inputs:
        options += ["--input-shape", "x".join(str(d) for d in spec["shape"]),
                    "--input-dtype", spec.get("dtype", "float")]
        if "high" in spec:
            options += ["--int-high", str(spec["high"])]
    return options


def capture(entry, capture_bin):
    """The problem of one exported model, captured unless a newer capture exists."""
    model_file = entry["file"]
    problem = re.sub(r"\.pt$", "", model_file) + ".problem.json"
    if os.path.exists(problem) and os.path.getmtime(problem) >= os.path.getmtime(model_file):
        return problem, None
    command = [capture_bin, model_file, "--out", problem, "--quiet"] + shape_options(entry["inputs"])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]
    return problem, None


def answer(done):
    """What remat-plan said, in a few words: the plan's overhead, or why there is none."""
    text = done.stdout + done.stderr
    if done.returncode == 0:
        chosen = re.search(r"chose (\w+)", text)
        overhead = re.search(r"overhead ([+-]?[0-9.]+ %)", text)
        return "plan" + (" (" + chosen.group(1) + ")" if chosen else "") + (", " + overhead.group(1) if overhead else "")
    if done.returncode == 3:
        if "below a proven lower bound" in text:
            return "infeasible: below the proven bound"
        return "infeasible: beyond the solver's reach"
    lines = [line for line in text.strip().splitlines() if line]
    return "error: " + (lines[-1][:80] if lines else "exit %d" % done.returncode)


def problem_size(problem):
    with open(problem) as f:
        data = json.load(f)
    return len(data.get("ops", []))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--bin", required=True, help="folder of remat-capture and remat-plan")
    parser.add_argument("--remat-plan", help="another remat-plan to time (for example an older build)")
    parser.add_argument("--budgets", default="50")
    parser.add_argument("--models", default="")
    parser.add_argument("--modes", default="", help="exports to time (traced, scripted; default both)")
    parser.add_argument("--timeout", type=float, help="stop a remat-plan after this many seconds")
    parser.add_argument("extra", nargs="*", help="options passed on to remat-plan (after --)")
    args = parser.parse_args()
    plan_bin = args.remat_plan or os.path.join(args.bin, "remat-plan")
    capture_bin = os.path.join(args.bin, "remat-capture")
    wanted = set(filter(None, args.models.split(",")))
    modes = set(filter(None, args.modes.split(",")))
    with open(args.manifest) as f:
        manifest = [e for e in json.load(f) if (not wanted or e["model"] in wanted) and (not modes or e["mode"] in modes)]

    print("| model | export | ops | budget | wall s | exit | answer |")
    print("|---|---|---:|---:|---:|---:|---|")
    slowest = 0.0
    for entry in manifest:
        problem, failure = capture(entry, capture_bin)
        if problem is None:
            print("| %s | %s | | | | | capture failed: %s |" % (entry["model"], entry["mode"], failure), flush=True)
            continue
        ops = problem_size(problem)
        for budget in args.budgets.split(","):
            command = [plan_bin, problem, "--budget", budget + "%"] + args.extra
            start = time.monotonic()
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                slowest = max(slowest, args.timeout)
                print("| %s | %s | %d | %s %% | > %.0f | | stopped after %.0f s |" % (
                    entry["model"], entry["mode"], ops, budget, args.timeout, args.timeout), flush=True)
                continue
            wall = time.monotonic() - start
            slowest = max(slowest, wall)
            print("| %s | %s | %d | %s %% | %.2f | %d | %s |" % (entry["model"], entry["mode"], ops, budget, wall,
                                                                done.returncode, answer(done)), flush=True)
    print("\nslowest remat-plan: %s%.2f s" % ("> " if args.timeout and slowest >= args.timeout else "", slowest))


if __name__ == "__main__":
    sys.exit(main())
