"""Static conformance of simsearch's vLLM calls with a vLLM release, on a machine without a GPU.

    python -m benchmarks.vllm_conformance                     # the newest vLLM the `vllm` extra allows
    python -m benchmarks.vllm_conformance --version 0.32.0    # another version the extra allows
    python -m benchmarks.vllm_conformance --wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl

Fetches the vLLM wheel with `pip download --no-deps` (about 330 MB; reused when already in
`--dest`), never installs or imports it, and reads its Python sources with `ast`. What simsearch
uses is read from simsearch itself where it can be (the keywords of the `vllm.LLM(...)` call and
of every `self.llm.<method>(...)` call in `generation/vllm.py`, the keys of `sampling_kwargs`, the
fields of the output protocols, the body `OpenAIEngine` sends, the flags of every `vllm serve`
command in the recipes and docs), and each is looked up in the wheel:

- names: `vllm.LLM`, `vllm.SamplingParams`, `vllm.inputs.TokensPrompt` and the LLM methods;
- keywords: of `LLM(...)` (its own parameters, or `EngineArgs` fields it forwards), of each LLM
  method, of `SamplingParams`, of the OpenAI server's request models, of `vllm serve`;
- output fields: `RequestOutput`, `CompletionOutput`, `Logprob`, the server's response choices;
- meanings: `logprobs_mode="raw_logprobs"`, `external_launcher`, the sleep tags, the
  `reset_prefix_cache` result, the temperature bounds the recipe checks mirror, that `top_k=-1`
  means off, that every value `vllm serve` takes from `generation_config.json` is sent, and the
  weight loader's route (`apply_model` through msgspec, which turns a dataclass into a map, and
  pickles any other object when `VLLM_ALLOW_INSECURE_SERIALIZATION` is set).

Only a GPU run settles the rest (docs/scaling.md lists it). Prints a table, then a JSON line (last
line): `checked`, `missing` (the failed checks), `vllm_version`, and the torch / transformers
pins and CUDA version of the wheel. Exits 1 when something is missing.
"""

from __future__ import annotations

import argparse
import ast
import email
import json
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from simsearch.config import SamplingConfig
from simsearch.errors import RecipeError
from simsearch.generation.openai import NEUTRAL_SAMPLING, OpenAIEngine
from simsearch.generation.vllm import SLEEP_TAGS, sampling_kwargs
from simsearch.types import SamplingParams

ROOT = Path(__file__).resolve().parents[1]

# Where simsearch's protocols meet vLLM's classes: (our protocol, vLLM module, vLLM class).
OUTPUT_CLASSES = [
    ("RequestOutputLike", "vllm/outputs.py", "RequestOutput"),
    ("CompletionOutputLike", "vllm/outputs.py", "CompletionOutput"),
    ("LogprobLike", "vllm/logprobs.py", "Logprob"),
]
# The response fields `OpenAIEngine` reads (generation/openai.py), by vLLM response model.
RESPONSE_FIELDS = [
    (
        "vllm/entrypoints/openai/completion/protocol.py",
        "CompletionResponseChoice",
        ["index", "text", "finish_reason", "stop_reason", "token_ids", "logprobs"],
    ),
    ("vllm/entrypoints/openai/completion/protocol.py", "CompletionLogProbs", ["token_logprobs"]),
    (
        "vllm/entrypoints/openai/chat_completion/protocol.py",
        "ChatCompletionResponseChoice",
        ["index", "message", "finish_reason", "stop_reason", "token_ids", "logprobs"],
    ),
    ("vllm/entrypoints/openai/chat_completion/protocol.py", "ChatMessage", ["content"]),
    ("vllm/entrypoints/openai/chat_completion/protocol.py", "ChatCompletionLogProbs", ["content"]),
    ("vllm/entrypoints/openai/chat_completion/protocol.py", "ChatCompletionLogProb", ["logprob"]),
]
REQUEST_MODELS = {
    False: ("vllm/entrypoints/openai/completion/protocol.py", "CompletionRequest"),
    True: ("vllm/entrypoints/openai/chat_completion/protocol.py", "ChatCompletionRequest"),
}
# `vllm serve` flags are fields of these, with dashes (vLLM builds its parser from them);
# FrontendArgs moved between releases, so it is looked for under vllm/entrypoints/.
SERVE_ARG_CLASSES = ["EngineArgs", "FrontendArgs"]
# Flags docs/scaling.md names in prose rather than in a `vllm serve` command.
PROSE_FLAGS = {"host": "docs/scaling.md", "api-key": "docs/scaling.md"}
# generation_config.json keys that are not sampling values we mean: sent otherwise, or text only.
GENERATION_CONFIG_EXEMPT = {"max_new_tokens": "sent as max_tokens", "skip_special_tokens": "text only"}


