#!/usr/bin/python3
"""parasync-bench (tools/bench) on a tiny budget: what it prints, not how fast anything is.

No figure is compared with a number here (timings belong to tools/, not to tests); the
checks are on the rows a command must print and on how they relate:

  1. --json with --only push,pushpull over --shards 1,2 --workers 1: exactly the parasync
     rows of those sections for both shard counts, every object with the nine documented
     keys, a positive median and ceiling, and ratio = median / ceiling.
  2. The same with --no-ceiling: the same rows with ceiling and ratio null, and no raw
     ZeroMQ figure on the progress line.
  3. --only zmq --shards 3 --workers 2: the raw pair's three rows for that configuration
     and nothing else.
  4. The markdown table (no --json) has its header and one line per row.
  5. Bad flags (--shards 0, --workers 17, --sizes 1000, --only nonsense, --row-dims 0) exit
     with status 2 and name the flag.
  6. --only rows with --row-dims 16 --shards 1: one row per id draw (zipf, uniform), in rows/s
     with a positive ceiling and ratio = median / ceiling, and a progress line per row with
     the rows the servers held at the end.
  7. --only small (5 repeats of 0.1 s): the raw pair's and parasync's pipelined 1 KiB pulls
     (64 in flight per client) for 1 and 2 clients, in req/s, parasync's with the raw pair as
     its ceiling: the server queues a client's small requests past its count of 3
     (docs/reliability.md), so none is refused and the run ends with its figures.

Usage: bench_test.py BIN_DIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, report  # noqa: E402

KEYS = {"what", "size", "shards", "workers", "median", "p99", "unit", "ceiling", "ratio"}
# Each figure from one repeat of 10 ms: the bench's shortest run.
TINY = ["--sizes", "4096", "--repeats", "1", "--seconds", "0.01"]



def bench(bin_dir, *args):
    argv = [os.path.join(bin_dir, "parasync-bench"), *args]
    print("$ " + " ".join(argv), flush=True)
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    if proc.returncode not in (0, 2):
        print(proc.stdout + proc.stderr, flush=True)
    return proc


def json_rows(proc, what):
    check(proc.returncode == 0, f"{what}: exit status {proc.returncode}: {proc.stderr[-2000:]}")
    rows = []
    for line in proc.stdout.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            check(False, f"{what}: a line of --json output is not JSON: {line!r}")
    for row in rows:
        check(set(row) == KEYS, f"{what}: keys {sorted(row)} instead of {sorted(KEYS)}")
    return rows


def keyed(rows):
    return {(r.get("what"), r.get("size"), r.get("shards"), r.get("workers")): r for r in rows}


def main():
    bin_dir = sys.argv[1]

    # 1. parasync rows with their ceilings.
    proc = bench(bin_dir, "--json", "--only", "push,pushpull", "--shards", "1,2", "--workers",
                 "1", *TINY)
    rows = json_rows(proc, "with ceilings")
    want = {(w, 4096, s, 1) for w in ("parasync push", "parasync push+pull") for s in (1, 2)}
    check(set(keyed(rows)) == want and len(rows) == len(want),
          f"with ceilings: rows {sorted(keyed(rows))}, want {sorted(want)}")
    for row in rows:
        check(row["unit"] == "GB/s", f"with ceilings: unit {row['unit']!r}")
        check(row["p99"] is None, f"with ceilings: a data-path row has a p99: {row}")
        ok = isinstance(row["median"], (int, float)) and row["median"] > 0
        ok = ok and isinstance(row["ceiling"], (int, float)) and row["ceiling"] > 0
        check(ok, f"with ceilings: median and ceiling must be positive: {row}")
        if ok:
            ratio = row["median"] / row["ceiling"]
            check(isinstance(row["ratio"], (int, float)) and
                  abs(row["ratio"] - ratio) <= 1e-4 * ratio,  # 6 digits each in JSON
                  f"with ceilings: ratio {row['ratio']} is not median / ceiling = {ratio}")
    check("zmq" in proc.stderr, "with ceilings: no raw ZeroMQ figure on the progress lines")

    # 2. --no-ceiling: the same rows, parasync alone.
    proc = bench(bin_dir, "--json", "--no-ceiling", "--only", "push,pushpull", "--shards", "1,2",
                 "--workers", "1", *TINY)
    rows = json_rows(proc, "--no-ceiling")
    check(set(keyed(rows)) == want and len(rows) == len(want),
          f"--no-ceiling: rows {sorted(keyed(rows))}, want {sorted(want)}")
    for row in rows:
        check(row["ceiling"] is None and row["ratio"] is None,
              f"--no-ceiling: a row still has a ceiling or ratio: {row}")
        check(isinstance(row["median"], (int, float)) and row["median"] > 0,
              f"--no-ceiling: median must be positive: {row}")
    data_lines = [l for l in proc.stderr.splitlines() if "data path" in l and "GB/s" in l]
    check(len(data_lines) == 2, f"--no-ceiling: {len(data_lines)} data-path progress lines, "
          f"want 2: {proc.stderr[-2000:]}")
    check(not any(" zmq " in l for l in data_lines),
          f"--no-ceiling: the raw pair ran: {data_lines}")

    # 3. The raw pair alone, in a configuration other than the defaults.
    proc = bench(bin_dir, "--json", "--only", "zmq", "--shards", "3", "--workers", "2", *TINY)
    rows = json_rows(proc, "--only zmq")
    want_zmq = {(w, 4096, 3, 2) for w in ("zmq push", "zmq pull", "zmq push+pull")}
    check(set(keyed(rows)) == want_zmq and len(rows) == len(want_zmq),
          f"--only zmq: rows {sorted(keyed(rows))}, want {sorted(want_zmq)}")
    for row in rows:
        check(row["ceiling"] is None and row["ratio"] is None and row["median"] > 0,
              f"--only zmq: {row}")

    # 4. The markdown table.
    proc = bench(bin_dir, "--only", "pull", "--shards", "1", "--workers", "1", *TINY)
    check(proc.returncode == 0, f"table: exit status {proc.returncode}: {proc.stderr[-2000:]}")
    lines = [l for l in proc.stdout.splitlines() if l.startswith("|")]
    check(len(lines) == 3 and lines[0].startswith("| what |"),
          f"table: want a header, a rule and one row, got {lines}")
    if len(lines) == 3:
        cells = [c.strip() for c in lines[2].strip("|").split("|")]
        check(cells[:4] == ["parasync pull", "4 KiB", "1", "1"] and cells[6] == "GB/s",
              f"table: row {cells}")

    # 5. Bad flags.
    for args, flag in ((["--shards", "0"], "--shards"), (["--workers", "17"], "--workers"),
                       (["--sizes", "1000"], "--sizes"), (["--only", "nonsense"], "--only"),
                       (["--row-dims", "0"], "--row-dims")):
        proc = bench(bin_dir, *args)
        check(proc.returncode == 2, f"{args}: exit status {proc.returncode}, want 2")
        check(flag in proc.stderr, f"{args}: the error does not name {flag}: {proc.stderr!r}")
        check(proc.stdout == "", f"{args}: printed figures: {proc.stdout!r}")

    # 6. Embedding rows, with their ceiling.
    proc = bench(bin_dir, "--json", "--only", "rows", "--row-dims", "16", "--shards", "1",
                 "--row-workers", "1", *TINY)
    rows = json_rows(proc, "--only rows")
    want_rows = {(f"parasync rows {d} pull+push", 4096 * 16 * 4, 1, 1)
                 for d in ("zipf", "uniform")}
    check(set(keyed(rows)) == want_rows and len(rows) == len(want_rows),
          f"--only rows: rows {sorted(keyed(rows))}, want {sorted(want_rows)}")
    for row in rows:
        ok = row["unit"] == "rows/s" and row["median"] > 0
        ok = ok and isinstance(row["ceiling"], (int, float)) and row["ceiling"] > 0
        check(ok, f"--only rows: {row}")
        if ok:
            ratio = row["median"] / row["ceiling"]
            check(abs(row["ratio"] - ratio) <= 1e-4 * ratio,
                  f"--only rows: ratio {row['ratio']} is not median / ceiling = {ratio}")
    held = [l for l in proc.stderr.splitlines() if "rows held" in l]
    check(len(held) == 2, f"--only rows: {len(held)} progress lines with rows held, want 2: "
          f"{proc.stderr[-2000:]}")

    # 7. Pipelined small pulls, with their ceiling.
    # As --quick runs it (5 repeats of 0.1 s): whether the server reads ahead of what it
    # serves is the machine's timing, and a queue of 3 refused a pull in 19 of 20 such runs,
    # 4 of 6 at 3 x 50 ms, 2 of 6 at TINY's 10 ms (ServerFairnessTest.AClientMayPipeline-
    # SmallRequests checks the rule itself, in turns).
    proc = bench(bin_dir, "--json", "--only", "small", "--repeats", "5", "--seconds", "0.1")
    rows = json_rows(proc, "--only small")
    want_small = {(f"{w} small pull (1 KiB {what}, pipelined)", 1024, 1, c)
                  for w, what in (("zmq", "reply"), ("parasync", "slice")) for c in (1, 2)}
    check(set(keyed(rows)) == want_small and len(rows) == len(want_small),
          f"--only small: rows {sorted(keyed(rows))}, want {sorted(want_small)}")
    for row in rows:
        ok = row["unit"] == "req/s" and isinstance(row["median"], (int, float))
        ok = ok and row["median"] > 0
        if ok and row["what"].startswith("zmq"):
            check(row["ceiling"] is None and row["ratio"] is None, f"--only small: {row}")
        elif ok:
            ok = isinstance(row["ceiling"], (int, float)) and row["ceiling"] > 0
            ok = ok and abs(row["ratio"] - row["median"] / row["ceiling"]) <= \
                1e-4 * row["median"] / row["ceiling"]
        check(ok, f"--only small: {row}")
    windows = [l for l in proc.stderr.splitlines() if "window 64" in l and "req/s" in l]
    check(len(windows) == 2, f"--only small: {len(windows)} progress lines with window 64 and "
          f"req/s, want 2: {proc.stderr[-2000:]}")

    return report()


if __name__ == "__main__":
    sys.exit(main())
