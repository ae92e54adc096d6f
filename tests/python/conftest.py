"""Shared helpers of the detlogp Python tests (run by `make test` as the ctest entry
python_pytest, with PYTHONPATH=<build>/python, under the interpreter the package is built for:
for `make test`, the venv of python/requirements/test.txt, made by scripts/python-env.sh)."""

import os
import pathlib
import sys

import numpy as np
import pytest

REPO = pathlib.Path(os.environ.get("DETLOGP_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
HERE = pathlib.Path(__file__).parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

try:
    import detlogp  # noqa: F401
except ImportError:  # a direct `pytest tests/python` from the repo after `make`
    for build in ("build", "build-py"):
        candidate = REPO / build / "python"
        if (candidate / "detlogp").is_dir():
            sys.path.insert(0, str(candidate))
            break

import detlogp  # noqa: E402,F401

# torch.compile's inductor keeps compiled code in one cache per user (/tmp/torchinductor_<user>)
# whose keys do not cover the schema of a custom op: code compiled against another build of
# detlogp (another checkout, an older op signature) would be reused and fail with an argument
# count error. Each build tree (DETLOGP_BUILD_DIR, set by ctest) gets a cache of its own;
# spawned ranks inherit it.
if os.environ.get("DETLOGP_BUILD_DIR"):
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                          os.path.join(os.environ["DETLOGP_BUILD_DIR"], "torchinductor-cache"))


def pytest_configure(config):
    # The kernels' thread count never changes the bits; keep torch from oversubscribing the
    # two shared cores of CI.
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
