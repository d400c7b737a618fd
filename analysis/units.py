"""Byte sizes written for people (``64 KiB``, ``16 MiB``), shared by tables and figures."""

KiB = 2**10
MiB = 2**20
GiB = 2**30


def format_bytes(n_bytes: float) -> str:
    """``1048576`` -> ``"1 MiB"``; powers of 1024, with no decimals when exact."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} B"
