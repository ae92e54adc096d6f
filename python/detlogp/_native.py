"""Loads the compiled extension ``detlogp._detlogp``, with a clear error when it cannot.

An extension is built for one CPython version: its file name carries the tag
(``_detlogp.cpython-311-x86_64-linux-gnu.so``) and another interpreter does not even see it,
which Python reports as a confusing "partially initialized module ... circular import". This
module names the version the extension was built for, the running one, and the fix.
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


_detlogp = load()