@dataclass
class Check:
    """One looked-up fact: what simsearch uses, where vLLM has it, whether it is there."""

    area: str
    name: str
    where: str
    ok: bool


# --------------------------------------------------------------------------- the wheel


class Wheel:
    """The Python sources and metadata of a vLLM wheel, read from the zip without extracting it."""

    def __init__(self, path: Path) -> None:
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())
        self._trees: dict[str, ast.Module] = {}
        meta_name = next(n for n in self.names if n.endswith(".dist-info/METADATA"))
        self.metadata = email.message_from_bytes(self.zip.read(meta_name))

    @property
    def version(self) -> str:
        return str(self.metadata["Version"])

    def source(self, module: str) -> str:
        return self.zip.read(module).decode() if module in self.names else ""

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            self._trees[module] = ast.parse(self.source(module))
        return self._trees[module]

    def pins(self) -> dict[str, str]:
        """The wheel's own requirements on the packages simsearch shares with it (no extras)."""
        pins = {}
        for line in self.metadata.get_all("Requires-Dist") or []:
            req = Requirement(line)
            if req.name in ("torch", "transformers", "huggingface_hub") and not req.marker:
                pins[req.name] = str(req.specifier)
        pins["python"] = str(self.metadata["Requires-Python"])
        return pins

    def locate(self, name: str, under: str = "vllm/") -> str:
        """The module under `under` that defines class `name` at top level ("" if none)."""
        pattern = re.compile(rf"^class {name}\b", re.MULTILINE)
        for module in sorted(self.names):
            if module.startswith(under) and module.endswith(".py") and pattern.search(self.source(module)):
                return module
        return ""

    def find_class(self, module: str, name: str) -> tuple[str, ast.ClassDef] | None:
        """A class defined in `module` or imported into it from another vLLM module."""
        for node in self.tree(module).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in self.tree(module).body:
            if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
                base = _module_base(module, node)
                for target in (f"{base}.py", f"{base}/__init__.py"):
                    if target in self.names:
                        return self.find_class(target, name)
        return None

    def members(self, module: str, name: str) -> dict[str, ast.AST]:
        """Methods, annotated fields and `self.x =` attributes of a class and its vLLM bases."""
        found = self.find_class(module, name) if module in self.names else None
        if found is None:
            return {}
        module, cls = found
        members: dict[str, ast.AST] = {}
        for base in cls.bases:
            base_name = base.id if isinstance(base, ast.Name) else None
            if base_name:
                members.update(self.members(module, base_name))
        for node in cls.body:
            if isinstance(node, ast.FunctionDef):
                members[node.name] = node
                if node.name == "__init__":
                    members.update(_self_assignments(node))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                members[node.target.id] = node
        return members


def _module_base(module: str, node: ast.ImportFrom) -> str:
    """The module path (no extension) an `ImportFrom` in `module` names: `vllm.x.y` or relative."""
    parts = (node.module or "").split(".") if node.module else []
    if not node.level:
        return "/".join(parts)
    package = Path(module).parent
    for _ in range(node.level - 1):
        package = package.parent
    return str(package.joinpath(*parts))


def _self_assignments(init: ast.FunctionDef) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in ast.walk(init):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                out[target.attr] = node
    return out


def _params(func: ast.AST) -> tuple[set[str], bool]:
    """A function's parameter names, and whether it takes **kwargs."""
    if not isinstance(func, ast.FunctionDef):
        return set(), False
    args = func.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    return names, args.kwarg is not None


# --------------------------------------------------------------------------- what simsearch uses


def simsearch_llm_calls() -> tuple[list[str], dict[str, set[str]]]:
    """The keywords of `vllm.LLM(...)` and of each `self.llm.<method>(...)` in generation/vllm.py."""
    tree = ast.parse((ROOT / "simsearch/generation/vllm.py").read_text())
    constructor: list[str] = []
    methods: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        keywords = {k.arg for k in node.keywords if k.arg}
        if isinstance(owner, ast.Name) and owner.id == "vllm" and node.func.attr == "LLM":
            constructor = sorted(keywords)
        if isinstance(owner, ast.Attribute) and owner.attr == "llm":
            methods.setdefault(node.func.attr, set()).update(keywords)
    return constructor, methods


