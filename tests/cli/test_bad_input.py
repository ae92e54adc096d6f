"""Bad input and bad usage: exit 2, a one-line message on stderr naming the file and the
problem, and no output file (nor temporary file) left behind."""

import os
import struct

import numpy as np
import pytest

from cli_helpers import run_cli, write_safetensors

ROWS, VOCAB = 4, 256


@pytest.fixture()
def d(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(0, 2, size=(ROWS, VOCAB)).astype(np.float32)
    t = rng.integers(0, VOCAB, ROWS).astype(np.int64)
    np.save(tmp_path / "logits.npy", x)
    np.save(tmp_path / "targets.npy", t)
    np.save(tmp_path / "mask.npy", np.array([True, False, True, True]))
    np.save(tmp_path / "grad.npy", np.ones(ROWS, np.float32))
    write_safetensors(tmp_path / "logits.safetensors", {"logits": x})
    np.save(tmp_path / "logp.npy", rng.uniform(-5, 0, ROWS).astype(np.float32))
    return tmp_path


def logprob_args(**override):
    args = {"--logits": "logits.npy", "--targets": "targets.npy", "--out": "out.safetensors"}
    args.update(override)
    out = ["logprob"]
    for k, v in args.items():
        if v is None:
            continue
        out += [k] if v is True else [k, v]
    return out


def expect_bad(d, args, *needles):
    before = set(os.listdir(d))
    p = run_cli(*args, cwd=d)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    err = p.stderr.strip()
    assert err and "\n" not in err, repr(p.stderr)
    for n in needles:
        assert n in err, (n, err)
    assert set(os.listdir(d)) == before, "an output or temporary file was left behind"
    assert p.stdout == ""
    return err


def test_missing_file(d):
    expect_bad(d, logprob_args(**{"--logits": "nope.npy"}), "nope.npy")
    expect_bad(d, logprob_args(**{"--targets": "nope.safetensors"}), "nope.safetensors")
    expect_bad(d, logprob_args(**{"--mask": "missing_mask.npy"}), "missing_mask.npy")
    expect_bad(d, ["drift", "--candidate", "nope.npy", "--reference", "logp.npy"], "nope.npy")


def test_truncated_files(d):
    raw = (d / "logits.npy").read_bytes()
    (d / "trunc.npy").write_bytes(raw[:-100])
    expect_bad(d, logprob_args(**{"--logits": "trunc.npy"}), "trunc.npy", "truncated")
    raw = (d / "logits.safetensors").read_bytes()
    (d / "trunc.safetensors").write_bytes(raw[:-64])
    expect_bad(d, logprob_args(**{"--logits": "trunc.safetensors"}), "trunc.safetensors")
    (d / "empty.safetensors").write_bytes(b"")
    expect_bad(d, logprob_args(**{"--logits": "empty.safetensors"}), "empty.safetensors")


def test_bad_headers(d):
    (d / "garbage.safetensors").write_bytes(struct.pack("<Q", 16) + b"{not json!!!!!!}")
    expect_bad(d, logprob_args(**{"--logits": "garbage.safetensors"}), "garbage.safetensors")
    (d / "magic.npy").write_bytes(b"\x93NUMPX\x01\x00" + b"\x00" * 64)
    expect_bad(d, logprob_args(**{"--logits": "magic.npy"}), "magic.npy")
    (d / "ext.pt").write_bytes(b"x")
    expect_bad(d, logprob_args(**{"--logits": "ext.pt"}), "ext.pt")


def test_declared_sizes_larger_than_file(d):
    # Header length far beyond the file.
    (d / "hlen.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    expect_bad(d, logprob_args(**{"--logits": "hlen.safetensors"}), "hlen.safetensors")
    # data_offsets beyond the data buffer.
    header = b'{"logits":{"dtype":"F32","shape":[4,256],"data_offsets":[0,4096]}}'
    (d / "offs.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 64)
    expect_bad(d, logprob_args(**{"--logits": "offs.safetensors"}), "offs.safetensors")
    # npy shape claiming more data than the file holds.
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (4000, 256), }"
    hdr += " " * (118 - len(hdr)) + "\n"
    (d / "big.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) +
                                hdr.encode() + b"\0" * 64)
    expect_bad(d, logprob_args(**{"--logits": "big.npy"}), "big.npy")


def test_wrong_dtype(d):
    np.save(d / "int_logits.npy", np.zeros((ROWS, VOCAB), np.int64))
    expect_bad(d, logprob_args(**{"--logits": "int_logits.npy"}), "int_logits.npy")
    np.save(d / "f64_logits.npy", np.zeros((ROWS, VOCAB), np.float64))
    expect_bad(d, logprob_args(**{"--logits": "f64_logits.npy"}), "f64_logits.npy")
    np.save(d / "float_targets.npy", np.zeros(ROWS, np.float32))
    expect_bad(d, logprob_args(**{"--targets": "float_targets.npy"}), "float_targets.npy")
    np.save(d / "float_mask.npy", np.ones(ROWS, np.float32))
    expect_bad(d, logprob_args(**{"--mask": "float_mask.npy"}), "float_mask.npy")
    np.save(d / "u8_mask.npy", np.array([0, 1, 2, 1], np.uint8))  # only 0/1 allowed
    expect_bad(d, logprob_args(**{"--mask": "u8_mask.npy"}), "u8_mask.npy")
    np.save(d / "i64_grad.npy", np.ones(ROWS, np.int64))
    expect_bad(d, logprob_args(**{"--grad-logp": "i64_grad.npy"}), "i64_grad.npy")
    np.save(d / "f64_logp.npy", np.zeros(ROWS, np.float64))
    expect_bad(d, ["drift", "--candidate", "f64_logp.npy", "--reference", "logp.npy"],
               "f64_logp.npy")


def test_wrong_shape(d):
    np.save(d / "flat.npy", np.zeros(VOCAB, np.float32))
    expect_bad(d, logprob_args(**{"--logits": "flat.npy"}), "flat.npy")
    np.save(d / "short_targets.npy", np.zeros(ROWS - 1, np.int64))
    expect_bad(d, logprob_args(**{"--targets": "short_targets.npy"}), "short_targets.npy")
    np.save(d / "long_mask.npy", np.ones(ROWS + 1, bool))
    expect_bad(d, logprob_args(**{"--mask": "long_mask.npy"}), "long_mask.npy")
    np.save(d / "grad2d.npy", np.ones((ROWS, 1), np.float32))
    expect_bad(d, logprob_args(**{"--grad-lse": "grad2d.npy"}), "grad2d.npy")
    np.save(d / "short_logp.npy", np.zeros(ROWS - 1, np.float32))
    expect_bad(d, ["drift", "--candidate", "logp.npy", "--reference", "short_logp.npy"],
               "short_logp.npy")
    np.save(d / "logp2d.npy", np.zeros((2, 2), np.float32))
    expect_bad(d, ["drift", "--candidate", "logp2d.npy", "--reference", "logp.npy"],
               "logp2d.npy")
    write_safetensors(d / "two.safetensors", {"a": np.zeros(ROWS, np.float32),
                                              "b": np.zeros(ROWS, np.float32)})
    expect_bad(d, ["drift", "--candidate", "two.safetensors", "--reference", "logp.npy"],
               "two.safetensors", "'a', 'b'")


def test_out_of_range_targets(d):
    for bad in (VOCAB, -1, 10**12):
        t = np.array([3, 4, bad, 5], np.int64)
        np.save(d / "bad_targets.npy", t)
        expect_bad(d, logprob_args(**{"--targets": "bad_targets.npy"}), "bad_targets.npy",
                   "token 2")
    # Beyond --real-vocab (a padding column) is out of range too.
    np.save(d / "pad_targets.npy", np.array([3, 4, 250, 5], np.int64))
    expect_bad(d, logprob_args(**{"--targets": "pad_targets.npy", "--real-vocab": "200"}),
               "pad_targets.npy")
    # On an inactive token anything goes.
    np.save(d / "inactive_targets.npy", np.array([3, 10**12, 4, 5], np.int64))
    p = run_cli(*logprob_args(**{"--targets": "inactive_targets.npy", "--mask": "mask.npy"}),
                cwd=d)
    assert p.returncode == 0, p.stderr


def test_nan_on_active_row(d):
    x = np.load(d / "logits.npy")
    x[2, 17] = np.nan
    np.save(d / "nan_logits.npy", x)
    err = expect_bad(d, logprob_args(**{"--logits": "nan_logits.npy", "--tp": "2",
                                        "--tile-width": "32"}), "nan_logits.npy", "token 2")
    assert "non-finite" in err
    # The same NaN on an inactive row, or in a padding column, is fine.
    x = np.load(d / "logits.npy")
    x[1, 17] = np.nan
    x[:, 250] = np.nan
    np.save(d / "nan_ok.npy", x)
    p = run_cli(*logprob_args(**{"--logits": "nan_ok.npy", "--mask": "mask.npy",
                                 "--real-vocab": "250"}), cwd=d)
    assert p.returncode == 0, p.stderr


def test_bad_outputs(d):
    expect_bad(d, logprob_args(**{"--out": "out.npy"}), "out.npy")
    expect_bad(d, logprob_args(**{"--out": "no_such_dir/out.safetensors"}), "no_such_dir")
    # A provenance path that cannot be written: neither output appears.
    expect_bad(d, logprob_args(**{"--provenance": "no_dir/p.json"}), "no_dir")


def test_bad_usage(d):
    expect_bad(d, logprob_args(**{"--tp": "0"}), "--tp")
    expect_bad(d, logprob_args(**{"--real-vocab": "300"}), "--real-vocab", "logits.npy")
    expect_bad(d, logprob_args(**{"--num-vocab-tiles": "3"}), "--num-vocab-tiles")
    expect_bad(d, logprob_args(**{"--tile-width": "64", "--num-vocab-tiles": "4"}))
    expect_bad(d, logprob_args(**{"--grad-entropy": "grad.npy"}), "--entropy")
    expect_bad(d, logprob_args(**{"--temperature": "0"}), "--temperature")
    expect_bad(d, logprob_args(**{"--softcap": "-1"}), "--softcap")
    expect_bad(d, logprob_args(**{"--backend": "no-such-backend"}))
    expect_bad(d, logprob_args(**{"--tp": "16"}))  # more ranks than 256 / 128 tiles
    expect_bad(d, logprob_args(**{"--out": None}), "--out")
    expect_bad(d, ["run", "--tokens", "0"], "--tokens")
    expect_bad(d, ["run", "--dtype", "fp8"], "fp8")
    expect_bad(d, ["run", "--tp", "1,x"], "--tp")
    expect_bad(d, ["run", "--cp", "2", "--comm", "in-process"], "--cp")
    expect_bad(d, ["drift", "--candidate", "logp.npy", "--reference", "logp.npy", "--dtype",
                   "int8"], "int8")
    expect_bad(d, ["bench", "--repeats", "0"], "--repeats")
    expect_bad(d, ["no-such-command"])
    expect_bad(d, ["run", "--no-such-option"])


def test_unknown_options_are_named_with_a_hint(d):
    # A typo is reported as what it is, not as the required option it failed to set.
    err = expect_bad(d, ["logprob", "--logit", "logits.npy", "--targets", "targets.npy", "--out",
                         "out.safetensors"], "unknown option --logit", "did you mean --logits?")
    assert "required" not in err
    expect_bad(d, ["run", "--token", "8"], "unknown option --token", "did you mean --tokens?")
    expect_bad(d, ["run", "--tokens", "8", "--fussed"], "unknown option --fussed",
               "did you mean --fused?")
    expect_bad(d, ["drift", "--candidate=logp.npy", "--referense=logp.npy"],
               "unknown option --referense", "did you mean --reference?")
    # A prefix of several options names them all.
    expect_bad(d, logprob_args(**{"--grad": "grad.npy"}), "unknown option --grad",
               "--grad-logp", "--grad-lse", "--grad-entropy")
    expect_bad(d, ["--verison"], "unknown option --verison", "did you mean --version?")
    err = expect_bad(d, ["run", "--zzzz-nothing-like-it"], "unknown option --zzzz-nothing-like-it")
    assert "did you mean" not in err
    # Two typos: both named.
    expect_bad(d, ["run", "--token", "8", "--temprature", "2"], "--token", "--temprature")


def test_outputs_never_overwrite_each_other_or_an_input(d):
    # --provenance on the same path as --out would replace the tensors with the JSON.
    expect_bad(d, logprob_args(**{"--provenance": "out.safetensors"}), "--provenance",
               "same file as --out")
    expect_bad(d, logprob_args(**{"--provenance": "./sub/../out.safetensors"}), "same file")
    # An output that is one of the inputs.
    expect_bad(d, logprob_args(**{"--out": "logits.safetensors",
                                  "--logits": "logits.safetensors"}),
               "logits.safetensors", "both an input and an output")
    expect_bad(d, logprob_args(**{"--provenance": "targets.npy"}), "targets.npy",
               "both an input and an output")


def test_bad_row_temperatures(d):
    def rt(name, values, dtype=np.float32):
        np.save(d / name, np.asarray(values, dtype=dtype))
        return name

    # Each bad value: exit 2, the file, the row and the value named, nothing written; at TP 1
    # and at TP 2 (every rank refuses it, before anything is computed).
    for tp in ("1", "2"):
        for i, bad in enumerate((0.0, -1.0, np.inf, np.nan)):
            f = rt(f"rt_bad{i}.npy", [1.0, 0.5, bad, 2.0])
            expect_bad(d, logprob_args(**{"--row-temperature": f, "--tp": tp}), f,
                       "temperature of row 2 is", "finite number > 0")
    expect_bad(d, logprob_args(**{"--row-temperature": rt("rt_short.npy", [1.0, 2.0])}),
               "rt_short.npy", "shape [2]", "expected [4]")
    expect_bad(d, logprob_args(**{"--row-temperature": rt("rt_i64.npy", [1] * ROWS,
                                                           np.int64)}), "rt_i64.npy", "F32")
    # With a scalar --temperature other than 1: a usage error naming both options.
    expect_bad(d, logprob_args(**{"--row-temperature": rt("rt_ok.npy", [1.0] * ROWS),
                                  "--temperature": "0.7"}), "--row-temperature", "--temperature")
    expect_bad(d, logprob_args(**{"--row-temperature": "missing_rt.npy"}), "missing_rt.npy")


def test_bad_kept_ids(d):
    t = np.load(d / "targets.npy")
    ids = np.full((ROWS, 3), -1, np.int64)
    ids[:, 0] = t
    ids[:, 1] = (t + 1) % VOCAB

    def kept(name, a):
        np.save(d / name, a)
        return name

    bad = ids.copy()
    bad[2, 2] = VOCAB + 5  # outside the real vocabulary
    expect_bad(d, logprob_args(**{"--kept-ids": kept("k_range.npy", bad)}), "k_range.npy",
               str(VOCAB + 5))
    bad = ids.copy()
    bad[1, 2] = bad[1, 0]  # twice in a row
    expect_bad(d, logprob_args(**{"--kept-ids": kept("k_twice.npy", bad), "--tp": "2"}),
               "k_twice.npy")
    bad = ids.copy()
    bad[3, 0] = (t[3] + 2) % VOCAB  # the target outside its set
    expect_bad(d, logprob_args(**{"--kept-ids": kept("k_target.npy", bad)}), "k_target.npy")
    expect_bad(d, logprob_args(**{"--kept-ids": kept("k_1d.npy", ids[:, 0])}), "k_1d.npy",
               "expected [4, K >= 1]")
    expect_bad(d, logprob_args(**{"--kept-ids": kept("k_f32.npy", ids.astype(np.float32))}),
               "k_f32.npy", "I64 or I32")
