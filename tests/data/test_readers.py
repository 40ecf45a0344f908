"""The readers accept each format (with BOMs and any line ends) and reject bad input with file:line."""

import json
import re

import pytest

from attnkit.data.readers.labeled import Example, read_labeled
from attnkit.data.readers.parallel import Pair, read_parallel_files, read_parallel_tsv
from attnkit.data.readers.texts import read_texts
from attnkit.errors import InputError


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def assert_rejects(read, path, line, problem):
    """``read(path)`` raises InputError whose message starts ``{path}:{line}:`` and mentions ``problem``."""
    with pytest.raises(InputError) as caught:
        read(path)
    message = str(caught.value)
    prefix = f"{path}:{line}:" if line is not None else f"{path}:"
    assert message.startswith(prefix), message
    assert re.search(problem, message), message


# ---------------------------------------------------------------------------------------------------------
# Accepted formats.


def test_tsv_round_trip_ignores_extra_columns_and_strips_fields(tmp_path):
    path = write(tmp_path, "a.tsv", 'id\tlabel\ttext\n1\tpos\t  good film \n2\t neg\tbad, "really" bad\n')
    assert read_labeled(path) == [Example("good film", "pos", 2), Example('bad, "really" bad', "neg", 3)]


def test_csv_quoted_commas_and_newlines_carry_the_line_where_the_record_starts(tmp_path):
    path = write(tmp_path, "a.csv", 'text,label\n"one, two",a\n"multi\nline ""quoted""",b\nlast,c\n')
    assert read_labeled(path) == [
        Example("one, two", "a", 2),
        Example('multi\nline "quoted"', "b", 3),
        Example("last", "c", 5),
    ]


def test_jsonl_labels_of_any_json_scalar_kind_become_strings(tmp_path):
    records = [{"text": "a", "label": "x"}, {"text": "b", "label": 3}, {"text": "c", "label": True, "id": 9}]
    body = "\n".join(json.dumps(r) for r in records[:2]) + "\n\n" + json.dumps(records[2]) + "\n"
    path = write(tmp_path, "a.jsonl", body)
    assert read_labeled(path) == [Example("a", "x", 1), Example("b", "3", 2), Example("c", "true", 4)]


@pytest.mark.parametrize(
    "name, body, first_line",
    [
        ("a.tsv", "text\tlabel\r\nhello\tpos\r\nworld\tneg\r\n", 2),
        ("a.csv", "text,label\r\nhello,pos\r\nworld,neg", 2),
        ("a.jsonl", '{"text": "hello", "label": "pos"}\r{"text": "world", "label": "neg"}\r', 1),
    ],
)
def test_bom_and_crlf_or_cr_line_ends_leave_no_trace(tmp_path, name, body, first_line):
    path = write(tmp_path, name, b"\xef\xbb\xbf" + body.encode("utf-8"))
    expected = [Example("hello", "pos", first_line), Example("world", "neg", first_line + 1)]
    assert read_labeled(path) == expected


def test_jsonl_escaped_carriage_returns_are_normalised(tmp_path):
    path = write(tmp_path, "a.jsonl", json.dumps({"text": "two\r\nlines\r", "label": "x\r"}) + "\n")
    assert read_labeled(path) == [Example("two\nlines", "x", 1)]


def test_read_texts_label_column_is_optional(tmp_path):
    tsv = write(tmp_path, "a.tsv", "text\nfirst\nsecond\n")
    jsonl = write(tmp_path, "a.jsonl", '{"text": "first"}\n{"text": "second", "label": 1.5}\n')
    csv_ = write(tmp_path, "a.csv", "label,text\nx,first\ny,second\n")
    for path in (tsv, jsonl, csv_):
        assert [text for text, _ in read_texts(path)] == ["first", "second"]
    assert read_texts(tsv) == [("first", 2), ("second", 3)]


def test_read_texts_txt_is_one_text_per_line(tmp_path):
    path = write(tmp_path, "a.txt", b"\xef\xbb\xbf first \r\nsecond\tpart\r\n")
    assert read_texts(path) == [("first", 1), ("second\tpart", 2)]


def test_parallel_tsv_skips_an_optional_header(tmp_path):
    with_header = write(tmp_path, "a.tsv", "source\ttarget\r\nHello .\tHallo .\r\nyes\t ja \r\n")
    without = write(tmp_path, "b.tsv", "Hello .\tHallo .\nyes\tja")
    assert read_parallel_tsv(with_header) == [Pair("Hello .", "Hallo .", 2), Pair("yes", "ja", 3)]
    assert read_parallel_tsv(without) == [Pair("Hello .", "Hallo .", 1), Pair("yes", "ja", 2)]


