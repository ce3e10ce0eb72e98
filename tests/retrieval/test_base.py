"""Document rendering (byte-identical to Search-R1 and ZeroSearch), top-k selection and top_k validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simsearch.data.corpus import load_passages
from simsearch.data.rendering import RENDER_STYLES, RENDERERS, VERBATIM_STYLE, render_documents, wrap_information
from simsearch.errors import RecipeError
from simsearch.retrieval.base import check_top_k, select_top_k
from simsearch.simulator.recipe import SearchConfig
from simsearch.types import Document, SearchRequest

WIKI18 = Path(__file__).parents[1] / "data" / "fixtures" / "wiki18_sample.jsonl"

# The three fixture passages' texts, typed out (unicode dash U+2013, left quote U+201C, wiki-18's doubled quotes).
EVAN = (
    "Evan Morris Evan L. Morris (January 26, 1977 \u2013 July 9, 2015) was a lobbyist for Genentech and its parent "
    "corporation Roche in Washington, D.C. He began his career in Washington as an intern in the Clinton White House "
    "at age 18. He began his lobbying work at Patton Boggs before moving on to Roche in 2005. His early work at Roche "
    "involved government policy on Medicare and Medicaid, flu preparedness, and hepatitis C. His work at Genentech is "
    "being investigated by the Wall Street Journal, which states that \u201cshaping up to be one of the biggest U.S. "
    "investigations into"
)
PAVIA = (
    "on March 17, 1989. The cathedral was begun in 1488, under architect Cristoforo Rocchi, who was soon replaced by "
    "Giovanni Antonio Amadeo and Gian Giacomo Dolcebuono. The original project, with a nave and two aisles flanked by "
    "semicircular niches and a large central dome, was influenced by Bramante, some details of it later appearing in "
    "St. Peter's Basilica in Rome. Leonardo da Vinci is also known to have contributed to the project. In 1521, the "
    "altar area was completed by Gianpietrino Rizzi, a pupil of Da Vinci. By the 17th century, the presbytery had been "
    "completed but only in the"
)
ET = (
    "financial failure for Atari. By 2004, the cartridges were still very common and offered at very low prices. While "
    "reviews of the movie were highly positive, the game was negatively received by critics, with common complaints "
    'focused on the plot, gameplay, and visuals. ""New York"" magazine\'s Nicholas Pileggi described it as a loser '
    'when compared to other games Atari could have released like ""Donkey Kong"" and ""Frogger"". ""Video Games"" '
    "called the "
    'game ""really for kids (the littler ones)"". Kevin Bowen of GameSpy\'s Classic Gaming called the gameplay '
    '""convoluted and inane"", also criticizing its story for departing from the serious tone'
)


@pytest.fixture
def docs() -> list[Document]:
    return [Document(title=p.title, text=p.text, score=1.0, source="bm25", id=p.id) for p in load_passages(WIKI18)]


def test_search_r1_block_is_byte_identical(docs):
    expected = (
        'Doc 1(Title: "Evan Morris") ' + EVAN + "\n"
        'Doc 2(Title: "Pavia Cathedral") ' + PAVIA + "\n"
        'Doc 3(Title: "E.T. the Extra-Terrestrial (video game)") ' + ET + "\n"
    )
    block = render_documents(docs)
    assert block == expected
    assert block.encode("utf-8") == expected.encode("utf-8")


def test_search_r1_observation_is_byte_identical(docs):
    expected = (
        '\n\n<information>Doc 1(Title: "Evan Morris") ' + EVAN + "\n"
        'Doc 2(Title: "Pavia Cathedral") ' + PAVIA + "</information>\n\n"
    )
    assert wrap_information(render_documents(docs[:2])) == expected


def test_rendering_equals_search_r1_passages2string_on_contents(docs):
    # Search-R1 renders from the server's `contents`; our records must give the same bytes.
    reference = ""
    for idx, doc in enumerate(docs):
        content = f"{doc.title}\n{doc.text}"
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
    assert render_documents(docs) == reference


def test_title_with_newline_renders_as_through_a_search_r1_server():
    doc = Document(title="Line one\nline two", text="body")
    # contents "Line one\nline two\nbody": title is the first line, the rest is the text.
    assert render_documents([doc]) == "Doc 1(Title: Line one) line two\nbody\n"


def test_wrap_strips_surrounding_whitespace_only():
    assert wrap_information("  \n a\n\nb \n") == "\n\n<information>a\n\nb</information>\n\n"
    assert wrap_information(render_documents([])) == "\n\n<information></information>\n\n"


def test_plain_style():
    docs = [Document(title="A", text="alpha"), Document(title="B", text="beta\ngamma")]
    assert render_documents(docs, style="plain") == "A\nalpha\n\nB\nbeta\ngamma"
    assert (
        wrap_information(render_documents(docs, style="plain"))
        == "\n\n<information>A\nalpha\n\nB\nbeta\ngamma</information>\n\n"
    )


def test_brief_style_drops_titles_and_keeps_each_text_on_one_line():
    docs = [Document(title='"Roru"', text="Roru is a  glassblower.\nBorn in Gesmere."), Document("B", "beta")]
    assert render_documents(docs, style="brief") == "Doc 1: Roru is a glassblower. Born in Gesmere.\nDoc 2: beta\n"
    assert (
        wrap_information(render_documents(docs[1:], style="brief")) == "\n\n<information>Doc 1: beta</information>\n\n"
    )


def test_zerosearch_google_style_is_byte_identical_to_retrieve_from_google():
    # ZeroSearch llm_agent/generation.py:631-640: text_data = title + snippet (no separator, a missing
    # snippet adds nothing), lines "Doc {i+1}: {text_data}" joined by "\n"; the block is stripped and
    # wrapped at :524. Serper/SerpAPI documents carry the title in `title`, the snippet in `text`.
    docs = [
        Document(title="Eiffel Tower - Wikipedia", text="The tower is 330 metres tall.", source="serpapi"),
        Document(title="Paris – Britannica", text="", source="serpapi"),
    ]
    block = "Doc 1: Eiffel Tower - WikipediaThe tower is 330 metres tall.\nDoc 2: Paris – Britannica"
    assert render_documents(docs, style="zerosearch-google") == block
    assert (
        wrap_information(render_documents(docs, style="zerosearch-google"))
        == f"\n\n<information>{block}</information>\n\n"
    )
    assert render_documents([], style="zerosearch-google") == ""


def test_zerosearch_simulator_style_concatenates_the_texts_as_they_are():
    docs = [Document(title="", text=t) for t in ("Doc 1: a\n", "Doc 2: b\n\n", "")]
    assert render_documents(docs, style="zerosearch-simulator") == "Doc 1: a\nDoc 2: b\n\n"
    expected = "\n\n<information>Doc 1: a\nDoc 2: b</information>\n\n"
    assert wrap_information(render_documents(docs, style="zerosearch-simulator")) == expected


def test_every_style_is_a_recipe_choice():
    names = ("search-r1", "plain", "brief", "zerosearch-simulator", "zerosearch-google")
    assert RENDER_STYLES == tuple(RENDERERS) == names
    assert VERBATIM_STYLE in RENDER_STYLES


@pytest.mark.parametrize("kind", ["bm25", "serpapi", "http"])
def test_recipe_refuses_the_simulator_rendering_for_a_real_engine(kind):
    cfg = SearchConfig(kind=kind, corpus="c.jsonl", url="http://x/retrieve", rendering="zerosearch-simulator")
    with pytest.raises(RecipeError, match=r"search.rendering=zerosearch-simulator .* needs search.kind=simulator"):
        cfg.check("search")
    SearchConfig(kind=kind, corpus="c.jsonl", url="http://x/retrieve", rendering="zerosearch-google").check("search")


def test_unknown_style_is_an_error():
    with pytest.raises(ValueError, match="unknown render style 'markdown'"):
        render_documents([], style="markdown")  # type: ignore[arg-type]


def test_select_top_k_orders_by_score_then_position():
    scores = np.array([0.5, 2.0, 0.5, 3.0, 0.5, -1.0], dtype=np.float32)
    # 3.0 (pos 3), 2.0 (pos 1), then three ties at 0.5: positions 0, 2, 4 in that order.
    assert select_top_k(scores, 2).tolist() == [3, 1]
    assert select_top_k(scores, 4).tolist() == [3, 1, 0, 2]
    assert select_top_k(scores, 5).tolist() == [3, 1, 0, 2, 4]
    assert select_top_k(scores, 10).tolist() == [3, 1, 0, 2, 4, 5]
    assert select_top_k(np.zeros(0, dtype=np.float32), 3).tolist() == []


def test_check_top_k_names_the_bad_request():
    check_top_k([SearchRequest("a", top_k=1), SearchRequest("b", top_k=5)], corpus_size=5)
    with pytest.raises(
        ValueError, match=r"request 1 \(query 'b'\) has top_k=0; top_k must be between 1 and the corpus size, 5"
    ):
        check_top_k([SearchRequest("a", top_k=1), SearchRequest("b", top_k=0)], corpus_size=5)
    with pytest.raises(ValueError, match="has top_k=-2"):
        check_top_k([SearchRequest("a", top_k=-2)], corpus_size=5)
    with pytest.raises(ValueError, match="has top_k=6"):
        check_top_k([SearchRequest("a", top_k=6)], corpus_size=5)
