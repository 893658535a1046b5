"""``python -m kimi``: the same command line as the ``kimi`` console script."""

import sys

from kimi.cli import main

sys.exit(main())