@pytest.mark.parametrize("header", ["Source\tTarget", "src\ttgt", "SRC \t TGT"])
def test_the_usual_spellings_of_a_parallel_header_are_headers_too(tmp_path, header):
    path = write(tmp_path, "a.tsv", f"{header}\nHello .\tHallo .\n")
    assert read_parallel_tsv(path) == [Pair("Hello .", "Hallo .", 2)]


def test_parallel_files_align_by_line(tmp_path):
    src = write(tmp_path, "a.en", b"\xef\xbb\xbfHello .\r\nyes\r\n")
    tgt = write(tmp_path, "a.de", "Hallo .\nja")
    assert read_parallel_files(src, tgt) == [Pair("Hello .", "Hallo .", 1), Pair("yes", "ja", 2)]


# ---------------------------------------------------------------------------------------------------------
# Rejections: each names the file and the line at fault.


def test_missing_file_directory_and_unknown_extension(tmp_path):
    assert_rejects(read_labeled, tmp_path / "nope.tsv", None, "no such file")
    directory = tmp_path / "dir.tsv"
    directory.mkdir()
    assert_rejects(read_labeled, directory, None, "directory")
    assert_rejects(read_parallel_tsv, directory, None, "directory")
    assert_rejects(read_labeled, write(tmp_path, "a.txt", "x\n"), None, r"\.tsv, \.csv, \.jsonl")
    assert_rejects(read_texts, write(tmp_path, "a.xlsx", "x\n"), None, r"\.tsv, \.csv, \.jsonl, \.txt")


@pytest.mark.parametrize("name", ["a.tsv", "a.csv", "a.jsonl"])
def test_empty_file(tmp_path, name):
    assert_rejects(read_labeled, write(tmp_path, name, b"\xef\xbb\xbf\r\n" if name == "a.jsonl" else ""), 1, "empty")


def test_empty_text_and_parallel_files(tmp_path):
    empty = write(tmp_path, "a.txt", "")
    assert_rejects(read_texts, empty, 1, "empty")
    assert_rejects(read_parallel_tsv, empty, 1, "empty")
    other = write(tmp_path, "b.txt", "x\n")
    with pytest.raises(InputError, match=re.escape(f"{empty}:1: file is empty")):
        read_parallel_files(other, empty)


@pytest.mark.parametrize("name, body", [("a.tsv", "text\tlabel\n"), ("a.csv", "text,label\r\n")])
def test_header_only(tmp_path, name, body):
    assert_rejects(read_labeled, write(tmp_path, name, body), 1, "only a header")


def test_parallel_header_only(tmp_path):
    assert_rejects(read_parallel_tsv, write(tmp_path, "a.tsv", "source\ttarget\n"), 1, "only a header")


@pytest.mark.parametrize(
    "name, body, line, problem",
    [
        ("a.tsv", "text\tlabel\ngood\tpos\nno label here\n", 3, "expected 2 tab-separated fields.*found 1"),
        ("a.tsv", "text\tlabel\ngood\tpos\tmore\n", 2, "found 3"),
        ("a.tsv", "text\tlabel\ngood\tpos\n\nbad\tneg\n", 3, "blank line"),
        ("a.csv", 'text,label\n"multi\nline",a\nonly-text\n', 4, "expected 2 comma-separated fields.*found 1"),
        ("a.csv", 'text,label\nok,a\n"never closed,b\nx,c\n', 3, "malformed CSV"),
        ("a.tsv", "text\tlabel\n  \tpos\n", 2, "empty text"),
        ("a.csv", "text,label\nok,a\n\t ,b\n", 3, "empty text"),
        ("a.tsv", "text\tlabel\nfine\tpos\nfine\t \n", 3, "empty label"),
        ("a.tsv", "label\tbody\npos\tx\n", 1, "no 'text' column.*label, body"),
        ("a.csv", "text,category\nx,a\n", 1, "no 'label' column"),
        ("a.tsv", "text\ttext\tlabel\nx\ty\tz\n", 1, "'text' appears 2 times"),
    ],
)
def test_table_rejections(tmp_path, name, body, line, problem):
    assert_rejects(read_labeled, write(tmp_path, name, body), line, problem)


