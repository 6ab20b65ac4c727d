"""The bytes of a compressed artefact (a ``.pcnf`` file): a JSON header and named raw arrays in one
checksummed, optionally LZMA-coded container. :class:`postcast.compression.artefact.Artefact` says what the
header and arrays hold; this module only packs and unpacks them, refusing a damaged file in one line.

Layout: ``b"PCNF"``, format version (uint16), header length (uint32), CRC32 of everything after
the fixed prefix (uint32), then (format 3) one codec byte (0: none, 1: raw LZMA2) and, coded by it,
the JSON header and the raw arrays it lists (offset, dtype, shape). Formats 1 and 2 (no codec byte)
are still read.
"""

from __future__ import annotations

import json
import lzma
import struct
import zlib
from typing import Any

import numpy as np

from postcast.datasets.core.errors import BadInputError

MAGIC = b"PCNF"
FORMAT_VERSION = 3  # 3: a codec byte (0 none, 1 lzma) then the header and arrays, coded together
READABLE_VERSIONS = (1, 2, 3)  # 2: residual layer one SZ3 stream per variable; 1: one stream for all
CODECS = {"none": 0, "lzma": 1}
MAX_PAYLOAD = 2**34  # an lzma payload that expands beyond 16 GiB is refused as corrupt (no decompression bomb)
SUFFIX = ".pcnf"
_PREFIX = struct.Struct("<4sHII")  # magic, version, header bytes, crc32


class ArtefactError(BadInputError):
    """A file that is not a readable postcast artefact (corrupt, truncated, wrong version): invalid
    input, exit code 65 (still a ``ValueError``)."""


_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


def _decode_payload(body: bytes, name: str) -> bytes:
    """Format 3: codec byte + (header + arrays), lossless-coded as the byte says."""
    codec = body[0] if body else -1
    if codec == CODECS["none"]:
        return body[1:]
    if codec != CODECS["lzma"]:
        msg = f"{name}: unknown payload codec {codec}; this postcast knows {CODECS}"
        raise ArtefactError(msg)
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    try:
        out = dec.decompress(body[1:], max_length=MAX_PAYLOAD)
    except lzma.LZMAError as err:
        msg = f"{name}: corrupt artefact payload ({err}); recompress the source"
        raise ArtefactError(msg) from err
    if not dec.eof:
        msg = f"{name}: truncated or oversized artefact payload; recompress the source"
        raise ArtefactError(msg)
    return out


def pack(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """The file's bytes: ``header`` (JSON-serialisable; its ``config.entropy`` picks the codec) and ``arrays``."""
    table, offset, blobs = {}, 0, []
    for name, arr in arrays.items():
        raw = np.ascontiguousarray(arr).tobytes()
        table[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset, "nbytes": len(raw)}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps({**header, "arrays": table}, separators=(",", ":")).encode()
    codec = header["config"].get("entropy", "none")
    payload = head + b"".join(blobs)
    if codec == "lzma":  # raw LZMA2 stream: no container bytes; settings are fixed by the format
        payload = lzma.compress(payload, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    body = bytes([CODECS[codec]]) + payload
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(head), zlib.crc32(body)) + body


def unpack(data: bytes, name: str = "artefact") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, arrays) from a file's bytes (the arrays: read-only views of them); :class:`ArtefactError`
    naming ``name`` for a file that is not a readable artefact."""
    if len(data) < _PREFIX.size or data[:4] != MAGIC:
        msg = f"{name}: not a postcast neural-field artefact (bad magic; expected a {SUFFIX} file)"
        raise ArtefactError(msg)
    _, version, head_len, crc = _PREFIX.unpack_from(data)
    if version not in READABLE_VERSIONS:
        msg = f"{name}: artefact format version {version}; this postcast reads versions {READABLE_VERSIONS}"
        raise ArtefactError(msg)
    body = data[_PREFIX.size :]
    if zlib.crc32(body) != crc:
        msg = f"{name}: corrupt or truncated artefact (checksum mismatch); recompress the source"
        raise ArtefactError(msg)
    if version >= 3:
        body = _decode_payload(body, name)
    if len(body) < head_len:
        msg = f"{name}: corrupt or truncated artefact (header longer than the file); recompress the source"
        raise ArtefactError(msg)
    try:  # the header length is outside the checksum: a damaged one shows as an unparsable header
        header = json.loads(body[:head_len])
        table = header.pop("arrays")
        blob = memoryview(body)[head_len:]
        arrays = {
            k: np.frombuffer(blob[v["offset"] : v["offset"] + v["nbytes"]], dtype=np.dtype(v["dtype"])).reshape(
                v["shape"]
            )
            for k, v in table.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # JSONDecodeError, UnicodeDecodeError too
        msg = f"{name}: corrupt artefact header ({type(err).__name__}: {err}); recompress the source"
        raise ArtefactError(msg) from err
    return header, arrays
