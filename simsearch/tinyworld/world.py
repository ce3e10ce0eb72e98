"""A seeded fictional world: entities, a corpus about them, and questions only search can answer.

Names are composed from syllables (no model knows them); only a query holding a question's
name finds its answer; noise passages hold wrong values of every relation; answers are short and
distinct across relations; test questions are about entities no training question mentions.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from simsearch.data.qa import write_qa_jsonl
from simsearch.types import Passage, QAExample

DATA_SOURCE = "tinyworld"
RELATIONS = ("birth_city", "occupation", "founding_year")
TWO_HOP = "founder_birth_city"
"""The two-hop relation (`build_world(two_hop_share=...)`): the birth city of a named venture's founder."""

# Syllables: onset + vowel + optional coda. People have one-word names of 2 syllables; cities add a suffix, so a
# city is never mistaken for a person.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "n", "r", "s")
_CITY_SUFFIXES = ("holm", "mar", "wick", "dale", "stead", "burg", "haven", "mere")

# One- or two-word occupations whose plural is a plain "s".
OCCUPATIONS = (
    "baker", "weaver", "potter", "tanner", "brewer", "miller", "tailor", "carpenter", "glassblower",
    "clockmaker", "bookbinder", "stonemason", "cartographer", "beekeeper", "shipwright", "locksmith",
    "jeweler", "astronomer", "herbalist", "lamplighter", "candlemaker", "ropemaker", "saddler",
    "engraver", "harpist", "salt trader", "tea merchant", "ship pilot", "street musician", "bee farmer",
)  # fmt: skip
VENTURES = (
    "rope works", "printing house", "ferry company", "music school", "tea house", "shipyard",
    "paper mill", "glass works", "trading company", "bank", "library", "theatre", "brewery",
    "observatory", "orchard", "hospital",
)  # fmt: skip
_ADJECTIVES = ("quiet", "busy", "windy", "old", "hilly", "walled", "foggy", "small", "sunny", "crowded")
_FEATURES = ("river", "lake", "sea", "mountains", "forest", "marsh", "coast", "hills")
_TEMPLATE_WORDS = {w for phrase in OCCUPATIONS + VENTURES + _ADJECTIVES + _FEATURES for w in phrase.split()}
_YEARS = (1600, 1899)  # inclusive range of every year in the world
YEARS: tuple[str, ...] = tuple(str(year) for year in range(_YEARS[0], _YEARS[1] + 1))
"""Every year the world's passages can hold, as written."""

# Passage and question templates; a few phrasings each so the policy cannot key on one wording.
_BIO = (
    "{name} was born in {city} and works as {occupation_a}.",
    "Born in {city}, {name} became {occupation_a} at a young age.",
    "{name} is {occupation_a} who was born in the town of {city}.",
)
_FOUNDING = (
    "{name} founded {venture_a} in {year}.",
    "In {year}, {name} founded {venture_a} that still exists today.",
    "{name} founded {venture_a} in the year {year} with the help of friends.",
)
# The founding passage of a person whose venture has a proper name (two-hop worlds only).
_FOUNDING_NAMED = (
    "{name} founded the {brand} {venture} in {year}.",
    "In {year}, {name} founded the {brand} {venture} that still exists today.",
    "The {brand} {venture} was founded by {name} in the year {year}.",
)
_VISIT = (
    "{name} once visited {city} in {year} to meet {occupation_a}.",
    "In {year}, {name} spent a winter in {city} working beside {occupation_a}.",
    "{name} travelled to {city} in {year} and stayed with {occupation_a}.",
)
_CITY = (
    "{city} is a {adjective} town near the {feature}. Its market first opened in {year}, and many "
    "{occupation}s live there.",
    "The {adjective} town of {city} lies by the {feature}. Its town hall was built in {year}; "
    "{occupation}s and farmers trade in its square.",
)
QUESTIONS = {
    "birth_city": (
        "Where was {name} born?",
        "In which city was {name} born?",
        "What is the birthplace of {name}?",
    ),
    "occupation": (
        "What is the occupation of {name}?",
        "What does {name} do for a living?",
        "What job does {name} have?",
    ),
    "founding_year": (
        "In what year did {name} found the {venture}?",
        "When did {name} found the {venture}?",
        "In which year was the {venture} of {name} founded?",
    ),
}
TWO_HOP_QUESTIONS = (
    "Where was the founder of the {brand} {venture} born?",
    "In which city was the founder of the {brand} {venture} born?",
    "What is the birthplace of the person who founded the {brand} {venture}?",
)


