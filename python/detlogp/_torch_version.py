"""The oldest torch ``detlogp.torch`` supports, and the check ``import detlogp.torch`` makes.

2.5: ``torch.library.custom_op`` and ``register_fake`` (torch.compile through the custom ops)
arrived in 2.4, and DTensor became public API (``torch.distributed.tensor``) in 2.5. The tests
run one pinned torch (python/requirements/test.txt); older ones are refused at import with the
fix, rather than failing later on a missing attribute. ``import detlogp`` itself needs no torch.
"""

import re

MIN_TORCH = (2, 5)


def parse(version):
    """(major, minor) of a torch version string ("2.15.0+cu130", "2.6.0a0+git1234"), or None."""
    match = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(match.group(1)), int(match.group(2))) if match else None


def check(torch):
    """Raises ImportError when ``torch`` is older than MIN_TORCH."""
    found = parse(getattr(torch, "__version__", ""))
    if found is not None and found < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"detlogp.torch needs torch >= {need}, found torch {torch.__version__} in "
            f"{getattr(torch, '__file__', '?')}: install a newer one from PyPI "
            f"(python -m pip install 'torch>={need}'; docs/install.md)")