def simsearch_protocol_fields(protocol: str) -> list[str]:
    tree = ast.parse((ROOT / "simsearch/generation/vllm.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == protocol:
            return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    raise ValueError(f"simsearch/generation/vllm.py has no protocol {protocol}")


def simsearch_request_keys(chat: bool) -> list[str]:
    """Every key `OpenAIEngine` may send (stop, seed and logprobs asked for)."""
    engine = OpenAIEngine(["http://127.0.0.1:9"], "model", chat=chat)
    try:
        body = engine._payload(["q"], SamplingParams(stop=["s"], seed=1, logprobs=True))
    finally:
        engine.close()
    return sorted(body)


def _command_files() -> list[Path]:
    """The files that hold the commands users copy: recipes, docs, README, benchmark scripts."""
    globs = ("recipes/**/*.yaml", "docs/*.md", "README.md", "benchmarks/*.sh")
    return [path for pattern in globs for path in sorted(ROOT.glob(pattern))]


def vllm_serve_flags() -> dict[str, str]:
    """Flag -> file of every `vllm serve` command (with its continuation lines) in recipes and docs."""
    flags: dict[str, str] = {}
    for path in _command_files():
        lines = [line.lstrip("#").strip() for line in path.read_text().splitlines()]
        for i, line in enumerate(lines):
            if not re.search(r"\bvllm serve \S", line):
                continue
            command = line
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i]
            for flag in re.findall(r"(?<!\S)--([a-z][a-z0-9-]*)", command.split("vllm serve", 1)[1]):
                flags.setdefault(flag, str(path.relative_to(ROOT)))
    return flags


# --------------------------------------------------------------------------- the checks


def check_names_and_keywords(wheel: Wheel) -> list[Check]:
    checks = []
    init_text = wheel.source("vllm/__init__.py")
    for name in ("LLM", "SamplingParams"):
        checks.append(Check("name", f"vllm.{name}", "vllm/__init__.py", f'"{name}"' in init_text))
    inputs = wheel.members("vllm/inputs/__init__.py", "TokensPrompt")
    checks.append(
        Check("name", "vllm.inputs.TokensPrompt(prompt_token_ids=)", "vllm/inputs", "prompt_token_ids" in inputs)
    )

    llm = wheel.members("vllm/entrypoints/llm.py", "LLM")
    engine_args = wheel.members("vllm/engine/arg_utils.py", "EngineArgs")
    init_params, init_kwargs = _params(llm.get("__init__"))
    constructor, methods = simsearch_llm_calls()
    for keyword in constructor:
        ok = keyword in init_params or (init_kwargs and keyword in engine_args)
        checks.append(Check("keyword", f"LLM({keyword}=)", "LLM.__init__ / EngineArgs", ok))
    for method, keywords in sorted(methods.items()):
        params, _ = _params(llm.get(method))
        checks.append(Check("name", f"LLM.{method}", "vllm/entrypoints/llm.py (+ mixins)", method in llm))
        for keyword in sorted(keywords):
            checks.append(Check("keyword", f"LLM.{method}({keyword}=)", f"LLM.{method}", keyword in params))

    fields = wheel.members("vllm/sampling_params.py", "SamplingParams")
    for keyword in sorted(sampling_kwargs(SamplingParams(stop=["s"], logprobs=True), seed=1)):
        checks.append(Check("keyword", f"SamplingParams({keyword}=)", "vllm/sampling_params.py", keyword in fields))
    return checks


def check_output_fields(wheel: Wheel) -> list[Check]:
    checks = []
    for protocol, module, cls in OUTPUT_CLASSES:
        members = wheel.members(module, cls)
        for name in simsearch_protocol_fields(protocol):
            checks.append(Check("output", f"{cls}.{name}", module, name in members))
    openai_source = (ROOT / "simsearch/generation/openai.py").read_text()
    for module, cls, names in RESPONSE_FIELDS:
        members = wheel.members(module, cls)
        for name in names:
            read = f'"{name}"' in openai_source  # keeps this list honest: OpenAIEngine reads it
            checks.append(Check("output", f"server {cls}.{name}", module, read and name in members))
    return checks


def check_server(wheel: Wheel) -> list[Check]:
    checks = []
    for chat, (module, cls) in REQUEST_MODELS.items():
        fields = wheel.members(module, cls)
        for key in simsearch_request_keys(chat):
            checks.append(Check("keyword", f"POST {'chat' if chat else 'completions'} {key}", cls, key in fields))
    serve_fields: set[str] = set()
    for cls in SERVE_ARG_CLASSES:
        serve_fields |= set(wheel.members(wheel.locate(cls), cls))
    for flag, used_in in sorted({**vllm_serve_flags(), **PROSE_FLAGS}.items()):
        checks.append(
            Check(
                "keyword",
                f"vllm serve --{flag} ({used_in})",
                "EngineArgs / FrontendArgs",
                flag.replace("-", "_") in serve_fields,
            )
        )
    # Every value vllm serve fills from generation_config.json is one the engine sends.
    sent = set(simsearch_request_keys(False))
    for key in _generation_config_keys(wheel):
        ok = key in sent or key in GENERATION_CONFIG_EXEMPT
        note = f" ({GENERATION_CONFIG_EXEMPT[key]})" if key in GENERATION_CONFIG_EXEMPT else ""
        where = "ModelConfig.get_diff_sampling_param"
        checks.append(Check("meaning", f"generation_config {key} overridden{note}", where, ok))
    return checks


def _generation_config_keys(wheel: Wheel) -> list[str]:
    model_config = wheel.members("vllm/config/model.py", "ModelConfig")
    func = model_config.get("get_diff_sampling_param")
    for node in ast.walk(func) if func else []:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "available_params" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    return ["<available_params not found>"]


def check_meanings(wheel: Wheel) -> list[Check]:
    """The meanings the module docstring lists, in the order of its list."""
    return check_llm_meanings(wheel) + check_sampling_meanings(wheel) + check_loader_and_downloads(wheel)


def check_llm_meanings(wheel: Wheel) -> list[Check]:
    """`logprobs_mode`, `external_launcher`, the sleep tags and `reset_prefix_cache`'s result."""
    checks = []
    model_src, parallel_src = wheel.source("vllm/config/model.py"), wheel.source("vllm/config/parallel.py")
    checks.append(
        Check("meaning", 'logprobs_mode="raw_logprobs"', "vllm/config/model.py", '"raw_logprobs"' in model_src)
    )
    checks.append(
        Check(
            "meaning",
            'distributed_executor_backend="external_launcher"',
            "vllm/config/parallel.py",
            '"external_launcher"' in parallel_src,
        )
    )
    llm = wheel.members("vllm/entrypoints/llm.py", "LLM")
    wake_up = llm.get("wake_up")
    wake_src = ast.get_source_segment(wheel.source("vllm/entrypoints/llm.py"), wake_up) if wake_up else ""
    for tag in sorted(SLEEP_TAGS):
        checks.append(Check("meaning", f'wake_up(tags=["{tag}"])', "LLM.wake_up", f'"{tag}"' in (wake_src or "")))
    reset = llm.get("reset_prefix_cache")
    returns_bool = isinstance(reset, ast.FunctionDef) and ast.unparse(reset.returns or ast.Constant(None)) == "bool"
    checks.append(Check("meaning", "reset_prefix_cache() -> bool", "LLM.reset_prefix_cache", returns_bool))
    return checks


def check_sampling_meanings(wheel: Wheel) -> list[Check]:
    """The temperature bounds the recipe checks mirror, and that the neutral `top_k` means off."""
    checks = []
    sampling_src = wheel.source("vllm/sampling_params.py")
    checks.append(
        Check(
            "meaning",
            "temperature > 2 refused (recipe check)",
            "SamplingParams._verify_args",
            "self.temperature > 2.0" in sampling_src and _recipe_refuses(2.01) and not _recipe_refuses(2.0),
        )
    )
    checks.append(
        Check(
            "meaning",
            "temperature < 0.01 raised to 0.01 (recipe check)",
            "sampling_params._MAX_TEMP",
            "_MAX_TEMP = 1e-2" in sampling_src and _recipe_refuses(0.009) and not _recipe_refuses(0.01),
        )
    )
    checks.append(
        Check(
            "meaning",
            f"top_k={NEUTRAL_SAMPLING['top_k']} means off",
            "SamplingParams._verify_args",
            "self.top_k < -1" in sampling_src,
        )
    )
    return checks


def check_loader_and_downloads(wheel: Wheel) -> list[Check]:
    """The weight loader's route, `hf download` in the commands, and the environment variables we set."""
    checks = []
    serial = wheel.source("vllm/v1/serial_utils.py")
    engine_src = wheel.source("vllm/v1/engine/llm_engine.py")
    worker = wheel.members("vllm/v1/worker/worker_base.py", "WorkerBase")
    checks.append(
        Check(
            "meaning",
            "apply_model(f) = collective_rpc('apply_model', args=(f,))",
            "LLMEngine.apply_model",
            'collective_rpc("apply_model", args=(func,))' in engine_src and "apply_model" in worker,
        )
    )
    checks.append(
        Check(
            "meaning",
            "msgspec sends a non-dataclass loader pickled",
            "MsgpackEncoder.enc_hook",
            "CUSTOM_TYPE_PICKLE, pickle.dumps(obj" in serial
            and "VLLM_ALLOW_INSECURE_SERIALIZATION" in serial
            and not _loader_is_dataclass(),
        )
    )
    hub = wheel.pins().get("huggingface_hub", "")
    old_cli = [str(p.relative_to(ROOT)) for p in _command_files() if "huggingface-cli download" in p.read_text()]
    checks.append(
        Check(
            "meaning",
            f"`hf download`, not huggingface-cli (huggingface_hub{hub}) {old_cli or ''}",
            "Requires-Dist",
            ">=1" in hub and not old_cli,
        )
    )
    envs = wheel.source("vllm/envs.py")
    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_ALLOW_INSECURE_SERIALIZATION"):
        checks.append(Check("name", var, "vllm/envs.py", f'"{var}"' in envs))
    return checks


def _recipe_refuses(temperature: float) -> bool:
    try:
        SamplingConfig.check_temperature("sampling.temperature", temperature)
    except RecipeError:
        return True
    return False


def _loader_is_dataclass() -> bool:
    tree = ast.parse((ROOT / "simsearch/generation/vllm.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "_LoadWeights":
            return any("dataclass" in ast.unparse(d) for d in node.decorator_list)
    return True  # gone: say so


# --------------------------------------------------------------------------- fetching and reporting


def extra_requirement() -> Requirement:
    """The `vllm` requirement of pyproject.toml's `vllm` extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return next(Requirement(r) for r in extras["vllm"] if Requirement(r).name == "vllm")


def fetch_wheel(requirement: Requirement, version: str | None, dest: Path) -> Path:
    """Downloads the vLLM wheel (no dependencies) the extra allows: `version`, else the newest."""
    if version is not None and Version(version) not in requirement.specifier:
        raise SystemExit(f"vllm {version} is outside the extra's bounds {requirement}")
    wanted = f"vllm=={version}" if version else str(requirement)
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            wanted,
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "-d",
            str(dest),
        ],
        check=True,
    )
    wheels = [p for p in dest.glob("vllm-*.whl") if Version(p.name.split("-")[1]) in requirement.specifier]
    if version:
        wheels = [p for p in wheels if p.name.split("-")[1] == version]
    return max(wheels, key=lambda p: Version(p.name.split("-")[1]))


def cuda_version(wheel: Wheel) -> str:
    found = re.search(r'VLLM_MAIN_CUDA_VERSION: str = "([^"]+)"', wheel.source("vllm/envs.py"))
    return found.group(1) if found else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="a vLLM wheel already on disk (skips the download)")
    parser.add_argument("--version", help="a vLLM version within the extra's bounds (default: the newest)")
    parser.add_argument(
        "--dest",
        type=Path,
        default=Path(tempfile.gettempdir()) / "simsearch_vllm_wheels",
        help="where the wheel is downloaded (reused when already there)",
    )
    args = parser.parse_args(argv)

    requirement = extra_requirement()
    path = args.wheel or fetch_wheel(requirement, args.version, args.dest)
    wheel = Wheel(path)
    checks = check_names_and_keywords(wheel) + check_output_fields(wheel) + check_server(wheel) + check_meanings(wheel)
    print(f"vLLM {wheel.version} ({path.name}); simsearch's extra: {requirement}\n")
    print("| ok | area | simsearch uses | looked up in |")
    print("|---|---|---|---|")
    for c in checks:
        print(f"| {'yes' if c.ok else 'MISSING'} | {c.area} | `{c.name}` | {c.where} |")
    missing = [c.name for c in checks if not c.ok]
    pins = wheel.pins()
    print(f"\n{len(checks)} checked, {len(missing)} missing; the wheel pins {pins}, CUDA {cuda_version(wheel)}")
    print(
        json.dumps(
            {
                "checked": len(checks),
                "missing": missing,
                "vllm_version": wheel.version,
                "in_extra": Version(wheel.version) in requirement.specifier,
                "torch": pins.get("torch"),
                "transformers": pins.get("transformers"),
                "huggingface_hub": pins.get("huggingface_hub"),
                "cuda": cuda_version(wheel),
            }
        )
    )
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
