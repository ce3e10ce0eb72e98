"""Corpus reading: both row formats, the wiki-18 title/text split, errors, random access, fingerprints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simsearch.data.corpus import (
    CorpusFormatError,
    JsonlCorpus,
    check_fingerprint,
    corpus_fingerprint,
    iter_passages,
    load_passages,
    parse_passage,
)
from simsearch.types import Passage

# Three lines of Search-R1's example wiki-18 corpus (ids 0, 4, 7), copied verbatim.
WIKI18 = Path(__file__).parent / "fixtures" / "wiki18_sample.jsonl"


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_wiki18_rows_keep_quoted_title_and_unicode_text():
    passages = load_passages(WIKI18)
    assert [p.id for p in passages] == ["0", "4", "7"]
    assert [p.title for p in passages] == [
        '"Evan Morris"',
        '"Pavia Cathedral"',
        '"E.T. the Extra-Terrestrial (video game)"',
    ]
    evan = passages[0]
    assert evan.text.startswith("Evan Morris Evan L. Morris (January 26, 1977 \u2013 July 9, 2015) was a lobbyist")
    assert evan.text.endswith("which states that \u201cshaping up to be one of the biggest U.S. investigations into")
    # wiki-18's doubled quotes survive untouched.
    assert '""New York"" magazine' in passages[2].text


def test_contents_round_trips_through_passage():
    rows = [json.loads(line) for line in WIKI18.read_text(encoding="utf-8").splitlines()]
    assert [p.contents for p in load_passages(WIKI18)] == [row["contents"] for row in rows]


@pytest.mark.parametrize(
    ("contents", "title", "text"),
    [
        ('"T"\nline one\nline two', '"T"', "line one\nline two"),  # rest joined with "\n", as Search-R1
        ("only a title", "only a title", ""),
        ('"T"\n', '"T"', ""),
        ('"T"\n\ntext after a blank line', '"T"', "\ntext after a blank line"),
    ],
)
def test_wiki18_split_matches_search_r1(contents, title, text):
    p = parse_passage(json.dumps({"id": "x", "contents": contents}), path="c.jsonl", line_no=1)
    assert (p.title, p.text) == (title, text)
    # Search-R1's own split, for the record.
    assert (contents.split("\n")[0], "\n".join(contents.split("\n")[1:])) == (title, text)


def test_title_text_rows_and_integer_ids():
    p = parse_passage('{"id": 5, "title": "Paris", "text": "Capital of France."}', path="c.jsonl", line_no=1)
    assert p == Passage(id="5", title="Paris", text="Capital of France.")


def test_contents_wins_over_title_and_text():
    p = parse_passage('{"id": "1", "contents": "A\\nB", "title": "X", "text": "Y"}', path="c.jsonl", line_no=1)
    assert (p.title, p.text) == ("A", "B")


def test_blank_lines_are_skipped(tmp_path):
    path = write_lines(
        tmp_path / "c.jsonl", ['{"id": "a", "contents": "A\\nx"}', "", "   ", '{"id": "b", "title": "B", "text": "y"}']
    )
    assert [p.id for p in iter_passages(path)] == ["a", "b"]


def test_missing_file_fails_at_the_call(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"corpus file not found: .*nope.jsonl"):
        iter_passages(tmp_path / "nope.jsonl")  # not iterated: the check must not wait for next()
    with pytest.raises(FileNotFoundError):
        JsonlCorpus(tmp_path / "nope.jsonl")


def test_gzip_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "wiki-18.jsonl.gz"
    path.write_bytes(b"\x1f\x8b")
    with pytest.raises(CorpusFormatError, match="gzip -dk"):
        load_passages(path)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"id": "b", "contents": ', r"c\.jsonl:3: malformed JSON"),
        ('["b", "contents"]', r"c\.jsonl:3: expected a JSON object, got list"),
        ('{"contents": "B\\ny"}', r"c\.jsonl:3: missing key 'id'"),
        ('{"id": "b", "title": "B"}', r"c\.jsonl:3: missing key 'contents' \(or 'text'"),
        ('{"id": "b", "text": "y"}', r"c\.jsonl:3: missing key 'contents' \(or 'title'"),
        ('{"id": "b", "contents": 7}', r"c\.jsonl:3: key 'contents' must be a string, got int"),
        ('{"id": null, "contents": "B"}', r"c\.jsonl:3: key 'id' must be a string or an integer, got NoneType"),
        ('{"id": true, "contents": "B"}', r"c\.jsonl:3: key 'id' must be a string or an integer, got bool"),
    ],
)
def test_malformed_rows_name_file_line_and_key(tmp_path, bad_line, message):
    # Line 2 is blank, so the bad row is on line 3 although it is the second passage.
    path = write_lines(tmp_path / "c.jsonl", ['{"id": "a", "contents": "A\\nx"}', "", bad_line])
    with pytest.raises(CorpusFormatError, match=message):
        load_passages(path)


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "a", "contents": "A\\nx"}\n{"id": "b", "contents": "\xff"}\n')
    with pytest.raises(CorpusFormatError, match=r"c\.jsonl:2: not valid UTF-8"):
        load_passages(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_corpus_is_an_error(tmp_path, content):
    path = tmp_path / "c.jsonl"
    path.write_text(content)
    with pytest.raises(CorpusFormatError, match="empty corpus"):
        load_passages(path)
    with pytest.raises(CorpusFormatError, match="empty corpus"):
        JsonlCorpus(path)


def test_jsonl_corpus_random_access_matches_streaming(tmp_path):
    path = write_lines(
        tmp_path / "c.jsonl",
        [*WIKI18.read_text(encoding="utf-8").splitlines(), "", '{"id": "z", "title": "Z", "text": "last"}'],
    )
    corpus = JsonlCorpus(path)
    expected = load_passages(path)
    assert len(corpus) == 4
    assert [corpus[i] for i in range(4)] == expected
    assert corpus[-1] == Passage(id="z", title="Z", text="last")
    assert corpus[1:3] == expected[1:3]
    assert list(corpus) == expected
    with pytest.raises(IndexError):
        corpus[4]
    corpus.close()


def test_jsonl_corpus_reports_bad_line_number_on_access(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", ['{"id": "a", "contents": "A"}', "", '{"id": "b"}'])
    corpus = JsonlCorpus(path)  # opening only indexes offsets
    assert corpus[0].id == "a"
    with pytest.raises(CorpusFormatError, match=r"c\.jsonl:3: missing key 'contents'"):
        corpus[1]


def test_fingerprint_same_for_list_and_file_and_detects_changes(tmp_path):
    passages = load_passages(WIKI18)
    fp = corpus_fingerprint(passages)
    assert fp == corpus_fingerprint(JsonlCorpus(WIKI18))
    assert fp["num_passages"] == 3
    edited = [passages[0], Passage(passages[1].id, passages[1].title, passages[1].text + "!"), passages[2]]
    assert corpus_fingerprint(edited) != fp
    assert corpus_fingerprint([passages[1], passages[0], passages[2]]) != fp  # order matters
    assert corpus_fingerprint(passages[:2])["num_passages"] == 2


def test_check_fingerprint_explains_the_mismatch():
    passages = load_passages(WIKI18)
    fp = corpus_fingerprint(passages)
    check_fingerprint(fp, passages, index_dir="idx", corpus="c.jsonl")  # the same corpus passes
    with pytest.raises(
        ValueError,
        match=r"index in idx was built for another corpus than c\.jsonl: it was built for 3 passages, c\.jsonl has 2",
    ):
        check_fingerprint(fp, passages[:2], index_dir="idx", corpus="c.jsonl")
    with pytest.raises(ValueError, match=r"same size .3 passages. but different passages or order"):
        check_fingerprint(fp, passages[::-1], index_dir="idx", corpus="c.jsonl")
