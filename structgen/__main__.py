"""``python -m structgen``: the same command line as the ``structgen`` script."""

import sys

from structgen.cli import main

sys.exit(main())
