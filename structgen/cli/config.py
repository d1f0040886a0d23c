"""``structgen config``: print the documented default YAML configuration, or check a file."""

from __future__ import annotations

import argparse
import sys

from structgen.cli._common import EXIT_OK, _load_settings
from structgen.settings import dump, example

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Print the documented defaults, or check ``args.check`` and print its effective settings."""
    if args.check:
        settings = _load_settings(args.check)
        sys.stdout.write(dump(settings, comments=False))
        return EXIT_OK
    sys.stdout.write(example())
    return EXIT_OK
