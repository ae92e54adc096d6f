#!/usr/bin/env python3
"""Checks that every #include edge of detlogp's code points down the layer order of
docs/architecture.md ("The layers"): the table below is that table, with no exceptions.

    base <- numerics <- kernels <- kernels/cpu, kernels/cuda (the backends)
    base <- contract, comm;   kernels, numerics, comm, contract <- op <- registry (+ backends)
    base <- drift;   base <- memory <- io;   tools/ use everything, python/src everything but io

Each file of src/, include/, tools/ and python/src/ belongs to one layer (by its path: src/<layer>/
or src/kernels/<backend>/, the public headers by name below); an #include "..." edge from layer
A to layer B is allowed when B is A or one of A's dependencies. A header of src/ or include/
that no rule places, or an include that resolves to no file, is an error too, so new code has to
be placed before it passes.

Usage: check_layering.py <repo root>      exit 1 and one line per bad edge when any is wrong
       check_layering.py --self-test      shows that a reversed edge is caught
"""
import os
import re
import sys
import tempfile

# Layer -> the layers it may include (itself always): docs/architecture.md's "may use" column.
BACKENDS = {"kernels/cpu", "kernels/cuda"}
ALLOWED = {
    "base": set(),
    "contract": {"base"},
    "numerics": {"base"},
    "kernels": {"numerics", "base"},                  # the kernel interfaces, kernels/common
    "kernels/cpu": {"kernels", "numerics", "base"},
    "kernels/cuda": {"kernels", "numerics", "base"},
    "comm": {"base"},
    "op": {"kernels", "numerics", "comm", "contract", "base"},  # never a backend folder
    "registry": {"op", "kernels", "numerics", "comm", "contract", "base"} | BACKENDS,
    "drift": {"base"},
    "memory": {"base"},
    "io": {"memory", "numerics", "base"},
}
LIBRARY = set(ALLOWED)
ALLOWED["api"] = LIBRARY - {"io", "memory"}         # include/detlogp/detlogp.hpp, the umbrella
ALLOWED["python"] = (LIBRARY | {"api"}) - {"io"}    # the Python extension: never the io layer
ALLOWED["tools"] = LIBRARY | {"api"}                # the command line: everything, io included

# Public headers (include/detlogp/<name>) by layer.
PUBLIC = {
    "dtype.hpp": "base", "errors.hpp": "base", "views.hpp": "base",
    "version.hpp": "contract", "enums.hpp": "contract", "contract.hpp": "contract",
    "capability.hpp": "contract",
    "numerics.hpp": "numerics",
    "kernels.hpp": "kernels",
    "comm.hpp": "comm", "mpi_comm.hpp": "comm",
    "operator.hpp": "op", "fused.hpp": "op", "kept_set.hpp": "op", "sampler.hpp": "op",
    "registry.hpp": "registry", "fused_dispatch.hpp": "registry",
    "drift.hpp": "drift",
    "detlogp.hpp": "api",
}
# Where #include "x/y.hpp" is looked up (besides the including file's own folder).
INCLUDE_DIRS = ["include", "src", "src/kernels/cuda/include", "src/registry/cuda/include"]
SCANNED = ["src", "include", "tools", "python/src"]
SOURCE = re.compile(r"\.(hpp|h|cpp|cc|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(rel):
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) == 3 and parts[1] == "detlogp":
        return PUBLIC.get(parts[2])
    if parts[0] == "src" and len(parts) >= 4 and "/".join(parts[1:3]) in BACKENDS:
        return "/".join(parts[1:3])
    if parts[0] == "src" and len(parts) >= 3 and parts[1] in LIBRARY:
        return parts[1]
    if parts[0] == "tools":
        return "tools"
    if parts[:2] == ["python", "src"]:
        return "python"
    return None


def resolve(root, includer, name):
    here = os.path.dirname(includer)
    for base in [here] + INCLUDE_DIRS:
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate.replace(os.sep, "/")
    return None


def check(root):
    errors = []
    edges = 0
    for top in SCANNED:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not SOURCE.search(f):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                strict = rel.startswith(("src/", "include/"))
                layer = layer_of(rel)
                if layer is None:
                    if strict:
                        errors.append(f"{rel}: belongs to no layer (place it in "
                                      "tests/layering/check_layering.py)")
                    continue
                with open(os.path.join(root, rel), encoding="utf-8") as fh:
                    text = fh.read()
                for m in INCLUDE.finditer(text):
                    line = text.count("\n", 0, m.start()) + 1
                    target = resolve(root, rel, m.group(1))
                    if target is None:
                        if strict:
                            errors.append(f'{rel}:{line}: #include "{m.group(1)}" resolves to '
                                          "no file of the repository")
                        continue
                    to = layer_of(target)
                    if to is None:
                        errors.append(f'{rel}:{line}: #include "{m.group(1)}": {target} belongs '
                                      "to no layer")
                        continue
                    edges += 1
                    if to != layer and to not in ALLOWED[layer]:
                        errors.append(f'{rel}:{line}: layer {layer} includes "{m.group(1)}" of '
                                      f"layer {to}; {layer} may include only "
                                      f"{sorted(ALLOWED[layer]) or 'itself'}")
    return edges, errors


def self_test():
    # Trees with one wrong edge each, which must be the one reported: a numerics header that
    # includes the op layer (a reversed edge), and a Python extension file that includes the io
    # layer next to the memory layer it may use.
    cases = [
        ({"src/numerics/a.hpp": '#include "op/b.hpp"\n',
          "src/op/b.hpp": '#include "numerics/a.hpp"\n'}, 2, "src/numerics/a.hpp:1"),
        ({"python/src/a.cpp": '#include "memory/m.hpp"\n#include "io/t.hpp"\n',
          "src/memory/m.hpp": "", "src/io/t.hpp": '#include "memory/m.hpp"\n'},
         3, "python/src/a.cpp:2"),
    ]
    ok = True
    for files, want_edges, want_error in cases:
        with tempfile.TemporaryDirectory() as root:
            for rel, text in files.items():
                os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w", encoding="utf-8") as fh:
                    fh.write(text)
            edges, errors = check(root)
        print("\n".join(errors))
        ok = ok and edges == want_edges and len(errors) == 1 and want_error in errors[0]
    print("self-test:", "each wrong edge was reported" if ok else "FAILED")
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    edges, errors = check(sys.argv[1])
    for e in errors:
        print(e)
    print(f"{edges} include edges checked, {len(errors)} wrong")
    return 1 if errors or edges == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
