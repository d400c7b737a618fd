"""``python -m moe_core.config [--config FILE]... [key=value]... [--print [SECTION]]``: check a config,
print its errors, or print it resolved."""

import sys

from moe_core.config.load import main

sys.exit(main())
