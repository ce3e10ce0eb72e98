"""What a tiny-world policy can do before RL: how its queries name the person, how well it reads results."""

from __future__ import annotations

import pytest

from simsearch.tinyworld.diagnostics import query_naming, score_reading
from simsearch.tinyworld.world import YEARS
from simsearch.types import Document, QAExample


@pytest.mark.parametrize(
    ("query", "kind"),
    [
        (" Konis What ", "exact"),
        ("where was Konis born", "exact"),
        (" Konbe What ", "miscopied"),  # the first syllable copied, the rest invented
        ("Konisis", "miscopied"),  # the name inside a longer word is not the name
        ("where born", "unnamed"),
        ("", "unnamed"),
        ("Kobe", "unnamed"),  # two letters in common are not a copy
    ],
)
def test_query_naming_sorts_queries_by_how_they_name_the_person(query: str, kind: str) -> None:
    assert query_naming(query, "Konis") == kind


def test_score_reading_tells_copied_invented_and_right_answers(world) -> None:
    by_relation = {}
    for example in world.train:
        by_relation.setdefault(world.facts[example.id].relation, example)
    city, year = by_relation["birth_city"], by_relation["founding_year"]
    passages = {p.id: p for p in world.passages}

    def stated(example: QAExample) -> list[Document]:  # the passage that states the answer, alone
        passage = passages[world.facts[example.id].passage_id]
        return [Document(title=passage.title, text=passage.text)]

    absent_year = next(y for y in YEARS if y not in stated(year)[0].text)
    other_city = next(c for c in world.cities if c not in stated(city)[0].text)
    reading = score_reading(
        world,
        [city, city, year, year],
        [stated(city), stated(city), stated(year), stated(year)],
        [
            f"<answer> {city.golden_answers[0]} </answer>",  # right, copied from the results
            f"<answer> {other_city} </answer>",  # a city, found nowhere in the results
            f"<answer> {absent_year} </answer>",  # a year, found nowhere in the results
            "<answer> the printing house </answer>",  # not a value of the asked kind
        ],
    )
    assert reading["birth_city"] == {"copied": 0.5, "invented": 0.5, "right": 0.5, "questions": 2}
    assert reading["founding_year"] == {"copied": 0.0, "invented": 0.5, "right": 0.0, "questions": 2}
    assert reading["all"] == {"copied": 0.25, "invented": 0.5, "right": 0.25, "questions": 4}
