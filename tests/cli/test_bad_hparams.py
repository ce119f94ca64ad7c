"""A GGUF whose hyper-parameters are NaN or out of range is refused with one line (issue #37: a NaN
rms epsilon ran and printed nothing)."""
import math
import pathlib
import struct

import pytest

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "reference" / "fixtures" / "tiny_qwen3.gguf"


def patched(tmp_path, key, value):
    data = bytearray(FIXTURE.read_bytes())
    name = key.encode()
    at = data.find(struct.pack("<Q", len(name)) + name)
    assert at >= 0, key
    typ = at + 8 + len(name)
    assert struct.unpack_from("<I", data, typ)[0] == 6  # GGUF f32
    struct.pack_into("<f", data, typ + 4, value)
    out = tmp_path / "bad.gguf"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("value", [math.nan, -1e-6, 0.0, math.inf])
def test_bad_rms_eps_is_refused(xpert, tmp_path, value):
    r = xpert("run", "-m", patched(tmp_path, "qwen3.attention.layer_norm_rms_epsilon", value), "-p", "hi", "-n", "1")
    assert r.returncode == 1, (r.returncode, r.stderr)
    err = r.stderr.decode()
    assert err.startswith("xpert: error:") and "layer_norm_rms_epsilon" in err, err
