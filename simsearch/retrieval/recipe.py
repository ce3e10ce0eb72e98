"""The names of the search engine kinds a recipe may pick (`search.kind`, `engines.NAME.kind`).

`factory.build.SEARCH_ENGINES` holds one builder for each (a test keeps the two equal). Adding an
engine kind is its name here and its builder there, plus any fields it needs on `SearchConfig`.
The section itself lives in `simulator.recipe`: it nests the simulator's section, and the simulator
package sits above this one.
"""

from __future__ import annotations

SEARCH_KINDS = (
    "bm25", "dense", "http", "serper", "serpapi", "simulator", "self", "empty", "random", "answerless", "oracle",
)  # fmt: skip
"""The search engine kinds (`SearchConfig.kind`), each built by `factory.build.SEARCH_ENGINES`; self = no engine."""
