"""The torch detlogp.torch supports: an older one is refused at import with both versions and
the fix; the core package imports without any torch at all."""

import os
import subprocess
import sys

import pytest

from detlogp import _torch_version


def run(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


IMPORT_WITH_VERSION = """
import torch
torch.__version__ = {version!r}
try:
    import detlogp.torch
except ImportError as e:
    print("refused:", e)
else:
    print("imported")
"""


@pytest.mark.parametrize("version", ["2.4.1", "1.13.1+cpu", "2.0.0"])
def test_older_torch_is_refused_naming_both_versions(version):
    out = run(IMPORT_WITH_VERSION.format(version=version))
    assert out.startswith("refused:"), out
    need = ".".join(map(str, _torch_version.MIN_TORCH))
    assert f"found torch {version}" in out and f"torch >= {need}" in out, out
    assert "pip install" in out, out


@pytest.mark.parametrize("version", ["2.5.0", "2.15.0+cu130", "3.0.0a0+git1234"])
def test_supported_torch_imports(version):
    assert run(IMPORT_WITH_VERSION.format(version=version)) == "imported"


def test_the_running_torch_is_supported():
    torch = pytest.importorskip("torch")
    assert _torch_version.parse(torch.__version__) >= _torch_version.MIN_TORCH


def test_core_package_imports_without_torch():
    # torch made unimportable: `import torch` raises ImportError, as where it is not installed.
    out = run("import sys; sys.modules['torch'] = None\n"
              "import detlogp, numpy as np\n"
              "c = detlogp.LogprobContract(role='train', dtype='fp32', "
              "mask=detlogp.MaskSpec.all_active(2), sharding=detlogp.ShardingSpec(tp_rank=0, "
              "tp_world_size=1, vocab_shard_bounds=[(0, 8)], real_vocab_size=8, "
              "padded_vocab_size=8))\n"
              "op, _ = detlogp.get_logprob_op(c)\n"
              "logits = np.arange(16, dtype=np.float32).reshape(2, 8) / 4\n"
              "logp, lse = op(logits, np.array([1, 7], dtype=np.int32), contract=c)\n"
              "print('torch' in sys.modules and sys.modules['torch'] is not None, "
              "np.asarray(logp).shape)")
    assert out == "False (2,)", out
