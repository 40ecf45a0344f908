"""Indexed token files: the Megatron/fairseq .bin/.idx layout byte for byte, memory-mapped views, and clear errors
for files that do not belong together."""

import struct

import numpy as np
import pytest

from attnkit.data.indexed import IndexedTokens, IndexedWriter, token_dtype
from attnkit.errors import InputError

SEQS = [[5, 6, 7], [], [65535, 0], [9]]


def write(prefix, seqs=SEQS, dtype=np.uint16):
    with IndexedWriter(prefix, dtype) as writer:
        writer.add_many(seqs[:2])
        for seq in seqs[2:]:
            writer.add(seq)
    return writer


def read_like_megatron(idx_path):
    """The .idx read field by field as Megatron-LM's ``_IndexReader`` reads it (megatron/core/datasets/
    indexed_dataset.py): magic, <Q version, <B dtype code, <Q sequence count, <Q document count, then int32
    lengths, int64 pointers, int64 document indices. Independent of attnkit's reader."""
    raw = idx_path.read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", raw[9:17])
    (code,) = struct.unpack("<B", raw[17:18])
    n, n_docs = struct.unpack("<QQ", raw[18:34])
    lengths = np.frombuffer(raw, dtype=np.int32, count=n, offset=34)
    pointers = np.frombuffer(raw, dtype=np.int64, count=n, offset=34 + 4 * n)
    documents = np.frombuffer(raw, dtype=np.int64, count=n_docs, offset=34 + 12 * n)
    assert 34 + 12 * n + 8 * n_docs == len(raw)
    return version, code, lengths, pointers, documents


def test_layout_is_megatrons_byte_for_byte(tmp_path):
    write(tmp_path / "x")
    version, code, lengths, pointers, documents = read_like_megatron(tmp_path / "x.idx")
    assert (version, code) == (1, 8)  # 8 = uint16 in Megatron's DType enum
    assert lengths.tolist() == [3, 0, 2, 1]
    assert pointers.tolist() == [0, 6, 6, 10]  # byte offsets: 2 bytes a token
    assert documents.tolist() == [0, 1, 2, 3, 4]  # every sequence is its own document
    data = np.frombuffer((tmp_path / "x.bin").read_bytes(), dtype="<u2")
    assert data.tolist() == [5, 6, 7, 65535, 0, 9]


def test_reader_round_trip_returns_views_of_the_mapped_file(tmp_path):
    write(tmp_path / "x", dtype=np.int32)
    tokens = IndexedTokens(tmp_path / "x")
    assert len(tokens) == 4 and tokens.sizes.tolist() == [3, 0, 2, 1] and tokens.dtype == np.int32
    assert [tokens[i].tolist() for i in range(4)] == SEQS
    assert tokens[-1].tolist() == [9]
    assert np.shares_memory(tokens[0], tokens.tokens)  # a view into the memory map, not a copy
    with pytest.raises(IndexError):
        tokens[4]


def test_writer_digests_are_the_files_sha256(tmp_path):
    import hashlib

    writer = write(tmp_path / "x")
    for name in ("x.bin", "x.idx"):
        assert writer.sha256[name] == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    assert (writer.n_sequences, writer.n_tokens) == (4, 6)


def test_empty_file_and_dtype_choice(tmp_path):
    with IndexedWriter(tmp_path / "e", np.uint16):
        pass
    assert len(IndexedTokens(tmp_path / "e")) == 0
    assert token_dtype(8000) == np.uint16 and token_dtype(1 << 16) == np.uint16 and token_dtype(70000) == np.int32


def test_an_id_that_does_not_fit_is_refused_and_an_error_leaves_no_files(tmp_path):
    with pytest.raises(ValueError, match="do not fit uint16"):
        with IndexedWriter(tmp_path / "x", np.uint16) as writer:
            writer.add([1, 2])
            writer.add([70000])
    assert list(tmp_path.iterdir()) == []  # neither the .bin nor a temporary file


def test_a_truncated_bin_names_the_file(tmp_path):
    write(tmp_path / "x")
    data = tmp_path / "x.bin"
    data.write_bytes(data.read_bytes()[:-2])
    with pytest.raises(InputError, match=f"{data}: 10 bytes, but .*x.idx describes 12"):
        IndexedTokens(tmp_path / "x")


def test_a_bin_from_another_preparation_is_refused(tmp_path):
    write(tmp_path / "x")
    write(tmp_path / "y", seqs=[[1, 2, 3]])
    (tmp_path / "y.bin").replace(tmp_path / "x.bin")
    with pytest.raises(InputError, match="x.bin: 6 bytes, but .*x.idx describes 12"):
        IndexedTokens(tmp_path / "x")


def test_pointers_that_do_not_tile_the_bin_are_refused(tmp_path):
    write(tmp_path / "x")
    idx = tmp_path / "x.idx"
    raw = bytearray(idx.read_bytes())
    raw[34 + 16 + 8 : 34 + 16 + 16] = struct.pack("<q", 4)  # sequence 1 (empty) said to start at byte 4, not 6
    idx.write_bytes(bytes(raw))
    with pytest.raises(InputError, match=f"{idx}: its pointers and sizes do not tile"):
        IndexedTokens(tmp_path / "x")


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda raw: b"NOTANIDX\x00" + raw[9:], "no MMIDIDX magic"),
        (lambda raw: raw[:9] + struct.pack("<Q", 2) + raw[17:], "format version 2"),
        (lambda raw: raw[:-8], "truncated or damaged"),
        (lambda raw: raw[:20], "shorter than the 34-byte header"),
    ],
)
def test_a_damaged_index_names_the_file(tmp_path, damage, problem):
    write(tmp_path / "x")
    idx = tmp_path / "x.idx"
    idx.write_bytes(damage(idx.read_bytes()))
    with pytest.raises(InputError, match=problem) as caught:
        IndexedTokens(tmp_path / "x")
    assert str(caught.value).startswith(str(idx))


def test_a_missing_half_is_named(tmp_path):
    write(tmp_path / "x")
    (tmp_path / "x.bin").unlink()
    with pytest.raises(InputError, match="x.bin: no such file"):
        IndexedTokens(tmp_path / "x")
