"""`pip install .` / `pip wheel .` for the detlogp Python package (docs/install.md).

setuptools copies the pure-Python sources (python/detlogp/*.py); the extension `_detlogp` is
built by CMake (python/CMakeLists.txt) for the interpreter running this file, with only what
the package needs: the core library and the bindings, no tests, tools, benchmarks, MPI or
CUDA. The shared libraries the extension needs beyond the base system (Highway) are copied
next to it, found through its $ORIGIN run path.

Offline, with Debian's setuptools and wheel:  pip install --no-build-isolation .
Environment:
  DETLOGP_CMAKE_ARGS   extra CMake arguments, split on spaces (e.g. "-DDETLOGP_WITH_CUDA=ON")
  DETLOGP_BUILD_JOBS   parallel build jobs (default: the number of CPUs)
  CMAKE                the cmake executable (default: cmake on PATH)
"""

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def require_bdist_wheel():
    """pip builds a wheel through setuptools' bdist_wheel command, which setuptools before 70.1
    takes from the `wheel` package. With --no-build-isolation pip uses the interpreter's own
    setuptools and wheel; a pyenv or venv interpreter often has no wheel, and setuptools would
    then stop with "invalid command 'bdist_wheel'". Say what is missing and how to get it,
    before anything is built."""
    # dist_info (pip's metadata step) runs bdist_wheel's code too.
    if not {"bdist_wheel", "dist_info", "editable_wheel"} & set(sys.argv[1:]):
        return
    if importlib.util.find_spec("wheel") is not None:
        return
    if importlib.util.find_spec("setuptools.command.bdist_wheel") is not None:
        return
    import setuptools

    sys.exit(
        f"setup.py: this Python ({sys.executable}) has setuptools {setuptools.__version__} but "
        "no 'wheel' package, which pip needs here to build the detlogp wheel (pip install "
        "--no-build-isolation uses the interpreter's own setuptools and wheel). Either run pip "
        "without --no-build-isolation (pip then fetches setuptools and wheel from PyPI into a "
        f"build environment of its own), or install wheel first: {sys.executable} -m pip "
        "install wheel (Debian's /usr/bin/python3: apt-get install python3-wheel).")


require_bdist_wheel()


def project_version():
    """The version in the top-level CMakeLists.txt's project() call: one source of truth."""
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        match = re.search(r"project\(detlogp\s+VERSION\s+([0-9.]+)", f.read())
    if not match:
        raise RuntimeError("setup.py: no 'project(detlogp VERSION x.y.z' in CMakeLists.txt")
    return match.group(1)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds the `_detlogp` target, then copies the extension and its bundled
    shared libraries from the CMake build tree's package directory into the wheel's."""

    def build_extension(self, ext):
        cmake = os.environ.get("CMAKE", "cmake")
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build_dir, exist_ok=True)
        args = [
            f"-DDETLOGP_PYTHON_EXECUTABLE={sys.executable}",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DDETLOGP_BUILD_PYTHON=ON",
            "-DDETLOGP_BUILD_TESTS=OFF",
            "-DDETLOGP_BUILD_TOOLS=OFF",
            "-DDETLOGP_BUILD_BENCH=OFF",
            "-DDETLOGP_WITH_MPI=OFF",
            "-DDETLOGP_WITH_CUDA=OFF",
        ]
        args += os.environ.get("DETLOGP_CMAKE_ARGS", "").split()
        jobs = os.environ.get("DETLOGP_BUILD_JOBS", str(os.cpu_count() or 1))
        try:
            subprocess.run([cmake, "-S", ROOT, "-B", build_dir, *args], check=True)
            subprocess.run([cmake, "--build", build_dir, "--target", "_detlogp", "-j", jobs],
                           check=True)
        except FileNotFoundError as error:
            raise RuntimeError(f"setup.py: cannot run '{cmake}' ({error}): install cmake "
                               "(Debian: apt-get install cmake) or set CMAKE") from error

        package_dir = os.path.join(build_dir, "python", "detlogp")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(package_dir, "_detlogp" + suffix)
        if not os.path.exists(built):
            raise RuntimeError(f"setup.py: CMake built no {built}: was it configured for "
                               f"another Python than {sys.executable}?")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(built, target)
        # Bundled shared libraries (libhwy.so.1, ...): lib*.so* next to the extension.
        for lib in glob.glob(os.path.join(package_dir, "lib*.so*")):
            shutil.copy2(lib, os.path.dirname(target))


setup(
    version=project_version(),
    package_dir={"": "python"},
    packages=["detlogp"],
    ext_modules=[CMakeExtension("detlogp._detlogp")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
    # Not build/: that is the CMake build tree of `make` (the extension's CMake tree lies in
    # build-pip/temp.*/cmake).
    options={"build": {"build_base": "build-pip"}},
)
