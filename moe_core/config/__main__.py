"""``python -m moe_core.config [--config FILE]... [key=value]...``: check a config, print its errors."""

import sys

from moe_core.config.load import main

sys.exit(main())
