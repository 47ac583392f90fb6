import sys

from kcheck.worker import main

sys.exit(main())
