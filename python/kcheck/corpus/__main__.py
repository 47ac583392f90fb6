"""python -m kcheck.corpus --out DIR [--committed] [--only GROUP,...]"""

import argparse
import importlib
import sys

from kcheck.corpus.base import Corpus

# The groups written so far (issue 16 item 3: merges and split-K decode;
# cache: SGLang's pool write; item 5, indexer: vLLM's DSA indexer decode); the
# other items (ds_mla, FlashMLA, Blackwell MLA, NVFP4) have no generator yet.
GROUPS = ["merge", "decode", "cache", "indexer"]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kcheck.corpus")
    ap.add_argument("--out", required=True)
    ap.add_argument("--committed", action="store_true", help="only the subset kept in fixtures/engines/")
    ap.add_argument("--only", default=",".join(GROUPS))
    a = ap.parse_args(argv)
    c = Corpus(a.out, committed_only=a.committed)
    for g in a.only.split(","):
        if g not in GROUPS:
            print(f"unknown group {g!r} (known: {', '.join(GROUPS)})", file=sys.stderr)
            return 2
        importlib.import_module(f"kcheck.corpus.{g}").build(c)
        print(f"{g}: {len(c.entries)} files so far", file=sys.stderr)
    c.write_manifest()
    return 0


if __name__ == "__main__":
    sys.exit(main())
