"""The capture hook's cost on the CPU decode loops, hook off and on side by side.

    python python/tests/measure_capture_overhead.py [REPS]

Runs each loop REPS times (default 5) alternating off and on in the same
process (after one warm-up run of each, which pays Triton's interpreter and
torch's first-call costs), and prints min and median wall time of each,
the files one healthy run writes and their sizes. Not a test: timings on a
shared machine are for the record, not for asserting.
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TRITON_INTERPRET", "1")

import engine_loop  # noqa: E402

from kcheck import capture  # noqa: E402


def timed(make, directory=None, **sel):
    t = time.perf_counter()
    if directory is None:
        make().run()
        return time.perf_counter() - t, []
    with capture.capture(directory, steps="all", layers="all", **sel) as rec:
        make().run()
    return time.perf_counter() - t, list(rec.store.files)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    loops = {"vllm": (engine_loop.Loop, dict(pipeline_steps=10)), "sglang": (engine_loop.SGLangLoop, dict(pipeline_steps=3))}
    engine_loop.modules()
    engine_loop.sglang_modules()
    for name, (make, sel) in loops.items():
        with tempfile.TemporaryDirectory() as d:
            timed(make)
            timed(make, os.path.join(d, "warm"), **sel)
            off, on, files = [], [], []
            for i in range(reps):
                off.append(timed(make)[0])
                t, files = timed(make, os.path.join(d, str(i)), **sel)
                on.append(t)
            print(f"{name}: {reps} runs each, alternating; off min {min(off):.2f} s median {statistics.median(off):.2f} s; "
                  f"on min {min(on):.2f} s median {statistics.median(on):.2f} s")
            total = sum(os.path.getsize(f) for f in files)
            print(f"{name}: one healthy run writes {len(files)} files, {total} bytes:")
            for f in sorted(files):
                print(f"  {os.path.getsize(f):>9}  {os.path.basename(f)}")


if __name__ == "__main__":
    main()
