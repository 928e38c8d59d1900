"""Sizes as people read them (one formatter for the node texts, Info and the builder's messages)."""


def human_bytes(n: int) -> str:
    n = int(n)
    for unit, div in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"
