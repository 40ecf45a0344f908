"""Prepared corpora hold exactly the ids the in-memory encoders produce (with truncation, across chunk
boundaries), record what they were made from, and refuse a tokenizer or files that do not match."""

import hashlib
import json
import random

import numpy as np
import pytest

import attnkit.data.prepare_split as prepare_split
from attnkit.cli import main
from attnkit.data.prepare import Source, TokenizerSpec, load_tokenizer, prepare_corpus
from attnkit.data.prepared import open_prepared
from attnkit.data.readers.labeled import read_labeled
from attnkit.data.readers.parallel import read_parallel_files, read_parallel_tsv
from attnkit.errors import InputError
from attnkit.tasks.classify import encode_examples
from attnkit.tasks.translate import encode_pairs
from attnkit.tokenization import train_tokenizer

WORDS = "the a cat dog sat ran on under mat house big small red blue quickly slowly and but".split()


def sentence(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))) + rng.choice([".", "!", "?"])


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 7 lines, so that a 60-line corpus crosses many chunk boundaries (truncation in several)."""
    monkeypatch.setattr(prepare_split, "CHUNK_LINES", 7)


@pytest.fixture
def parallel_tsv(tmp_path):
    rng = random.Random(0)
    path = tmp_path / "train.tsv"
    path.write_text("source\ttarget\n" + "".join(f"{sentence(rng)}\t{sentence(rng)}\n" for _ in range(60)))
    return path


@pytest.fixture
def labelled_tsv(tmp_path):
    rng = random.Random(1)
    path = tmp_path / "train.tsv"
    rows = "".join(f"{sentence(rng)}\t{rng.choice(['pos', 'neg', 'mixed'])}\n" for _ in range(60))
    path.write_text("text\tlabel\n" + rows)
    return path


def ids(tokens):
    return [tokens[i].tolist() for i in range(len(tokens))]


def test_parallel_ids_equal_the_in_memory_encoder_with_truncation(tmp_path, parallel_tsv, small_chunks):
    spec = TokenizerSpec(kind="bpe", vocab_size=300, min_freq=1)  # > 5 specials + 256 byte ids
    meta = prepare_corpus(
        "translate", {"train": Source((parallel_tsv,))}, tmp_path / "out", max_len=9, tokenizer_spec=spec
    )
    pairs = read_parallel_tsv(parallel_tsv)
    # The tokenizer training does on the same text (training's call, in memory) is the one prepared here.
    texts = (t for p in pairs for t in (p.source, p.target))
    tokenizer = train_tokenizer(texts, kind="bpe", vocab_size=300, min_freq=1)
    assert meta["tokenizer"]["fingerprint"] == tokenizer.fingerprint()
    expected = encode_pairs(tokenizer, pairs, 9, "truncate")
    split = open_prepared(tmp_path / "out", tokenizer).split("train")
    assert ids(split.src) == expected.src and ids(split.tgt) == expected.tgt
    assert split.src.sizes.tolist() == [len(s) for s in expected.src]  # what token-budget batching reads
    info = meta["splits"]["train"]
    assert expected.truncation.n_truncated > 10  # the test exercises cutting, in many chunks
    assert info["truncated"] == expected.truncation.n_truncated and info["longest"] == expected.truncation.longest
    assert info["sequences"] == len(pairs)
    # counted in sentences, both sides of a pair (n_total was the pairs: "600 of 300 truncated")
    assert expected.truncation.n_total == 2 * len(pairs) >= expected.truncation.n_truncated
    assert info["tokens"] == {"src": sum(map(len, expected.src)), "tgt": sum(map(len, expected.tgt))}


def test_two_aligned_files_give_the_ids_of_the_in_memory_reader(tmp_path, small_chunks):
    rng = random.Random(2)
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_text("".join(sentence(rng) + "\n" for _ in range(30)))
    tgt.write_text("".join(sentence(rng) + "\r\n" for _ in range(30)))
    tokenizer = train_tokenizer(WORDS, kind="word", vocab_size=100, min_freq=1)
    prepare_corpus("translate", {"train": Source((src, tgt))}, tmp_path / "out", max_len=6, tokenizer=tokenizer)
    expected = encode_pairs(tokenizer, read_parallel_files(src, tgt), 6, "truncate")
    split = open_prepared(tmp_path / "out").split("train")
    assert ids(split.src) == expected.src and ids(split.tgt) == expected.tgt


def test_labelled_ids_and_labels_equal_the_in_memory_encoder(tmp_path, labelled_tsv, small_chunks):
    spec = TokenizerSpec(kind="word", vocab_size=100, min_freq=1, add_cls=True)
    meta = prepare_corpus(
        "classify", {"train": Source((labelled_tsv,))}, tmp_path / "out", max_len=8, tokenizer_spec=spec
    )
    examples = read_labeled(labelled_tsv)
    labels = sorted({ex.label for ex in examples})  # training's label order
    tokenizer = train_tokenizer((ex.text for ex in examples), kind="word", vocab_size=100, min_freq=1, add_cls=True)
    assert meta["labels"] == labels and meta["tokenizer"]["fingerprint"] == tokenizer.fingerprint()
    expected, truncation = encode_examples(tokenizer, [ex.text for ex in examples], 8, "truncate")
    corpus = open_prepared(tmp_path / "out")
    split = corpus.split("train")
    assert ids(split.text) == expected
    assert split.labels.tolist() == [labels.index(ex.label) for ex in examples]
    assert split.labels.dtype == np.int64 and corpus.labels == labels
    assert truncation.n_truncated > 5 and meta["splits"]["train"]["truncated"] == truncation.n_truncated


def test_a_trailing_special_token_is_kept_when_cutting_as_training_keeps_it(tmp_path, labelled_tsv, small_chunks):
    from tokenizers import processors

    tokenizer = train_tokenizer(WORDS, kind="wordpiece", vocab_size=100, min_freq=1, add_cls=True)
    cls_id, eos_id = tokenizer.cls_id, tokenizer.eos_id
    tokenizer.backend.post_processor = processors.TemplateProcessing(  # BERT's shape: [CLS] text [SEP]
        single="<cls> $A <eos>", special_tokens=[("<cls>", cls_id), ("<eos>", eos_id)]
    )
    assert tokenizer.n_trailing_specials == 1
    prepare_corpus("classify", {"train": Source((labelled_tsv,))}, tmp_path / "out", max_len=6, tokenizer=tokenizer)
    expected, truncation = encode_examples(tokenizer, [ex.text for ex in read_labeled(labelled_tsv)], 6, "truncate")
    assert truncation.n_truncated > 5 and all(seq[-1] == eos_id for seq in expected)
    assert ids(open_prepared(tmp_path / "out", tokenizer).split("train").text) == expected


def test_load_tokenizer_from_a_run_directory_uses_its_saved_meta(tmp_path):
    tokenizer = train_tokenizer(WORDS, kind="word", vocab_size=100, min_freq=1, add_cls=True)
    tokenizer.save(tmp_path / "tokenizer.json")
    assert load_tokenizer(tmp_path / "tokenizer.json").specials == tokenizer.specials  # inferred from the file
    (tmp_path / "config.json").write_text(json.dumps({"tokenizer": {**tokenizer.meta(), "fingerprint": "0" * 64}}))
    with pytest.raises(InputError, match="fingerprint mismatch"):  # the run's meta is used, and checked
        load_tokenizer(tmp_path)


def test_sidecar_records_sources_and_the_sha256_of_every_file(tmp_path, parallel_tsv):
    tokenizer = train_tokenizer(WORDS, kind="word", vocab_size=100, min_freq=1)
    meta = prepare_corpus(
        "translate",
        {"train": Source((parallel_tsv,)), "valid": Source((parallel_tsv,))},
        tmp_path / "out",
        max_len=32,
        tokenizer=tokenizer,
    )
    assert json.loads((tmp_path / "out" / "prepared.json").read_text()) == meta
    for name, info in meta["splits"].items():
        assert info["sources"] == [
            {"file": str(parallel_tsv), "sha256": hashlib.sha256(parallel_tsv.read_bytes()).hexdigest()}
        ]
        assert sorted(info["files"]) == [f"{name}.src.bin", f"{name}.src.idx", f"{name}.tgt.bin", f"{name}.tgt.idx"]
        for file, digest in info["files"].items():
            assert hashlib.sha256((tmp_path / "out" / file).read_bytes()).hexdigest() == digest
    assert load_tokenizer(tmp_path / "out").fingerprint() == tokenizer.fingerprint()
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")) == []  # no temporaries


def test_another_tokenizer_is_refused_naming_the_sidecar(tmp_path, parallel_tsv):
    tokenizer = train_tokenizer(WORDS, kind="word", vocab_size=100, min_freq=1)
    prepare_corpus("translate", {"train": Source((parallel_tsv,))}, tmp_path / "out", max_len=32, tokenizer=tokenizer)
    other = train_tokenizer(WORDS[:-1], kind="word", vocab_size=100, min_freq=1)
    with pytest.raises(InputError, match=r"out/prepared.json: the corpus was prepared with another tokenizer"):
        open_prepared(tmp_path / "out", other)


def test_files_that_disagree_with_the_sidecar_are_refused(tmp_path, parallel_tsv, labelled_tsv):
    tokenizer = train_tokenizer(WORDS, kind="word", vocab_size=100, min_freq=1)
    prepare_corpus("translate", {"train": Source((parallel_tsv,))}, tmp_path / "a", max_len=32, tokenizer=tokenizer)
    prepare_corpus(
        "translate",
        {"train": Source((parallel_tsv,)), "valid": Source((parallel_tsv,))},
        tmp_path / "b",
        max_len=32,
        tokenizer=tokenizer,
    )
    for suffix in ("bin", "idx"):
        (tmp_path / "a" / f"train.tgt.{suffix}").write_bytes((tmp_path / "b" / f"train.src.{suffix}").read_bytes())
    (tmp_path / "a" / "train.src.bin").write_bytes(b"\x00\x00")
    with pytest.raises(InputError, match=r"a/train.src.bin: 2 bytes, but .*train.src.idx describes"):
        open_prepared(tmp_path / "a").split("train")
    with pytest.raises(InputError, match=r"no split 'test' \(has: train, valid\)"):
        open_prepared(tmp_path / "b").split("test")
    # Same length, other ids: opening cannot tell (it reads no data), the checksums can.
    open_prepared(tmp_path / "b").verify()
    data = tmp_path / "b" / "valid.tgt.bin"
    data.write_bytes(bytes(reversed(data.read_bytes())))
    open_prepared(tmp_path / "b").split("valid")
    with pytest.raises(InputError, match=f"{data}: sha256 differs from .*prepared.json"):
        open_prepared(tmp_path / "b").verify()
    with pytest.raises(InputError, match=f"{data}: sha256 differs"):  # what training calls before its first step
        open_prepared(tmp_path / "b").check("translate", max_len=32)


def test_policy_error_names_the_file_and_line_and_writes_nothing(tmp_path, small_chunks):
    path = tmp_path / "p.tsv"
    path.write_text("a\tb\n" * 20 + "a a a a a a a a a\tb\n" + "a\tb\n" + "a a a a a a a a a\tb\n")
    tokenizer = train_tokenizer(["a b"], kind="word", vocab_size=10, min_freq=1)
    with pytest.raises(InputError) as caught:
        prepare_corpus(
            "translate", {"train": Source((path,))}, tmp_path / "out", max_len=5, policy="error", tokenizer=tokenizer
        )
    # The count is of the whole file, the first offender is named by file and line, as training names it.
    assert str(caught.value).startswith(f"2 source sentences are longer than max_len=5 tokens (first: {path}:21, 10 ")
    with pytest.raises(InputError, match="2 source sentences are longer than max_len=5 tokens .first: line 21, 10 "):
        encode_pairs(tokenizer, read_parallel_tsv(path), 5, "error")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["p.tsv"]


def test_a_valid_label_unknown_to_train_names_file_and_line(tmp_path, labelled_tsv):
    valid = tmp_path / "valid.tsv"
    valid.write_text("text\tlabel\nthe cat\tpos\nthe dog\tunheard\n")
    with pytest.raises(InputError, match=f"{valid}:3: label 'unheard' is not one of the labels"):
        prepare_corpus(
            "classify",
            {"train": Source((labelled_tsv,)), "valid": Source((valid,))},
            tmp_path / "out",
            max_len=8,
            tokenizer_spec=TokenizerSpec(min_freq=1),
        )


def test_an_existing_directory_that_is_not_a_prepared_corpus_is_left_alone(tmp_path, parallel_tsv):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="mine: exists and is not a prepared corpus"):
        prepare_corpus(
            "translate",
            {"train": Source((parallel_tsv,))},
            tmp_path / "mine",
            max_len=8,
            tokenizer_spec=TokenizerSpec(),
        )
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# ---------------------------------------------------------------------------------------------------------
# The command.


def test_cli_prepare_prints_the_counts_and_reuses_a_tokenizer(tmp_path, parallel_tsv, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "data",
            "prepare",
            "--task",
            "translate",
            "--train",
            str(parallel_tsv),
            "--vocab-size",
            "300",  # > 5 specials + 256 byte-fallback ids
            "--min-freq",
            "1",
            "--max-len",
            "9",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    sidecar = json.loads((out / "prepared.json").read_text())
    assert printed["splits"]["train"]["sequences"] == 60 == sidecar["splits"]["train"]["sequences"]
    assert printed["tokenizer_fingerprint"] == sidecar["tokenizer"]["fingerprint"]
    assert sidecar["tokenizer"]["kind"] == "bpe"  # translate's default, as `translate train` trains
    # --tokenizer with a prepared corpus's (or a run's) tokenizer.json: the same ids again.
    rc = main(
        [
            "data",
            "prepare",
            "--task",
            "translate",
            "--train",
            str(parallel_tsv),
            "--tokenizer",
            str(out / "tokenizer.json"),
            "--max-len",
            "9",
            "--out",
            str(tmp_path / "again"),
        ]
    )
    assert rc == 0
    again = json.loads((tmp_path / "again" / "prepared.json").read_text())
    assert again["splits"]["train"]["files"] == sidecar["splits"]["train"]["files"]


@pytest.mark.parametrize(
    "body, line, problem",
    [
        ("source\ttarget\nHello\tHallo\nno tab here\n", 3, "no tab"),
        ("a\tb\n" + "c\t\n", 2, "empty target"),
    ],
)
def test_cli_bad_corpus_is_one_error_line_naming_file_and_line(tmp_path, capsys, body, line, problem):
    path = tmp_path / "bad.tsv"
    path.write_text(body)
    rc = main(
        [
            "data",
            "prepare",
            "--task",
            "translate",
            "--train",
            str(path),
            "--vocab-size",
            "300",  # > 5 specials + 256 byte-fallback ids
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"error: {path}:{line}: ") and problem in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--task", "translate", "--out", "o"], "give --train FILE"),
        (["--task", "translate", "--train-src", "a", "--out", "o"], "--train-src and --train-tgt go together"),
        (["--task", "classify", "--train-src", "a", "--train-tgt", "b", "--out", "o"], "are for --task translate"),
        (
            ["--task", "classify", "--train", "a.tsv", "--tokenizer", "t.json", "--vocab-size", "9", "--out", "o"],
            "drop --vocab-size",
        ),
        (["--task", "classify", "--train", "missing.tsv", "--out", "o"], "missing.tsv: no such file"),
    ],
)
def test_cli_bad_arguments_exit_2(tmp_path, monkeypatch, capsys, args, problem):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "prepare", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and problem in err and err.count("\n") == 1
