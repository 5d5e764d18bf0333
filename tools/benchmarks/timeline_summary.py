#!/usr/bin/env python3
"""Medians of each phase of a parasync.horovod timeline (hvd.start_timeline, or
HOROVOD_TIMELINE=path in the workers' environment; "{rank}" in the path gives every rank its
own file), in milliseconds: what docs/performance.md's step tables quote.

  timeline_summary.py [--skip N] FILE...

Prints one line per file: its rank, the steps counted (all but the first N, default 50: the
warm-up), and the median of each span of the training thread (step, optimizer + forward,
backward, synchronize; async: forward + backward, optimizer, exchange) and of the exchange
(push, pull), then push + pull together (the exchange from the first push sent to the last
reply). Exit 2 for a file that is not a timeline.
"""
import argparse
import json
import statistics
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--skip", type=int, default=50, help="leading steps left out (default 50)")
    p.add_argument("files", nargs="+")
    args = p.parse_args()
    for path in args.files:
        try:
            with open(path) as f:
                text = f.read().rstrip().rstrip(",")
            events = json.loads(text if text.endswith("]") else text + "]")
            spans, rank = {}, None
            for e in events:
                if e.get("ph") == "X":
                    rank = e["pid"]
                    spans.setdefault(e["name"], []).append(e["dur"] / 1000.0)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"timeline_summary.py: {path}: not a timeline ({e})", file=sys.stderr)
            return 2
        steps = len(spans.get("step", []))
        if steps <= args.skip:
            print(f"timeline_summary.py: {path}: {steps} steps, not more than --skip "
                  f"{args.skip}", file=sys.stderr)
            return 2
        kept = {n: v[args.skip:] for n, v in spans.items()}
        exchange = [a + b for a, b in zip(kept.get("push", []), kept.get("pull", []))]
        parts = [f"{n} {statistics.median(v):.1f}" for n, v in kept.items() if v]
        if exchange:
            parts.append(f"push + pull {statistics.median(exchange):.1f}")
        print(f"{path}: rank {rank}, {steps - args.skip} steps, medians (ms): " +
              "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
