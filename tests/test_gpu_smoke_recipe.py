"""benchmarks/gpu_smoke.sh writes its training recipe inline: that recipe must load on CPU too."""

from __future__ import annotations

from pathlib import Path

import pytest

from simsearch.config import TrainRecipe, load_recipe

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_smoke.sh"


@pytest.mark.parametrize(("kind", "tis_cap"), [("hf", "0.0"), ("vllm", "2.0")])
def test_the_inline_recipe_loads(tmp_path: Path, kind: str, tis_cap: str) -> None:
    text = SCRIPT.read_text()
    body = text.split('cat > "$RUN/smoke.yaml" <<EOF\n', 1)[1].split("\nEOF\n", 1)[0]
    values = {"$RUN": str(tmp_path), "$MODEL": "Qwen/Qwen2.5-0.5B-Instruct", "$POLICY_KIND": kind,
              "$STEPS": "3", "$TIS_CAP": tis_cap}  # fmt: skip
    for name in sorted(values, key=len, reverse=True):  # $RUN before a shorter prefix could match
        body = body.replace(name, values[name])
    assert "$" not in body, "a shell variable of the recipe is not substituted here"
    (tmp_path / "smoke.yaml").write_text(body)
    recipe = load_recipe(TrainRecipe, tmp_path / "smoke.yaml")
    assert recipe.policy.kind == kind and recipe.algorithm.tis_cap == float(tis_cap) and recipe.steps == 3
