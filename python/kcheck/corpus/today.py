"""python -m kcheck.corpus.today --kcheck BIN DIR: what this kcheck says of a
written corpus, beside the verdict its manifest expects.

Each capture is checked as a user would, `BIN check --from ENGINE --json
FILE`; DIR/today.json records every file's expected and actual verdict and
the failing outputs, and the lines that differ are printed. The exit status
is 1 when any differs (TRITON_MLA's bf16 lse, for one, waits on mla_decode's
narrow-lse rule), so the file is a to-do list, not a test.
"""

import argparse
import json
import os
import subprocess
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kcheck.corpus.today")
    ap.add_argument("--kcheck", required=True)
    ap.add_argument("dir")
    a = ap.parse_args(argv)
    with open(os.path.join(a.dir, "manifest.json")) as f:
        files = json.load(f)["files"]
    rows, differ = [], 0
    for e in files:
        p = subprocess.run([a.kcheck, "check", "--from", e["from"], "--json", os.path.join(a.dir, e["file"])],
                           capture_output=True, text=True)
        try:
            r = json.loads(p.stdout)
        except json.JSONDecodeError:
            r = {"verdict": "error", "error": (p.stderr or p.stdout).strip()}
        failing = [c["tensor"] for c in r.get("checks") or [] if c.get("verdict") != "pass"]
        row = {"file": e["file"], "expect": e["expect"]["verdict"], "today": r.get("verdict"),
               "failing": failing, "error": r.get("error")}
        rows.append(row)
        if row["expect"] != row["today"]:
            differ += 1
            print(f"{e['file']}: expected {row['expect']}, today {row['today']} {row['error'] or ' '.join(failing)}")
    with open(os.path.join(a.dir, "today.json"), "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    print(f"{len(rows) - differ} of {len(rows)} as the manifest expects", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
