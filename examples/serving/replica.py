"""A stand-in inference replica: it serves nothing, but reports the load written in a file
(requests per second it would be serving, one number) through ``sdk.report_load`` every
half second, as a real server would from its request queue, and stops on the checkpoint
signal. ``python replica.py LOAD_FILE``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from boltforge import sdk


def main() -> None:
    source = Path(sys.argv[1])
    print(f"replica of job {sdk.job_id()} up", flush=True)
    while not sdk.preempted():
        try:
            rate = float(source.read_text(encoding="utf-8").strip() or 0)
        except (OSError, ValueError):
            rate = 0.0
        sdk.report_load(requests_per_s=rate, queued=0.0, p99_ms=40.0 + rate, kv_cache=0.2)
        time.sleep(0.5)
    print("replica stopping", flush=True)


if __name__ == "__main__":
    main()
