"""Recipes fail before any work starts, naming the file and the key."""

from pathlib import Path

import pytest
import yaml

from simsearch.config import (
    CollectRecipe,
    EvalRecipe,
    FinetuneRecipe,
    ServeRecipe,
    TrainRecipe,
    load_recipe,
    save_recipe,
)
from simsearch.errors import RecipeError


def _write(tmp_path: Path, body: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.fixture
def train_yaml(tmp_path: Path) -> Path:
    return _write(
        tmp_path,
        {
            "run_dir": str(tmp_path / "run"),
            "policy": {"model": {"path": "models/tiny"}},
            "data": {"train": ["train.jsonl"]},
            "search": {"kind": "bm25", "corpus": "corpus.jsonl", "top_k": 3},
            "rollout": {"group_size": 4},
            "prompts_per_step": 8,
        },
    )


def test_valid_recipe_loads_into_typed_dataclasses(train_yaml: Path) -> None:
    recipe = load_recipe(TrainRecipe, train_yaml, ["steps=7", "search.top_k=5"])
    assert isinstance(recipe, TrainRecipe)
    assert recipe.steps == 7 and recipe.search.top_k == 5
    assert recipe.rollout.group_size == 4 and recipe.policy.model.path == "models/tiny"


def test_unknown_key_names_file_and_key(train_yaml: Path) -> None:
    with pytest.raises(RecipeError, match=r"recipe\.yaml: key rollout\.max_turn\b"):
        load_recipe(TrainRecipe, train_yaml, ["rollout.max_turn=3"])


def test_wrong_type_names_key(train_yaml: Path) -> None:
    with pytest.raises(RecipeError, match=r"key steps: .*'abc'"):
        load_recipe(TrainRecipe, train_yaml, ["steps=abc"])


def test_missing_required_value(tmp_path: Path) -> None:
    path = _write(tmp_path, {"policy": {"model": {"path": "m"}}, "data": {"train": ["t"]}, "search": {"corpus": "c"}})
    with pytest.raises(RecipeError, match=r"missing required value\(s\) run_dir"):
        load_recipe(TrainRecipe, path)


def test_negative_loss_weights_are_refused_not_read_as_off(train_yaml: Path) -> None:
    for name in ("kl_coef", "entropy_coef", "value_coef"):
        with pytest.raises(RecipeError, match=rf"algorithm\.{name}=-0\.01 must be >= 0"):
            load_recipe(TrainRecipe, train_yaml, [f"algorithm.{name}=-0.01"])
        assert getattr(load_recipe(TrainRecipe, train_yaml, [f"algorithm.{name}=0"]).algorithm, name) == 0


def test_group_size_must_divide_the_minibatch(train_yaml: Path) -> None:
    # 8 prompts x 4 rollouts = 32 trajectories; 12 does not divide 32.
    with pytest.raises(RecipeError, match=r"minibatch_size=12 must divide .* = 32"):
        load_recipe(TrainRecipe, train_yaml, ["algorithm.minibatch_size=12"])
    assert load_recipe(TrainRecipe, train_yaml, ["algorithm.minibatch_size=16"]).algorithm.minibatch_size == 16


def test_invalid_choice_names_the_nested_key(train_yaml: Path) -> None:
    with pytest.raises(RecipeError, match=r"curriculum\.kind='zigzag' is not one of"):
        load_recipe(TrainRecipe, train_yaml, ["curriculum.kind=zigzag"])
    with pytest.raises(RecipeError, match=r"curriculum\.p_end=1\.5 must lie in"):
        load_recipe(TrainRecipe, train_yaml, ["curriculum.p_end=1.5"])


def test_the_rollout_section_is_checked_with_the_recipe(train_yaml: Path) -> None:
    refused = {
        r"rollout\.template='rag' is not one of": ["rollout.template=rag"],
        r"rollout\.template='direct' is not one of": ["rollout.template=direct"],  # eval's baseline only
        r"rollout\.protocol='xml' is not one of": ["rollout.protocol=xml"],
        r"rollout\.tool_format='mistral' is not one of": ["rollout.tool_format=mistral"],
        r"rollout\.max_turns=-1 must be >= 0": ["rollout.max_turns=-1"],
        r"rollout\.max_obs_tokens=0 must be": ["rollout.max_obs_tokens=0"],
        r"rollout\.chat_template_kwargs apply to rollout\.protocol=tool-call": [
            "rollout.chat_template_kwargs={enable_thinking: false}"
        ],
        r"rollout\.max_context_tokens=0 must be": ["rollout.max_context_tokens=0"],
        r"rollout\.self_search_real_share=1\.5 must lie in": ["rollout.self_search_real_share=1.5"],
        r"rollout\.self_search_real_share=0\.5 only applies to rollout\.template=self-search": [
            "rollout.self_search_real_share=0.5"
        ],
    }
    for message, overrides in refused.items():
        with pytest.raises(RecipeError, match=message):
            load_recipe(TrainRecipe, train_yaml, overrides)


def test_engine_needs_what_it_uses(train_yaml: Path) -> None:
    with pytest.raises(RecipeError, match=r"search\.simulator\.generation\.model\.path"):
        load_recipe(TrainRecipe, train_yaml, ["search.kind=simulator"])
    with pytest.raises(RecipeError, match=r"search\.kind=http needs search\.url"):
        load_recipe(TrainRecipe, train_yaml, ["search.kind=http"])


def test_grpo_needs_groups(train_yaml: Path) -> None:
    with pytest.raises(RecipeError, match="group_size >= 2"):
        load_recipe(TrainRecipe, train_yaml, ["rollout.group_size=1"])
    recipe = load_recipe(TrainRecipe, train_yaml, ["rollout.group_size=1", "algorithm.estimator=reinforce"])
    assert recipe.algorithm.estimator == "reinforce"


def test_missing_file_and_bad_override(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"nope\.yaml: recipe file not found"):
        load_recipe(TrainRecipe, tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match=r"override 'steps' is not key=value"):
        load_recipe(ServeRecipe, None, ["steps"])


def test_eval_engines_are_checked_by_name(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {
            "run_dir": "r",
            "policy": {"model": {"path": "m"}},
            "datasets": [{"name": "nq", "path": "nq.jsonl"}],
            "engines": {"bm25": {"kind": "bm25"}},
        },
    )
    with pytest.raises(RecipeError, match=r"engines\.bm25\.kind=bm25 needs engines\.bm25\.corpus"):
        load_recipe(EvalRecipe, path)


def test_resolved_recipe_round_trips(train_yaml: Path, tmp_path: Path) -> None:
    recipe = load_recipe(TrainRecipe, train_yaml, ["steps=3"])
    saved = save_recipe(recipe, tmp_path / "run")
    assert load_recipe(TrainRecipe, saved) == recipe


def test_finetune_requires_a_model(tmp_path: Path) -> None:
    path = _write(tmp_path, {"run_dir": "r", "train_file": "pairs.jsonl"})
    with pytest.raises(RecipeError, match=r"model\.path is empty"):
        load_recipe(FinetuneRecipe, path)


def test_reward_weights_replace_the_default(train_yaml: Path) -> None:
    recipe = load_recipe(TrainRecipe, train_yaml, ["reward.weights={em: 0.9, format: 0.1}"])
    assert recipe.reward.resolved_weights() == {"em": 0.9, "format": 0.1}  # no f1 merged in
    default = load_recipe(TrainRecipe, train_yaml).reward
    assert default.weights == {}  # checking the recipe leaves it as written
    assert default.resolved_weights() == {"f1": 1.0}  # ZeroSearch's default


def test_policies_the_trainer_cannot_update_are_refused_with_the_recipe(train_yaml: Path) -> None:
    with pytest.raises(RecipeError, match=r"policy.model.adapter: merge the adapter into the base model"):
        load_recipe(TrainRecipe, train_yaml, ["policy.model.adapter=some/adapter"])
    with pytest.raises(RecipeError, match=r"model.adapter='a': fine-tuning on top of an adapter is not supported"):
        load_recipe(FinetuneRecipe, None, ["run_dir=r", "train_file=p.jsonl", "model.path=m", "model.adapter=a"])


def test_eval_rows_are_checked_with_the_recipe(tmp_path: Path) -> None:
    path = _write(tmp_path, {"run_dir": "r", "policy": {"model": {"path": "m"}},
                             "datasets": [{"name": "nq", "path": "nq.jsonl"}],
                             "engines": {"bm25": {"kind": "bm25", "corpus": "c.jsonl"}}})  # fmt: skip
    assert load_recipe(EvalRecipe, path).engines["bm25"].kind == "bm25"
    refused = {
        r"policy.kind=openai needs policy.model.path \(the policy's tokenizer": [
            "policy.kind=openai",
            "policy.model.path=''",
            "policy.base_urls=[http://h:1]",
        ],
        r"engines.b/m: use letters, digits": ["engines={'b/m': {kind: bm25, corpus: c.jsonl}}"],
        r"datasets: name 'n q': use letters": ["datasets=[{name: 'n q', path: a}]"],
        r"datasets: name 'nq' is used twice": ["datasets=[{name: nq, path: a}, {name: nq, path: b}]"],
        r"engines.bm25.kind=self needs rollout.template=self-search": ["engines.bm25.kind=self"],
        r"rag_engine='own' is kind=self; the RAG baseline needs a retriever": [
            "engines={own: {kind: self}}",
            "rag_engine=own",
            "rollout.template=self-search",
            "baselines=[rag]",
        ],
    }
    for message, overrides in refused.items():
        with pytest.raises(RecipeError, match=message):
            load_recipe(EvalRecipe, path, overrides)


def test_answer_weight_and_hidden_question_are_checked(train_yaml: Path, tmp_path: Path) -> None:
    (tmp_path / "ft").mkdir()
    finetune = _write(tmp_path / "ft", {"run_dir": "r", "train_file": "pairs.jsonl", "model": {"path": "m"}})
    assert load_recipe(FinetuneRecipe, finetune, ["answer_loss_weight=10"]).answer_loss_weight == 10.0
    with pytest.raises(RecipeError, match=r"answer_loss_weight=0.5 must be >= 1"):
        load_recipe(FinetuneRecipe, finetune, ["answer_loss_weight=0.5"])
    simulator = [
        "search.kind=simulator", "search.simulator.generation.model.path=m", "search.simulator.preset=zerosearch",
        "search.simulator.chat=true", "search.simulator.show_question=false",
    ]  # fmt: skip
    with pytest.raises(RecipeError, match=r"search\.simulator\.show_question=false: preset=zerosearch always shows"):
        load_recipe(TrainRecipe, train_yaml, simulator)
    with pytest.raises(RecipeError, match=r"search\.simulator\.show_answer=false: preset=zerosearch always shows"):
        load_recipe(TrainRecipe, train_yaml, [*simulator[:-1], "search.simulator.show_answer=false"])
    brief = load_recipe(
        TrainRecipe,
        train_yaml,
        [
            *simulator[:2],
            "search.simulator.preset=simsearch-brief",
            "search.simulator.show_question=false",
        ],
    )
    assert brief.search.simulator.preset == "simsearch-brief" and brief.search.simulator.show_question is False
    shown = load_recipe(TrainRecipe, train_yaml, simulator[:-1])
    assert shown.search.simulator.show_question is True and shown.search.simulator.show_answer is True


def test_the_simulators_sampling_is_checked_before_any_work(train_yaml: Path) -> None:
    simulator = ["search.kind=simulator", "search.simulator.generation.model.path=models/sim"]
    with pytest.raises(RecipeError, match=r"search\.simulator\.temperature=2\.5 must be 0 \(greedy\) or lie in"):
        load_recipe(TrainRecipe, train_yaml, [*simulator, "search.simulator.temperature=2.5"])
    with pytest.raises(RecipeError, match=r"search\.simulator\.max_new_tokens"):
        load_recipe(TrainRecipe, train_yaml, [*simulator, "search.simulator.max_new_tokens=0"])
    load_recipe(TrainRecipe, train_yaml, [*simulator, "search.simulator.temperature=0.8"])
    with pytest.raises(RecipeError, match=r"search\.simulator\.noisy_answers='drop' is not one of keep, redact"):
        load_recipe(TrainRecipe, train_yaml, [*simulator, "search.simulator.noisy_answers=drop"])


def test_a_preset_that_needs_templates_names_the_missing_ones(train_yaml: Path) -> None:
    simulator = ["search.kind=simulator", "search.simulator.generation.model.path=models/sim"]
    custom = [*simulator, "search.simulator.preset=custom", "search.simulator.useful_template='Doc: {query}'"]
    with pytest.raises(RecipeError, match=r"preset=custom needs both search\.simulator\.useful_template and"):
        load_recipe(TrainRecipe, train_yaml, custom)
    load_recipe(TrainRecipe, train_yaml, [*custom, "search.simulator.noisy_template='noisy: {query}'"])


def test_collect_refuses_self_search(tmp_path: Path) -> None:
    body = {
        "run_dir": str(tmp_path / "run"),
        "policy": {"model": {"path": "models/tiny"}},
        "data": {"train": ["train.jsonl"]},
        "search": {"kind": "self"},
    }
    with pytest.raises(RecipeError, match=r"search\.kind=self: collect records what a search engine returns"):
        load_recipe(CollectRecipe, _write(tmp_path, body))


def test_overlong_buffer_must_leave_room_below_the_context(train_yaml: Path) -> None:
    with pytest.raises(RecipeError, match=r"reward\.overlong_buffer=4096 .* rollout\.max_context_tokens=4096"):
        load_recipe(TrainRecipe, train_yaml, ["reward.overlong_buffer=4096"])
    with pytest.raises(RecipeError, match=r"reward\.overlong_buffer=300 .* rollout\.max_context_tokens=200"):
        load_recipe(TrainRecipe, train_yaml, ["reward.overlong_buffer=300", "rollout.max_context_tokens=200"])
    recipe = load_recipe(TrainRecipe, train_yaml, ["reward.overlong_buffer=4095"])
    assert recipe.reward.overlong_buffer == 4095


def test_dynamic_sampling_only_where_a_flat_group_carries_no_gradient(train_yaml: Path) -> None:
    on = "algorithm.dynamic_sampling=true"
    for estimator in ("grpo", "dr_grpo", "rloo", "stratified_grpo"):
        assert load_recipe(TrainRecipe, train_yaml, [on, f"algorithm.estimator={estimator}"]).algorithm.dynamic_sampling
    for estimator in ("ppo", "reinforce", "reinforce_pp", "reinforce_baseline"):
        with pytest.raises(RecipeError, match=rf"estimator={estimator}: it has no group baseline"):
            load_recipe(TrainRecipe, train_yaml, [on, f"algorithm.estimator={estimator}"])
    with pytest.raises(RecipeError, match=r"estimator=igpo: .* information gains"):
        load_recipe(TrainRecipe, train_yaml, [on, "algorithm.estimator=igpo"])
    for estimator in ("grpo", "reinforce"):
        with pytest.raises(RecipeError, match=r"rollout\.group_size=1: a group of one rollout is never flat"):
            load_recipe(TrainRecipe, train_yaml, [on, "rollout.group_size=1", f"algorithm.estimator={estimator}"])


def test_mask_gave_up_needs_over_turn_masking(train_yaml: Path) -> None:
    with pytest.raises(RecipeError, match=r"algorithm\.mask_gave_up=true .* set algorithm\.mask_unfinished=true"):
        load_recipe(TrainRecipe, train_yaml, ["algorithm.mask_gave_up=true"])
    recipe = load_recipe(TrainRecipe, train_yaml, ["algorithm.mask_gave_up=true", "algorithm.mask_unfinished=true"])
    assert recipe.algorithm.mask_gave_up and not TrainRecipe(run_dir="x").algorithm.mask_gave_up


def test_an_override_with_bytes_that_are_not_utf8_is_a_recipe_error() -> None:
    # Found by benchmarks/fuzz.py: argv bytes that are not UTF-8 arrive as lone surrogates.
    with pytest.raises(RecipeError, match=r"override 'search.nope=\]\\udcec' holds bytes that are not UTF-8"):
        load_recipe(TrainRecipe, None, ["search.nope=]\udcec"])


def test_a_mapping_where_the_schema_has_a_list_is_a_recipe_error(tmp_path) -> None:
    # Found by benchmarks/fuzz.py: OmegaConf's merge raised a bare TypeError.
    path = tmp_path / "collect.yaml"
    path.write_text("policy:\n  base_urls:\n    x: {}\n")
    with pytest.raises(RecipeError, match=r"collect.yaml: a section has the wrong shape"):
        load_recipe(CollectRecipe, path)
