#!/usr/bin/env python3
"""Writes a small starting corpus of valid files for the io fuzz targets (standard library only).

usage: make_corpus.py <out-dir>   ->  <out-dir>/safetensors/*, <out-dir>/npy/*
"""
import json
import os
import struct
import sys

DTYPES = {  # safetensors name: (itemsize, npy descr or None)
    "F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, None), "I64": (8, "<i8"),
    "I32": (4, "<i4"), "BOOL": (1, "|b1"), "U8": (1, "|u1"),
}
SHAPES = [(), (3,), (2, 3), (0,), (2, 0, 1)]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def pattern(nbytes, dtype):
    if dtype == "BOOL":
        return bytes(i % 2 for i in range(nbytes))
    return bytes((i * 37 + 11) % 251 for i in range(nbytes))


def safetensors(tensors, metadata=None, pad=True, compact=True):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        size = numel(shape) * DTYPES[dtype][0]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + size]}
        data += pattern(size, dtype)
    text = json.dumps(header, separators=(",", ":") if compact else None).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def npy(descr, shape, major=1, align=64, py2=False):
    dims = ", ".join(f"{d}L" if py2 else str(d) for d in shape)
    if len(shape) == 1:
        dims += ","
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}"
    preamble = 10 if major == 1 else 12
    text += " " * (-(preamble + len(text) + 1) % align) + "\n"
    length = struct.pack("<H" if major == 1 else "<I", len(text))
    size = {"<f4": 4, "<f2": 2, "<i8": 8, "<i4": 4, "|b1": 1, "|u1": 1}[descr] * numel(shape)
    return (b"\x93NUMPY" + bytes([major, 0]) + length + text.encode() +
            pattern(size, "BOOL" if descr == "|b1" else "U8"))


def main():
    out = sys.argv[1]
    files_by_kind = {"safetensors": [], "npy": []}
    for dtype in DTYPES:
        for shape in SHAPES:
            if numel(shape) <= 6:
                files_by_kind["safetensors"].append(safetensors([("t", dtype, shape)]))
    files_by_kind["safetensors"] += [
        safetensors([("logits", "BF16", (2, 4)), ("targets", "I64", (2,)), ("mask", "BOOL", (2,))],
                    metadata={"producer": "detlogp-fuzz", "format": "pt"}),
        safetensors([("a", "F32", (1,))], pad=False),
        safetensors([("a", "U8", (2,)), ("b", "U8", (0,))], compact=False),
        safetensors([]),
    ]
    for descr in ["<f4", "<f2", "<i8", "<i4", "|b1", "|u1"]:
        for shape in SHAPES:
            files_by_kind["npy"].append(npy(descr, shape))
    files_by_kind["npy"] += [npy("<f4", (2, 3), major=2), npy("<f4", (2, 3), major=3),
                     npy("<i8", (3,), align=16), npy("<f2", (1, 2), py2=True)]
    # The header parser's worst cases (header_fuzz.cpp): mode byte, 16-bit count, body.
    entry = b'{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'
    files_by_kind["safetensors_header"] = [
        b"\x00" + b"\x00\x00" + b'{"t":' + entry + b"}",
        b"\x01" + (1000).to_bytes(2, "little") + entry,
        b"\x01" + (8000).to_bytes(2, "little") + b'{"dtype":"F32","dtype":"F32"}',
        b"\x02" + (8).to_bytes(2, "little") + b"[" + b"1",
        b"\x02" + (5000).to_bytes(2, "little") + b"{" + b"{}",
        b"\x03" + (3000).to_bytes(2, "little") + b'"m"',
    ]
    for kind, files in files_by_kind.items():
        os.makedirs(os.path.join(out, kind), exist_ok=True)
        for i, content in enumerate(files):
            with open(os.path.join(out, kind, f"valid_{i:03d}"), "wb") as f:
                f.write(content)


if __name__ == "__main__":
    main()
