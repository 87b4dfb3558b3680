"""serving.runtimes.codecs: JSON, CSV and NPY in and out; everything else is a ValidationError."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest

from serving.errors import ValidationError
from serving.runtimes import codecs


def npy(array: Any, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=allow_pickle)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("text/csv", "text/csv"),
        ("Text/CSV; charset=utf-8", "text/csv"),
        ("  application/json ; charset=UTF-8", "application/json"),
        ("application/x-npy", "application/x-npy"),
        (None, ""),
        ("", ""),
    ],
)
def test_media_type(content_type: str | None, expected: str) -> None:
    assert codecs.media_type(content_type) == expected


# --- decode ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (b'{"instances": [[1, 2]]}', "application/json", {"instances": [[1, 2]]}),
        (b"[1.5, 2, 3]", "application/json; charset=utf-8", [1.5, 2, 3]),
        ('["caf\u00e9"]'.encode(), "application/json", ["caf\u00e9"]),
        (b"1,2,3\n4,5,6\n", "text/csv", np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float64)),
        (
            b"1,2\r\n\r\n3,4\r\n",
            "text/csv; charset=utf-8",
            np.array([[1, 2], [3, 4]], dtype=np.float64),
        ),
        (b"0.5, -2e3", "TEXT/CSV", np.array([[0.5, -2000.0]])),
        (
            npy(np.arange(6, dtype=np.int32).reshape(2, 3)),
            "application/x-npy",
            np.arange(6, dtype=np.int32).reshape(2, 3),
        ),
        (npy(np.array([1.5, 2.5])), "application/x-npy; x=1", np.array([1.5, 2.5])),
    ],
    ids=[
        "json object",
        "json list with charset",
        "json utf-8",
        "csv",
        "csv crlf and blank line",
        "csv spaces",
        "npy int",
        "npy param",
    ],
)
def test_decode(body: bytes, content_type: str, expected: Any) -> None:
    decoded = codecs.decode(body, content_type)
    if isinstance(expected, np.ndarray):
        assert isinstance(decoded, np.ndarray)
        assert decoded.dtype == expected.dtype
        np.testing.assert_array_equal(decoded, expected)
    else:
        assert decoded == expected


@pytest.mark.parametrize(
    ("body", "content_type", "named"),
    [
        (b'{"a": ', "application/json", "application/json"),
        (b"\xff\xfe[1]", "application/json", "application/json"),
        (b"", "application/json", "application/json"),
        (b"1,2\n3\n", "text/csv", "text/csv"),
        (b"1,abc\n", "text/csv; charset=utf-8", "text/csv"),
        (b"\xff,1\n", "text/csv", "text/csv"),
        (b"", "application/x-npy", "application/x-npy"),
        (b"not an array", "application/x-npy", "application/x-npy"),
        (npy(np.arange(10.0))[:-8], "application/x-npy", "application/x-npy"),
        (
            npy(np.array([{"a": 1}, None], dtype=object), allow_pickle=True),
            "application/x-npy",
            "application/x-npy",
        ),
        (b"1,2", "text/plain", "'text/plain'"),
        (b"1,2", "application/octet-stream", "'application/octet-stream'"),
        (b"1,2", None, "(none)"),
        (b"1,2", "", "(none)"),
    ],
    ids=[
        "truncated json",
        "json not utf-8",
        "empty json",
        "ragged csv",
        "csv not numbers",
        "csv not utf-8",
        "empty npy",
        "npy garbage",
        "truncated npy",
        "pickled object npy",
        "text/plain",
        "octet-stream",
        "no content type",
        "empty content type",
    ],
)
def test_decode_refuses_with_a_validation_error_naming_the_type(
    body: bytes, content_type: str | None, named: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        codecs.decode(body, content_type)
    assert named in caught.value.message
    # a container answers a malformed body with 400, an unsupported content type with 415 (the
    # toolkits' codes)
    expected = 415 if named.startswith("'") or named == "(none)" else 400
    assert caught.value.status == expected and caught.value.code == "ValidationError"


def test_pickled_npy_is_refused_without_running_it(tmp_path) -> None:
    # An object array is a pickle: loading it would call whatever the pickle names.
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (marker.write_text, ("pwned",))

    body = npy(np.array([Payload()], dtype=object), allow_pickle=True)
    with pytest.raises(ValidationError, match="application/x-npy"):
        codecs.decode(body, "application/x-npy")
    assert not marker.exists()


def test_unsupported_type_lists_the_supported_ones() -> None:
    with pytest.raises(ValidationError) as caught:
        codecs.decode(b"x", "image/png")
    for supported in codecs.SUPPORTED:
        assert supported in caught.value.message


# --- encode ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.array([0, 1, 2]), [0, 1, 2]),
        (np.array([[0.5, 1.0]]), [[0.5, 1.0]]),
        (
            {"scores": np.float32(0.5), "ids": np.array([1, 2]), "n": np.int64(3)},
            {"scores": 0.5, "ids": [1, 2], "n": 3},
        ),
        ([np.int64(1), (np.float64(2.0), "x")], [1, [2.0, "x"]]),
        ("plain", "plain"),
    ],
    ids=["1-d array", "2-d array", "dict of numpy", "nested list and tuple", "string"],
)
def test_encode_json(value: Any, expected: Any) -> None:
    body, content_type = codecs.encode(value, "application/json")
    assert content_type == "application/json"
    assert json.loads(body) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.array([[1.0, 2.0], [3.0, 4.0]]), b"1.0,2.0\n3.0,4.0\n"),
        (np.array([0, 1, 2]), b"0\n1\n2\n"),  # 1-D: one prediction per line
        (np.int64(7), b"7\n"),
        (np.zeros((2, 1, 2)), b"0.0,0.0\n0.0,0.0\n"),  # higher ranks flatten per row
        (["setosa", "virginica"], b"setosa\nvirginica\n"),
    ],
    ids=["2-d", "1-d", "scalar", "3-d", "strings"],
)
def test_encode_csv(value: Any, expected: bytes) -> None:
    assert codecs.encode(value, "text/csv") == (expected, "text/csv")


@pytest.mark.parametrize(
    "array",
    [
        np.array([[1.5, -2.0], [3.0, 4.25]]),
        np.arange(5, dtype=np.int16),
        np.array(["a", "bc"]),
        np.array(True),
    ],
    ids=["float 2-d", "int16", "unicode", "0-d bool"],
)
def test_npy_round_trip(array: np.ndarray) -> None:
    body, content_type = codecs.encode(array, "application/x-npy")
    assert content_type == "application/x-npy"
    decoded = codecs.decode(body, content_type)
    assert decoded.dtype == array.dtype
    np.testing.assert_array_equal(decoded, array)


def test_csv_round_trip() -> None:
    array = np.array([[5.1, 3.5, 1.4, 0.2], [6.2, 3.4, 5.4, 2.3]])
    body, content_type = codecs.encode(array, "text/csv; charset=utf-8")
    np.testing.assert_array_equal(codecs.decode(body, content_type), array)


def test_json_round_trip() -> None:
    value = {"instances": [[5.1, 3.5, 1.4, 0.2]], "name": "iris", "ok": True, "none": None}
    body, content_type = codecs.encode(value, None)
    assert content_type == "application/json"
    assert codecs.decode(body, content_type) == value


def test_npy_encode_refuses_mixed_types() -> None:
    with pytest.raises(ValidationError, match="application/x-npy"):
        codecs.encode([1, "a", None], "application/x-npy")


def test_encode_refuses_unsupported_accept() -> None:
    with pytest.raises(ValidationError, match="image/png"):
        codecs.encode([1], "image/png")


# --- Accept negotiation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, "application/json"),
        ("", "application/json"),
        ("*/*", "application/json"),
        ("application/*", "application/json"),
        ("text/csv", "text/csv"),
        ("text/csv; charset=utf-8", "text/csv"),
        ("APPLICATION/X-NPY", "application/x-npy"),
        ("image/png, text/csv", "text/csv"),
        ("text/csv, application/json", "text/csv"),
        # first supported entry wins; q is not weighed
        ("application/json;q=0.9, text/csv", "application/json"),
        ("text/html, */*", "application/json"),
        ("image/png,application/x-npy;q=0.5", "application/x-npy"),
    ],
)
def test_choose_accept(accept: str | None, chosen: str) -> None:
    assert codecs.choose_accept(accept) == chosen


@pytest.mark.parametrize("accept", ["image/png", "text/html, text/plain", "application/xml;q=1"])
def test_unsupported_accept_is_a_validation_error(accept: str) -> None:
    with pytest.raises(ValidationError) as caught:
        codecs.choose_accept(accept)
    assert repr(accept) in caught.value.message


# NPY headers are read with a pattern (NumPy's reader evaluates them with literal_eval, 100 µs a
# request): the same arrays, and the same refusals, as np.load.
def _npy_with_header(header: str, data: bytes) -> bytes:
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=">f8").reshape(3, 4),
        np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
        np.array(3.5),
        np.zeros((0, 2), dtype=np.uint8),
        np.array(["a", "bc"]),
        np.array([True, False]),
        np.zeros(3, dtype=[("x", "<i4"), ("y", "<f2")]),  # a structured dtype: NumPy's reader
    ],
    ids=["big-endian", "fortran", "scalar", "empty", "text", "bool", "structured"],
)
def test_fast_npy_reads_what_np_load_reads(array: np.ndarray) -> None:
    body = npy(array)
    decoded = codecs.decode(body, "application/x-npy")
    expected = np.load(io.BytesIO(body), allow_pickle=False)
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    assert decoded.tobytes() == expected.tobytes() and decoded.flags.writeable
    assert np.array_equal(np.load(io.BytesIO(codecs.npy_encode(array)), allow_pickle=False), array)


@pytest.mark.parametrize(
    "body, words",
    [
        (
            _npy_with_header("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", b"\0" * 8),
            "object arrays",
        ),
        (
            _npy_with_header(
                "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", b"\0" * 24
            ),
            "declares 32 bytes",
        ),
        (
            _npy_with_header(
                "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000, 1000000000), }", b""
            ),
            "declares",
        ),
    ],
)
def test_fast_npy_refuses_what_np_load_would_not_read_safely(body: bytes, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        codecs.decode(body, "application/x-npy")