@pytest.mark.parametrize(
    "body, line, problem",
    [
        ('{"text": "a", "label": "x"}\n{"text": "b", label: "y"}\n', 2, "invalid JSON"),
        ('{"text": "a", "label": "x"}\n\n["b", "y"]\n', 3, "expected a JSON object, found array"),
        ('{"label": "x"}\n', 1, "missing key 'text'"),
        ('{"text": 5, "label": "x"}\n', 1, "'text' must be a string, found number"),
        ('{"text": "a"}\n', 1, "missing key 'label'"),
        ('{"text": "a", "label": 0.5}\n', 1, "'label' must be a string, integer or boolean, found number"),
        ('{"text": "a", "label": null}\n', 1, "found null"),
        ('{"text": "a", "label": "x"}\n{"text": " ", "label": "y"}\n', 2, "empty text"),
        ('{"text": "a", "label": ""}\n', 1, "empty label"),
    ],
)
def test_jsonl_rejections(tmp_path, body, line, problem):
    assert_rejects(read_labeled, write(tmp_path, "a.jsonl", body), line, problem)


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_non_utf8_bytes_are_reported_at_their_line(tmp_path, line_end):
    body = line_end.join([b"text\tlabel", b"fine\tpos", "caf\u00e9".encode("latin-1") + b"\tneg", b""])
    assert_rejects(read_labeled, write(tmp_path, "a.tsv", body), 3, "not valid UTF-8.*e9")
    assert_rejects(read_texts, write(tmp_path, "a.txt", b"ok\nok\nok\n\xff\n"), 4, "UTF-8")


def test_blank_lines_at_the_end_of_a_table_are_no_rows_and_between_rows_an_error_at_the_first(tmp_path):
    """An editor's trailing newlines were refused ("a.tsv:4: blank line"); two blank lines between rows name the
    first."""
    table = "text\tlabel\ngood\tpos\nbad\tneg\n\n  \n"
    assert [(ex.text, ex.line) for ex in read_labeled(write(tmp_path, "a.tsv", table))] == [("good", 2), ("bad", 3)]
    assert len(read_labeled(write(tmp_path, "a.csv", "text,label\ngood,pos\n\n\n"))) == 1
    assert [p.line for p in read_parallel_tsv(write(tmp_path, "p.tsv", "a\tb\nc\td\n\n\r\n"))] == [1, 2]
    assert_rejects(read_labeled, write(tmp_path, "a.tsv", "text\tlabel\ngood\tpos\n\n\nbad\tneg\n"), 3, "blank line")
    assert_rejects(read_parallel_tsv, write(tmp_path, "p.tsv", "a\tb\n\n\nc\td\n"), 2, "blank line")
    assert_rejects(read_parallel_tsv, write(tmp_path, "p.tsv", "source\ttarget\n\n"), 1, "only a header")


def test_txt_blank_line(tmp_path):
    assert_rejects(read_texts, write(tmp_path, "a.txt", "one\n  \nthree\n"), 2, "blank line")


@pytest.mark.parametrize(
    "body, line, problem",
    [
        ("source\ttarget\nHello\tHallo\nno tab here\n", 3, "no tab"),
        ("a\tb\na\tb\tc\n", 2, "2 tabs"),
        ("a\tb\n\t b\n", 2, "empty source"),
        ("a\tb\r\nc\t\r\n", 2, "empty target"),
        ("a\tb\n\nc\td\n", 2, "blank line"),
    ],
)
def test_parallel_tsv_rejections(tmp_path, body, line, problem):
    assert_rejects(read_parallel_tsv, write(tmp_path, "a.tsv", body), line, problem)


def test_parallel_files_with_different_line_counts_name_both_files_and_counts(tmp_path):
    src = write(tmp_path, "a.en", "one\ntwo\nthree\n")
    tgt = write(tmp_path, "a.de", "eins\nzwei\n")
    with pytest.raises(InputError) as caught:
        read_parallel_files(src, tgt)
    assert f"{src} has 3 lines" in str(caught.value) and f"{tgt} has 2" in str(caught.value)


def test_parallel_files_blank_line_names_the_file_it_is_in(tmp_path):
    src = write(tmp_path, "a.en", "one\ntwo\n")
    tgt = write(tmp_path, "a.de", "eins\n \n")
    assert_rejects(lambda path: read_parallel_files(src, path), tgt, 2, "blank line")