@dataclass(frozen=True)
class Entity:
    """A fictional person and their three facts."""

    name: str
    birth_city: str
    occupation: str
    founding_year: str  # the year, as the answer string
    venture: str  # what they founded, named in the founding question
    brand: str = ""  # the venture's proper name in a two-hop world ("Belsa"), else ""


@dataclass(frozen=True)
class Fact:
    """What a question asks: its entity, relation, answer and answer passage (a two-hop one: via `bridge`)."""

    entity: str
    relation: str  # one of RELATIONS, or TWO_HOP
    answer: str
    passage_id: str
    bridge: str = ""
    bridge_passage_id: str = ""

    @property
    def named(self) -> str:
        """The name the question holds: the bridge of a two-hop question, else the entity."""
        return self.bridge or self.entity


@dataclass
class World:
    """A generated world (`build_world`); `Passage.contents` is the corpus line, titles in double quotes."""

    seed: int
    entities: list[Entity]
    cities: list[str]
    passages: list[Passage]
    train: list[QAExample]
    test: list[QAExample]
    facts: dict[str, Fact]
    # Questions about the background entities (`build_world(n_background_entities=...)`): for
    # what is trained before RL (the base LM, the simulator), never for RL or evaluation.
    background: list[QAExample] = field(default_factory=list)
    two_hop_share: float = 0.0  # as built (`build_world`): 0 = no two-hop questions

    def write(self, directory: str | os.PathLike[str]) -> dict[str, Path]:
        """Writes `corpus.jsonl`, `train.jsonl`, `test.jsonl` (and `background.jsonl`) into `directory`.

        Returns their paths by those keys.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        names = ("corpus", "train", "test", "background") if self.background else ("corpus", "train", "test")
        paths = {name: directory / f"{name}.jsonl" for name in names}
        write_corpus(self.passages, paths["corpus"])
        write_qa_jsonl(self.train, paths["train"])
        write_qa_jsonl(self.test, paths["test"])
        if self.background:
            write_qa_jsonl(self.background, paths["background"])
        return paths

    def people(self, split: str) -> set[str]:
        """The names of the people asked about in `split`: train, test or background."""
        questions = {"train": self.train, "test": self.test, "background": self.background}[split]
        return {self.facts[q.id].entity for q in questions}

    def passages_without(self, names: set[str]) -> list[Passage]:
        """The corpus less every passage about one of `names` (a person's passages carry their name as title)."""
        return [p for p in self.passages if p.title.strip('"') not in names]

    def texts_for_tokenizer(self, n_texts: int = 2000, *, seed: int = 0) -> list[str]:
        """`n_texts` texts laid out as this world's search results, about fresh people and cities."""
        rng = random.Random(1_000_003 * self.seed + seed + 1)
        taken = {e.name for e in self.entities} | set(self.cities)
        cities = _unique_names(rng, 10 * len(self.cities), _city_name, taken)
        taken |= set(cities)
        names = _unique_names(rng, n_texts, _person_name, taken)
        texts = []
        for name in names:
            entity = _random_entity(rng, name, cities)
            other_city = rng.choice([c for c in cities if c != entity.birth_city])
            relation = rng.choice(RELATIONS)
            question = rng.choice(QUESTIONS[relation]).format(name=name, venture=entity.venture)
            passages = [
                _bio_text(rng, entity),
                _founding_text(rng, entity),
                _visit_text(rng, entity, other_city),
                _city_text(rng, rng.choice(cities)),
            ]
            rng.shuffle(passages)
            # Laid out as search results are shown to the models (`Doc i(Title: "name") text`),
            # so the tokenizer learns that scaffolding as a real LM's knows common markup.
            lines = [f'Doc {i}(Title: "{name}") {text}' for i, text in enumerate(passages, 1)]
            texts.append("\n".join([question, *lines]))
        if self.two_hop_share:
            texts += _two_hop_texts(random.Random(f"two-hop-texts-{self.seed}-{seed}"), n_texts // 4, cities, taken)
        return texts


def write_corpus(passages: list[Passage], path: str | os.PathLike[str]) -> Path:
    """Writes `passages` as a Search-R1 corpus (`{"id", "contents"}` JSON lines, UTF-8); returns the path."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for passage in passages:
            f.write(json.dumps({"id": passage.id, "contents": passage.contents}, ensure_ascii=False) + "\n")
    return path


def build_world(
    seed: int = 0,
    n_entities: int = 300,
    n_train_entities: int = 200,
    n_cities: int = 40,
    n_background_entities: int = 0,
    two_hop_share: float = 0.0,
) -> World:
    """Generates a world, deterministically for `seed`.

    Args:
        n_entities: People; each gets a biography, a founding passage, a visit passage (noise) and
            one question per relation.
        n_train_entities: People whose questions form `train`; the rest form `test`.
        n_cities: Cities, each with a description passage (noise).
        n_background_entities: Further people whose questions form `background`.
        two_hop_share: Share of each split's people who get a named venture and a two-hop question
            (`TWO_HOP`), drawn from its own random stream.

    Raises:
        ValueError: Sizes that leave a split empty or too few cities to tell apart.
    """
    _check_world_sizes(n_entities, n_train_entities, n_cities, n_background_entities)
    if not 0.0 <= two_hop_share <= 1.0:
        raise ValueError(f"two_hop_share={two_hop_share} must lie in [0, 1]")
    rng = random.Random(seed)
    cities = _unique_names(rng, n_cities, _city_name, set())
    names = _unique_names(rng, n_entities + n_background_entities, _person_name, set(cities))
    entities = [_random_entity(rng, name, cities) for name in names]
    bounds = {"train": (0, n_train_entities), "test": (n_train_entities, n_entities), "background": (n_entities, None)}
    # Its own stream, so the main one (every other passage, the order, the one-hop questions) stays as it was.
    two_hop_rng = random.Random(f"two-hop-{seed}")
    if two_hop_share:
        entities = _name_ventures(two_hop_rng, entities, bounds, two_hop_share, set(cities))
    passages, answer_passage = _write_corpus(rng, entities, cities)
    questions: dict[str, list[QAExample]] = {}
    facts: dict[str, Fact] = {}
    for split, (start, stop) in bounds.items():
        members = entities[start:stop]
        questions[split], split_facts = _ask_questions(rng, split, members, answer_passage)
        facts.update(split_facts)
        if two_hop_share:
            extra, extra_facts = _ask_two_hop(two_hop_rng, split, members, answer_passage, len(questions[split]))
            questions[split] += extra
            facts.update(extra_facts)
    return World(
        seed, entities, cities, passages, questions["train"], questions["test"], facts, questions["background"],
        two_hop_share,
    )  # fmt: skip


def _check_world_sizes(n_entities: int, n_train_entities: int, n_cities: int, n_background_entities: int) -> None:
    if not 0 < n_train_entities < n_entities:
        raise ValueError(
            f"n_train_entities={n_train_entities} must lie in [1, n_entities - 1] "
            f"(n_entities={n_entities}) so both train and test have questions"
        )
    if n_background_entities < 0:
        raise ValueError(f"n_background_entities={n_background_entities} must be >= 0")
    if n_cities < 2:
        raise ValueError(f"n_cities={n_cities} must be >= 2: a visit goes to a city other than the birth city")


def _write_corpus(
    rng: random.Random, entities: list[Entity], cities: list[str]
) -> tuple[list[Passage], dict[tuple[str, str], str]]:
    """The shuffled passages, and the id of the passage answering each (entity name, relation)."""
    # (entity, relation) -> index into `drafts` of the passage holding the answer
    drafts: list[tuple[str, str]] = []  # (title, text)
    holder: dict[tuple[str, str], int] = {}
    for entity in entities:
        holder[(entity.name, "birth_city")] = holder[(entity.name, "occupation")] = len(drafts)
        drafts.append((entity.name, _bio_text(rng, entity)))
        holder[(entity.name, "founding_year")] = len(drafts)
        drafts.append((entity.name, _founding_text(rng, entity)))
        other_city = rng.choice([c for c in cities if c != entity.birth_city])
        drafts.append((entity.name, _visit_text(rng, entity, other_city)))
    for city in cities:
        drafts.append((city, _city_text(rng, city)))

    # Shuffled so a retriever's tie-breaking by index cannot favour an entity's own passages.
    order = list(range(len(drafts)))
    rng.shuffle(order)
    passage_id = {old: str(new) for new, old in enumerate(order)}
    passages = [Passage(id=str(new), title=f'"{drafts[old][0]}"', text=drafts[old][1]) for new, old in enumerate(order)]
    return passages, {key: passage_id[index] for key, index in holder.items()}


def _ask_questions(
    rng: random.Random,
    split: str,
    members: list[Entity],
    answer_passage: dict[tuple[str, str], str],
) -> tuple[list[QAExample], dict[str, Fact]]:
    """One question per (member, relation), shuffled, ids `{split}_{i}`, and their facts."""
    asked = [(entity, relation) for entity in members for relation in RELATIONS]
    rng.shuffle(asked)
    questions = []
    facts: dict[str, Fact] = {}
    for i, (entity, relation) in enumerate(asked):
        qid = f"{split}_{i}"
        answer = _answer(entity, relation)
        text = rng.choice(QUESTIONS[relation]).format(name=entity.name, venture=entity.venture)
        questions.append(QAExample(id=qid, question=text, golden_answers=[answer], data_source=DATA_SOURCE))
        facts[qid] = Fact(entity.name, relation, answer, answer_passage[(entity.name, relation)])
    return questions, facts


def _name_ventures(
    rng: random.Random,
    entities: list[Entity],
    bounds: dict[str, tuple[int, int | None]],
    share: float,
    cities: set[str],
) -> list[Entity]:
    """The entities, the first round(share * size) of each split with a named venture."""
    named = [
        i for start, stop in bounds.values() for i in range(start, start + round(share * len(entities[start:stop])))
    ]
    brands = _unique_names(rng, len(named), _person_name, {e.name for e in entities} | cities)
    entities = list(entities)
    for i, brand in zip(named, brands):
        entities[i] = replace(entities[i], brand=brand)
    return entities


def _ask_two_hop(
    rng: random.Random,
    split: str,
    members: list[Entity],
    answer_passage: dict[tuple[str, str], str],
    first_id: int,
) -> tuple[list[QAExample], dict[str, Fact]]:
    """One two-hop question per member with a named venture, ids from `{split}_{first_id}` on."""
    questions = []
    facts: dict[str, Fact] = {}
    for i, entity in enumerate(e for e in members if e.brand):
        qid = f"{split}_{first_id + i}"
        text = rng.choice(TWO_HOP_QUESTIONS).format(brand=entity.brand, venture=entity.venture)
        questions.append(QAExample(id=qid, question=text, golden_answers=[entity.birth_city], data_source=DATA_SOURCE))
        facts[qid] = Fact(
            entity.name, TWO_HOP, entity.birth_city, answer_passage[(entity.name, "birth_city")],
            bridge=entity.brand, bridge_passage_id=answer_passage[(entity.name, "founding_year")],
        )  # fmt: skip
    return questions, facts


def _two_hop_texts(rng: random.Random, n: int, cities: list[str], taken: set[str]) -> list[str]:
    """Tokenizer texts for two-hop worlds, about a fresh person."""
    names = _unique_names(rng, 2 * n, _person_name, taken)
    texts = []
    for name, brand in zip(names[:n], names[n:]):
        entity = replace(_random_entity(rng, name, cities), brand=brand)
        question = rng.choice(TWO_HOP_QUESTIONS).format(brand=brand, venture=entity.venture)
        passages = [_founding_text(rng, entity), _bio_text(rng, entity)]
        lines = [f'Doc {i}(Title: "{name}") {text}' for i, text in enumerate(passages, 1)]
        texts.append("\n".join([question, *lines]))
    return texts


# --------------------------------------------------------------------------- generation


def _syllable(rng: random.Random) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)


def _person_name(rng: random.Random) -> str:
    # One word of two syllables: about three tokens for a tokenizer trained on other such names
    # (2-4), short enough for a tiny model to copy into a query. Never
    # ending like a city ("Somar"), so names and places stay apart.
    while True:
        name = (_syllable(rng) + _syllable(rng)).capitalize()
        if not name.endswith(_CITY_SUFFIXES):
            return name


def _city_name(rng: random.Random) -> str:
    return (_syllable(rng) + rng.choice(_CITY_SUFFIXES)).capitalize()


def _unique_names(rng: random.Random, n: int, make: Callable[[random.Random], str], taken: set[str]) -> list[str]:
    names: list[str] = []
    seen = set(taken)
    while len(names) < n:
        name = make(rng)
        # A name that is also a word of the templates ("Baker") would blur names and answers.
        if name not in seen and name.lower() not in _TEMPLATE_WORDS:
            seen.add(name)
            names.append(name)
    return names


def _random_entity(rng: random.Random, name: str, cities: list[str]) -> Entity:
    return Entity(
        name=name,
        birth_city=rng.choice(cities),
        occupation=rng.choice(OCCUPATIONS),
        founding_year=str(rng.randint(*_YEARS)),
        venture=rng.choice(VENTURES),
    )


def _answer(entity: Entity, relation: str) -> str:
    values = {"birth_city": entity.birth_city, "occupation": entity.occupation, "founding_year": entity.founding_year}
    return values[relation]


def _with_article(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _bio_text(rng: random.Random, entity: Entity) -> str:
    template = rng.choice(_BIO)
    return template.format(name=entity.name, city=entity.birth_city, occupation_a=_with_article(entity.occupation))


def _founding_text(rng: random.Random, entity: Entity) -> str:
    # As many templates either way, so a named venture draws as much randomness as a plain one.
    template = rng.choice(_FOUNDING_NAMED if entity.brand else _FOUNDING)
    return template.format(
        name=entity.name, venture_a=_with_article(entity.venture), venture=entity.venture, brand=entity.brand,
        year=entity.founding_year,
    )  # fmt: skip


def _visit_text(rng: random.Random, entity: Entity, city: str) -> str:
    # Every value here differs from the entity's own: a wrong answer that sits next to its name.
    year = entity.founding_year
    while year == entity.founding_year:
        year = str(rng.randint(*_YEARS))
    occupation = rng.choice([o for o in OCCUPATIONS if o != entity.occupation])
    return rng.choice(_VISIT).format(name=entity.name, city=city, year=year, occupation_a=_with_article(occupation))


def _city_text(rng: random.Random, city: str) -> str:
    return rng.choice(_CITY).format(
        city=city,
        adjective=rng.choice(_ADJECTIVES),
        feature=rng.choice(_FEATURES),
        year=rng.randint(*_YEARS),
        occupation=rng.choice(OCCUPATIONS),
    )
