"""The real Megatron and verl, the oracles of test_peers.py: where they are installed, which
versions, and how their modules are loaded.

They are pinned in python/requirements/peers.txt and installed apart from the test venv's
site-packages, without their dependencies (``pip install --no-deps --ignore-requires-python
--target <venv>/peers -r python/requirements/peers.txt``, docs/python.md), because:

- verl 0.9.1 depends on ray, transformers, datasets, wandb, ... (none of which the functions
  under test use), and megatron-core 0.19.2 declares Python >= 3.12 although its cp311 wheel
  runs on Python 3.11 (its dependencies, torch, numpy and packaging, are the venv's own);
- on the venv's sys.path, ``megatron`` would be importable in every test, and detlogp's group
  rule looks at Megatron's parallel state (test_group_inference.py runs without Megatron).

Megatron is imported as a package (its own imports need nothing else). For verl only the two
module files under test are run, exactly as installed: ``verl.utils.torch_functional`` and
``verl.utils.megatron.tensor_parallel`` (with what they import from verl). The ``verl``,
``verl.utils`` and ``verl.utils.megatron`` packages are registered as empty packages whose
``__path__`` is the installed folder, so that their ``__init__`` files (which import ray,
hydra, ...) do not run; ``tensordict.TensorDict`` and ``transformers.PreTrainedTokenizer``,
which ``torch_functional`` imports for other helpers' annotations, are given placeholder modules
when those packages are not installed.
"""

import importlib
import importlib.metadata
import os
import pathlib
import sys
import types

REPO = pathlib.Path(os.environ.get("DETLOGP_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
REQUIREMENTS = REPO / "python" / "requirements" / "peers.txt"
VERL_PACKAGES = ("verl", "verl.utils", "verl.utils.megatron")
PLACEHOLDERS = {"tensordict": ("TensorDict",), "transformers": ("PreTrainedTokenizer",)}


def pins():
    """{distribution name: version} of python/requirements/peers.txt."""
    out = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[name.strip()] = version.strip()
    return out


def peers_dir():
    """Where the peers are installed: $DETLOGP_PEERS_DIR, else <this interpreter's venv>/peers."""
    return pathlib.Path(os.environ.get("DETLOGP_PEERS_DIR") or pathlib.Path(sys.prefix) / "peers")


def installed():
    """{distribution name: version} found in peers_dir()."""
    return {d.metadata["Name"]: d.version
            for d in importlib.metadata.distributions(path=[str(peers_dir())])}


def missing_reason():
    """None when the pinned peers are installed for this interpreter, else why not (the
    reason test_peers.py skips with)."""
    want, have = pins(), installed()
    wrong = [f"{name}=={version}" + (f" (found {have[name]})" if name in have else "")
             for name, version in want.items() if have.get(name) != version]
    if not wrong:
        return None
    return (f"the real peers {', '.join(wrong)} are not installed in {peers_dir()}: "
            f"{sys.executable} -m pip install --no-deps --ignore-requires-python "
            f"--target {peers_dir()} -r {REQUIREMENTS} (docs/python.md)")


def _placeholder(name, attrs):
    module = types.ModuleType(name)
    module.__doc__ = "placeholder: the verl helpers under test do not use it"
    for attr in attrs:
        setattr(module, attr, type(attr, (), {}))
    return module


def load():
    """The real functions: a namespace with ``parallel_state`` and ``tensor_parallel``
    (megatron.core's) and ``torch_functional`` and ``verl_tensor_parallel`` (verl's)."""
    root = peers_dir()
    if str(root) not in sys.path:
        sys.path.append(str(root))  # last: its top-level `tests` and `scripts` shadow nothing
    for name in VERL_PACKAGES:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")))]
            sys.modules[name] = package
    for name, attrs in PLACEHOLDERS.items():
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = _placeholder(name, attrs)
    return types.SimpleNamespace(
        parallel_state=importlib.import_module("megatron.core.parallel_state"),
        tensor_parallel=importlib.import_module("megatron.core.tensor_parallel"),
        torch_functional=importlib.import_module("verl.utils.torch_functional"),
        verl_tensor_parallel=importlib.import_module("verl.utils.megatron.tensor_parallel"))
