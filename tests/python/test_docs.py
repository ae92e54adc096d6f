"""docs/python.md runs: every ```python block after `<!-- test: exec -->` is exec'd here,
every block after `<!-- test: script -->` runs as a script in a fresh /usr/bin/python3 (under
a timeout)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

DOC = REPO / "docs" / "python.md"
BLOCK = re.compile(r"<!-- test: (exec|script) -->\s*```python\n(.*?)```", re.S)


def blocks(kind):
    return [code for k, code in BLOCK.findall(DOC.read_text()) if k == kind]


def test_doc_has_tested_examples():
    assert len(blocks("exec")) >= 1 and len(blocks("script")) >= 1


@pytest.mark.parametrize("index", range(len(blocks("exec"))))
def test_exec_blocks(index):
    code = blocks("exec")[index]
    assert "backward()" in code
    exec(compile(code, f"{DOC}:exec-block-{index}", "exec"), {"__name__": "docs_example"})


@pytest.mark.parametrize("index", range(len(blocks("script"))))
def test_script_blocks(tmp_path, index):
    code = blocks("script")[index]
    if "torch.distributed.tensor" in code:
        pytest.importorskip("torch.distributed.tensor", reason="DTensor needs torch >= 2.4")
    script = tmp_path / f"example_{index}.py"
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        p for p in sys.path if p))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TP=2 equals TP=1 bitwise" in proc.stdout
