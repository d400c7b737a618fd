"""Test session settings: W&B off unless a test turns it on.

Every entry point mirrors the records it writes to W&B (moe_core.records.tracking), offline by
default; most tests write records, and a run directory each would only cost seconds and files.
Set before any test, so the processes the tests start inherit it; tests/test_tracking.py sets
``WANDB_MODE=offline`` itself, and a ``WANDB_MODE`` set outside the tests is kept.
"""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
