"""``python -m mxq``: see mxq/cli.py."""

import sys

from .cli import main

sys.exit(main())
