"""``python -m structgen.assets {list,pull ALIAS...,path ALIAS}`` (see :mod:`structgen.assets.pull`)."""

import sys

from structgen.assets.pull import main

sys.exit(main())
