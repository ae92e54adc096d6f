"""Loads the compiled extension ``detlogp._detlogp``, with a clear error when it cannot.

An extension is built for one CPython version: its file name carries the tag
(``_detlogp.cpython-311-x86_64-linux-gnu.so``) and another interpreter does not even see it,
which Python reports as a confusing "partially initialized module ... circular import". This
module names the version the extension was built for, the running one, and the fix.

It also refuses a NumPy the extension cannot read: pybind11 before 2.12 (Debian 12 ships 2.10)
lays out NumPy's array descriptors as NumPy 1 does, and under NumPy 2 the arrays it returns
read every element as the first one, without any error.
"""

import glob
import importlib
import os
import re
import sys

_FIX = "reinstall with pip install . under this interpreter (docs/install.md)"


def _built_for(package_dir):
    """CPython versions ("3.11") of the extension files found in package_dir."""
    versions = set()
    for path in glob.glob(os.path.join(package_dir, "_detlogp*")):
        match = re.search(r"\.cpython-(\d)(\d+)", os.path.basename(path))
        if match:
            versions.add(f"{match.group(1)}.{match.group(2)}")
    return sorted(versions)


def load():
    """Imports and returns detlogp._detlogp, or raises an ImportError that says why not."""
    try:
        return importlib.import_module("detlogp._detlogp")
    except ImportError as error:
        package_dir = os.path.dirname(os.path.abspath(__file__))
        running = f"{sys.version_info[0]}.{sys.version_info[1]}"
        built = _built_for(package_dir)
        if built and running not in built:
            raise ImportError(
                f"detlogp: the extension _detlogp in {package_dir} was built for CPython "
                f"{', '.join(built)}, running {running} ({sys.executable}): {_FIX}") from error
        if not built and not glob.glob(os.path.join(package_dir, "_detlogp*")):
            raise ImportError(
                f"detlogp: the compiled extension _detlogp is missing from {package_dir} (a "
                f"source checkout on sys.path?): build it (make, or pip install .) and import "
                f"the built package") from error
        raise ImportError(f"detlogp: cannot load the extension _detlogp from {package_dir}: "
                          f"{error}; {_FIX}") from error


def check_numpy(extension):
    """Raises ImportError when the running NumPy is one the extension's pybind11 cannot read."""
    import numpy

    built = tuple(getattr(extension, "pybind11_version", (0, 0)))
    major = int(re.match(r"\d+", numpy.__version__).group(0))
    if major >= 2 and built < (2, 12):
        raise ImportError(
            f"detlogp: this build uses pybind11 {built[0]}.{built[1]}, which cannot read NumPy 2 "
            f"arrays (numpy {numpy.__version__} from {os.path.dirname(numpy.__file__)}): every "
            f"result would be wrong. Install NumPy 1 into this interpreter ({sys.executable} -m "
            f"pip install 'numpy<2'), or rebuild detlogp with pybind11 >= 2.12 (docs/install.md)")


_detlogp = load()
check_numpy(_detlogp)
