"""Helpers of the command line tests: run build/bin/detlogp, write and read tensor files, and a
float64 reference of the logprob operator."""

import json
import os
import shlex
import struct
import subprocess

import numpy as np

BIN = os.environ.get("DETLOGP_CLI_BIN", "build/bin/detlogp")
MPIEXEC = shlex.split(os.environ.get("DETLOGP_MPIEXEC", ""))


def run_cli(*args, cwd=None, timeout=120, launcher=()):
    """Runs detlogp with `args` (str() of each); returns the CompletedProcess (text)."""
    cmd = list(launcher) + [BIN] + [str(a) for a in args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_json(*args, **kw):
    p = run_cli(*args, "--json", **kw)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


# ---- bfloat16 as uint16 bits (numpy has no bfloat16) ---------------------------------------

def to_bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even (NaN stays NaN)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = rounded.astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    bits[nan] = 0x7FC0
    return bits


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---- .safetensors (written here, independently of detlogp's writer) ------------------------

_ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
              np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
              np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8",
              np.dtype(np.float64): "F64"}


def write_safetensors(path, tensors, metadata=None, bf16=()):
    """tensors: name -> numpy array. Names in `bf16` hold uint16 bits stored as BF16."""
    header = {}
    data = b""
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        dtype = "BF16" if name in bf16 else _ST_DTYPES[a.dtype]
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_safetensors(path):
    """name -> (dtype string, numpy array; BF16 as uint16 bits), plus the metadata."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    np_dtypes = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
                 "I32": np.int32, "BOOL": np.bool_, "U8": np.uint8}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], np.frombuffer(data[b:end], dtype=np_dtypes[e["dtype"]])
                     .reshape(e["shape"]))
    return out, header.get("__metadata__", {})


def raw_tensor_bytes(path, name):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    b, e = header[name]["data_offsets"]
    return raw[8 + n + b:8 + n + e]


# ---- inputs and the float64 reference ------------------------------------------------------

def make_inputs(rows, padded, real, stream=0, big=True):
    """fp32 logits [rows, padded] (a broad background and a few large logits per row; padding
    holds +-3e4), int64 targets in [0, real) and a mask with the first row inactive."""
    rng = np.random.default_rng(stream)
    x = rng.normal(0.0, 2.0, size=(rows, padded)).astype(np.float32)
    if big:
        for r in range(rows):
            cols = rng.integers(0, real, size=3)
            x[r, cols] = rng.uniform(8, 20, size=3)
    x[:, real:] = np.where(np.arange(padded - real) % 2 == 0, 3e4, -3e4)
    targets = rng.integers(0, real, size=rows).astype(np.int64)
    mask = np.ones(rows, dtype=bool)
    mask[0] = False
    targets[0] = -100
    return x, targets, mask


def reference(x, targets, mask, real, temperature=1.0, gl=None, gL=None, gH=None, softcap=None):
    """float64 logp, lse, entropy and the gradient over the real columns (``softcap``: the
    logits capped exactly, softcap * tanh(x / softcap), before the temperature)."""
    z = x[:, :real].astype(np.float64)
    slope = 1.0
    if softcap is not None:
        th = np.tanh(z / softcap)
        z, slope = softcap * th, 1.0 - th * th
    z = z / temperature
    m = z.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    p = np.exp(z - lse[:, None])
    h = -(p * (z - lse[:, None])).sum(axis=1)
    rows = np.arange(len(targets))
    safe_t = np.where(mask, targets, 0)
    logp = np.where(mask, z[rows, safe_t] - lse, 0.0)
    grad = np.zeros_like(z)
    if gl is not None:
        g = np.where(mask, gl, 0.0)
        onehot = np.zeros_like(z)
        onehot[rows[mask], targets[mask]] = 1.0
        grad += g[:, None] * (onehot - p)
    if gL is not None:
        grad += gL[:, None] * p
    if gH is not None:
        grad += -gH[:, None] * p * (z - lse[:, None] + h[:, None])
    return logp, lse, h, grad / temperature * slope
