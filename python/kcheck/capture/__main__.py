"""python -m kcheck.capture install-pth [SITE_DIR] | ops

install-pth writes kcheck_capture.pth into SITE_DIR (default: this
interpreter's site-packages), so that any Python program started with
KCHECK_CAPTURE set captures; the line imports nothing when it is unset.
ops lists the calls the hook knows, with their targets and engines.
"""

import os
import site
import sys

PTH_NAME = "kcheck_capture.pth"
PTH_LINE = "import os; os.environ.get('KCHECK_CAPTURE') and __import__('kcheck.capture.autoload')\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["install-pth"]:
        target = argv[1] if len(argv) > 1 else site.getsitepackages()[0]
        path = os.path.join(target, PTH_NAME)
        with open(path, "w") as f:
            f.write(PTH_LINE)
        print(path)
        return 0
    if argv[:1] == ["ops"]:
        from kcheck.capture.ops import OPS

        for op in OPS.values():
            print(f"{op.name}\t{op.engine}\t{op.kernel}\t{op.target}")
        return 0
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
