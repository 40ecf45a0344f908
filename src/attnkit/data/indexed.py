"""Token files read through memory maps, in the ``.bin``/``.idx`` layout of Megatron-LM's and fairseq's
``MMapIndexedDataset`` (so those tools read what attnkit writes, and the other way round).

``PREFIX.bin`` is every sequence's token ids, one after the other, in one integer dtype. ``PREFIX.idx`` is

    magic      9 bytes  b"MMIDIDX\\x00\\x00"
    version    uint64   1
    dtype      uint8    a code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    n          uint64   number of sequences
    n_docs     uint64   number of document boundaries (Megatron's "document index"; here n + 1: a sequence is a
                        document, a sentence or a labelled text)
    sizes      int32[n]       tokens in each sequence
    pointers   int64[n]       byte offset of each sequence in the .bin
    documents  int64[n_docs]  0, 1, ..., n

all little-endian. Reading costs no memory beyond the page cache: ``sizes`` is a view of the mapped index (what
token-budget batching needs, nothing else), and ``tokens[i]`` a view of the mapped ``.bin``, so a process touches
only the sequences of its own micro-batches.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt

from attnkit.atomic import open_atomic
from attnkit.errors import InputError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count: 34 bytes
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
CODES = {np.dtype(dtype): code for code, dtype in DTYPES.items()}
_COPY = 1 << 16  # entries per chunk when the index is assembled: a few MB of arrays, however long the corpus


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest dtype for ids below ``vocab_size``: uint16 (2 bytes a token) up to 65,536 ids, else int32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def bin_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.bin")


def idx_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.idx")


class IndexedWriter:
    """Appends sequences to ``PREFIX.bin`` as they come; ``finish`` writes ``PREFIX.idx``. Memory is constant:
    the ids go straight to the file and the sizes to a temporary spool file, never to a growing Python list.

    Both files appear atomically (a temporary name, fsynced, renamed) when ``finish`` returns; leaving the
    ``with`` block by an exception leaves neither.
    """

    def __init__(self, prefix: str | Path, dtype: npt.DTypeLike):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODES:
            raise ValueError(f"dtype {self.dtype} has no code in the indexed-dataset format")
        self.n_sequences = 0
        self.n_tokens = 0
        self.sha256: dict[str, str] = {}
        self._stack = ExitStack()
        self._bin = self._stack.enter_context(open_atomic(bin_path(self.prefix)))
        self._bin_hash = hashlib.sha256()
        self._sizes = self._stack.enter_context(tempfile.TemporaryFile(dir=self.prefix.parent))
        self._finished = False
        self._max_id = np.iinfo(self.dtype).max if self.dtype.kind in "iu" else None

    def __enter__(self) -> IndexedWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None and not self._finished:
            self.finish()
        self._stack.__exit__(exc_type, exc, tb)  # an error unlinks the temporary .bin; success renamed it already

    def add(self, ids: Sequence[int] | np.ndarray) -> None:
        self.add_many([ids])

    def add_many(self, seqs: Sequence[Sequence[int] | np.ndarray]) -> None:
        """Append several sequences at once (one write per chunk of lines is much faster than one per line)."""
        sizes = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(sizes.sum()))
        if flat.size and (flat.min() < 0 or (self._max_id is not None and flat.max() > self._max_id)):
            raise ValueError(f"token ids {flat.min()}..{flat.max()} do not fit {self.dtype}")
        data = flat.astype(self.dtype).tobytes()
        self._bin.write(data)
        self._bin_hash.update(data)
        self._sizes.write(sizes.astype("<i4").tobytes())
        self.n_sequences += len(seqs)
        self.n_tokens += int(flat.size)

    def finish(self) -> None:
        """Write the index (sizes from the spool, pointers as their running byte offsets, the document index) and
        move both files into place."""
        n, itemsize = self.n_sequences, self.dtype.itemsize
        index_hash = hashlib.sha256()
        with open_atomic(idx_path(self.prefix)) as idx:

            def put(data: bytes) -> None:
                idx.write(data)
                index_hash.update(data)

            put(HEADER.pack(MAGIC, VERSION, CODES[self.dtype], n, n + 1))
            self._sizes.seek(0)
            while chunk := self._sizes.read(4 * _COPY):
                put(chunk)
            self._sizes.seek(0)
            offset = 0
            while chunk := self._sizes.read(4 * _COPY):
                sizes = np.frombuffer(chunk, dtype="<i4").astype(np.int64)
                ends = offset + np.cumsum(sizes * itemsize)
                put((ends - sizes * itemsize).astype("<i8").tobytes())  # each sequence starts where the last ended
                offset = int(ends[-1])
            for start in range(0, n + 1, _COPY):
                put(np.arange(start, min(n + 1, start + _COPY), dtype="<i8").tobytes())
        self._finished = True
        self.sha256 = {
            bin_path(self.prefix).name: self._bin_hash.hexdigest(),
            idx_path(self.prefix).name: index_hash.hexdigest(),
        }
        self._stack.close()  # renames the .bin into place


class IndexedTokens:
    """A read-only, memory-mapped ``PREFIX.bin``/``PREFIX.idx`` pair: ``len``, ``sizes`` and ``[i]`` -> ids.

    Opening checks that the two files belong together (the index's pointers tile the ``.bin`` exactly), so a
    truncated copy or a ``.bin`` from another preparation is an InputError naming the file, not wrong batches.
    """

    def __init__(self, prefix: str | Path):
        self.prefix = Path(prefix)
        idx, data = idx_path(self.prefix), bin_path(self.prefix)
        for path in (idx, data):
            if not path.is_file():
                raise InputError(f"{path}: no such file (an indexed token file is a .bin and an .idx)")
        index = np.memmap(idx, dtype=np.uint8, mode="r") if idx.stat().st_size else np.zeros(0, np.uint8)
        if index.size < HEADER.size:
            raise InputError(f"{idx}: {index.size} bytes, shorter than the {HEADER.size}-byte header")
        magic, version, code, n, n_docs = HEADER.unpack(index[: HEADER.size].tobytes())
        if magic != MAGIC:
            raise InputError(f"{idx}: not an indexed token file (no MMIDIDX magic)")
        if version != VERSION:
            raise InputError(f"{idx}: format version {version}; this attnkit reads version {VERSION}")
        if code not in DTYPES:
            raise InputError(f"{idx}: unknown dtype code {code}")
        expected = HEADER.size + 4 * n + 8 * n + 8 * n_docs
        if index.size != expected:
            raise InputError(
                f"{idx}: {index.size} bytes, but its header describes {n} sequences and {n_docs} "
                f"document boundaries ({expected} bytes); the file is truncated or damaged"
            )
        self.dtype = np.dtype(DTYPES[code])
        offset = HEADER.size
        self.sizes = np.frombuffer(index, dtype="<i4", count=n, offset=offset)  # (N,) tokens per sequence
        self.pointers = np.frombuffer(index, dtype="<i8", count=n, offset=offset + 4 * n)  # (N,) byte offsets
        self.document_indices = np.frombuffer(index, dtype="<i8", count=n_docs, offset=offset + 12 * n)
        n_bytes = data.stat().st_size
        self.tokens = (
            np.memmap(data, dtype=self.dtype, mode="r") if n_bytes else np.zeros(0, self.dtype)
        )  # (total tokens,); mmap refuses an empty file
        self._check(idx, data, n_bytes)

    def _check(self, idx: Path, data: Path, n_bytes: int) -> None:
        itemsize = self.dtype.itemsize
        ends = self.pointers.astype(np.int64) + self.sizes.astype(np.int64) * itemsize
        described = int(ends[-1]) if len(self.sizes) else 0
        if described != n_bytes:
            raise InputError(
                f"{data}: {n_bytes} bytes, but {idx} describes {described}; the pair comes from "
                "different preparations or one of them is truncated"
            )
        tiled = len(self.sizes) == 0 or (
            self.pointers[0] == 0 and (self.sizes >= 0).all() and np.array_equal(self.pointers[1:], ends[:-1])
        )
        if not tiled:
            raise InputError(f"{idx}: its pointers and sizes do not tile {data}; the index is damaged")

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        """The ids of sequence ``i``: a read-only view of the mapped ``.bin`` (nothing is copied)."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"sequence {i} of {len(self)}")
        start = int(self.pointers[i]) // self.dtype.itemsize
        return self.tokens[start : start + int(self.sizes[i])]  # (L_i,)
