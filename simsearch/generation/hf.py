"""Text generation with a transformers model: our own KV-cached sampling loop.

`HFEngine` keeps `GenerationEngine`'s `Completion` contract; non-finite logits raise
`NonFiniteError`. With `prefix_cache=True` (the default) a prompt that extends a sequence of the
previous call prefills only what is new, so a trainer must call `reset_prefix_cache()` after
every optimizer step. `compile=True` decodes over a static KV cache with
`torch.compile(mode="reduce-overhead")`. Under a transformers before 5.23 the engine switches a
grouped-query model on `sdpa` to `attention.packed_sdpa` (same outputs, no key/value copies).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase, StaticCache
from transformers.cache_utils import DynamicLayer

from simsearch.errors import NonFiniteError
from simsearch.generation.attention import pack_decode_queries
from simsearch.generation.base import prompt_token_ids
from simsearch.types import Completion, SamplingParams


@dataclass
class _Batch:
    """The live decode state of a chunk; row b of every tensor is one sequence."""

    cache: DynamicCache  # keys/values [B, kv_heads, T, head_dim] per layer
    attention_mask: torch.Tensor  # [B, T], 0 on left padding
    next_position: torch.Tensor  # [B], position id of the next token
    logits: torch.Tensor  # [B, V], next-token logits (float32)
    rows: list[int]  # for each row, its index in the generate() output
    prompts: list[list[int]]  # for each row, its prompt ids (kept with its cache when it ends)


@dataclass
class _Prefix:
    """A kept sequence: token ids and the keys/values the model computed for them."""

    token_ids: list[int]
    kv: torch.Tensor  # [layers, 2 (keys, values), kv_heads, len(token_ids), head_dim]


class _PrefixStore:
    """The sequences one generate call kept, found by (length, last token id)."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[int, int], list[_Prefix]] = {}
        self._lengths: set[int] = set()
        self._longest_first: list[int] | None = None  # sorted `_lengths`, built on first lookup
        self.tokens = 0

    def add(self, prefix: _Prefix) -> None:
        ids = prefix.token_ids
        bucket = self._buckets.setdefault((len(ids), ids[-1]), [])
        if any(kept.token_ids == ids for kept in bucket):
            return  # e.g. identical greedy samples: the same keys and values
        bucket.append(prefix)
        self._lengths.add(len(ids))
        self._longest_first = None
        self.tokens += len(ids)

    def longest(self, prompt: list[int]) -> _Prefix | None:
        """The longest kept sequence that is a prefix of `prompt` (or equals it)."""
        if self._longest_first is None:
            self._longest_first = sorted(self._lengths, reverse=True)
        for length in self._longest_first:
            if length > len(prompt):
                continue
            for kept in self._buckets.get((length, prompt[length - 1]), ()):
                if prompt[:length] == kept.token_ids:
                    return kept
        return None


@dataclass
class _Sequence:
    """What one output row has generated so far."""

    token_ids: list[int]
    logprobs: list[float] | None


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zeroes the tail of each [B, V] distribution outside its top-p nucleus (at least one token kept)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [B, V]
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [B, V]
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """[B] next token ids from [B, V] logits (`temperature` 0: greedy); -1 for a row with non-finite logits."""
    scaled = logits if temperature == 0 else logits / temperature  # [B, V]
    finite = torch.isfinite(scaled).all(dim=-1)  # [B]
    scaled = torch.where(finite[:, None], scaled, 0.0)
    if temperature == 0:
        tokens = scaled.argmax(dim=-1)
    else:
        probs = torch.softmax(scaled, dim=-1)  # [B, V]
        if top_p < 1.0:
            probs = top_p_filter(probs, top_p)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return torch.where(finite, tokens, -1)


STATIC_LENGTH_STEP = 256
"""With `compile=True` the static cache holds a multiple of this many tokens (fewer shapes to compile)."""

GROUP_RATIO = 2
"""A row joins a prefill group while its uncached length is at most GROUP_RATIO x the group's
shortest + GROUP_SLACK: then at most about half of a group's window is padding."""
GROUP_SLACK = 16
"""Suffixes of a few tokens (a last token, a short message) are not worth a forward of their own."""


def similar_lengths(lengths: list[int]) -> list[list[int]]:
    """Groups of row indices of similar length, shortest first; every row in exactly one group."""
    groups: list[list[int]] = []
    for b in sorted(range(len(lengths)), key=lambda b: lengths[b]):
        if groups and lengths[b] <= GROUP_RATIO * lengths[groups[-1][0]] + GROUP_SLACK:
            groups[-1].append(b)
        else:
            groups.append([b])
    return [sorted(group) for group in groups]


class HFEngine:
    """A `GenerationEngine` over a transformers causal LM (or a PEFT model over one).

    Args:
        batch_size: Most rows (prompts × n samples) decoded together; a prompt's samples share a chunk.
        prefix_cache: Reuse the previous call's sequences for prompts that extend them; holds
            `kept_tokens` of KV between calls. Off for a simulator, whose prompts never extend its
            outputs. Models without plain full-attention caches run without it.
        compile: Decode with a `torch.compile`d forward (compiles once per shape).

    Attributes:
        stats: Running token and step totals (`prompt_tokens`, `reused_tokens`, `prefill_tokens`,
            `prefill_slots`, `decode_steps`, `decoded_tokens`); reset them by assigning zeros.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 64,
        prefix_cache: bool = True,
        compile: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        pack_decode_queries(model)  # a left-padded batch decodes under a mask: see generation/attention.py
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        eos = {tokenizer.eos_token_id}
        config_eos = model.generation_config.eos_token_id
        eos.update(config_eos if isinstance(config_eos, list) else [config_eos])
        eos.discard(None)
        if not eos:
            raise ValueError(
                "the tokenizer and the model's generation_config both lack an eos token; set tokenizer.eos_token"
            )
        self.eos_ids = frozenset(eos)
        # Any id works for padding: padded positions are masked out of attention.
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
        # Keys/values can be cut to a row, re-assembled and merged only when every layer's cache
        # is a plain growing [B, kv_heads, T, head_dim] tensor pair.
        layers = DynamicCache(config=model.config).layers
        self._plain_cache = all(type(layer) is DynamicLayer for layer in layers)
        self.prefix_cache = prefix_cache and self._plain_cache
        if compile and not self._plain_cache:
            raise ValueError(
                f"compile=True needs a model whose every layer is plain full attention; {type(model).__name__} has "
                "sliding-window or other cache layers: leave compile off"
            )
        self.compile = compile
        self._compiled: Callable[..., Any] | None = None  # torch.compile(model), built on first use
        self._stop_filters: dict[tuple[str, ...], list[bool]] = {}
        keys = ("prompt_tokens", "reused_tokens", "prefill_tokens", "prefill_slots", "decode_steps", "decoded_tokens")
        self.stats = dict.fromkeys(keys, 0)
        self._kept = _PrefixStore()
        self._kept_for: tuple = ()  # _weights_key() of the weights that computed `_kept`

    @property
    def device(self) -> torch.device:
        """Where the model is now (a trainer may move it between calls)."""
        return next(self.model.parameters()).device

    @property
    def kept_tokens(self) -> int:
        """Tokens whose keys and values are kept for the next call (0 without prefix reuse)."""
        return self._kept.tokens

    def reset_prefix_cache(self) -> None:
        """Drops every kept sequence; call it whenever the weights (or adapter) change between calls."""
        self._kept = _PrefixStore()

    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams) -> list[Completion]:
        """Generates `params.n` completions per prompt, prompt-major.

        Greedy results do not depend on the other prompts or on the cache (to float rounding); a
        seeded call repeated with the same prompts, params and batch_size returns the same completions.
        """
        _check_params(params)
        prompt_ids = prompt_token_ids(self.tokenizer, prompts)
        prefixes = self._take_prefixes(prompt_ids)
        generator = torch.Generator(device=self.device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        # Longest first, so that prompts of similar length share a chunk (less padding).
        order = sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i]))
        per_chunk = max(1, self.batch_size // params.n)
        results: list[Completion | None] = [None] * (len(prompt_ids) * params.n)
        was_training = self.model.training
        self.model.eval()
        # Compiled graphs and inference tensors do not mix well on every torch version: no_grad there.
        grad_off: AbstractContextManager = torch.no_grad() if self.compile else torch.inference_mode()
        decode = self._decode_static if self.compile else self._decode
        try:
            with grad_off:
                for start in range(0, len(order), per_chunk):
                    chunk = order[start : start + per_chunk]
                    chunk_prompts = [prompt_ids[i] for i in chunk]
                    chunk_prefixes = [prefixes[i] for i in chunk]
                    batch = self._prefill(chunk_prompts, chunk_prefixes, chunk, params.n)
                    for i in chunk:
                        prefixes[i] = None  # frees the kept prefixes no later chunk needs
                    for row, completion in decode(batch, params, generator):
                        results[row] = completion
        finally:
            self.model.train(was_training)
        # Every slot is filled: each row finishes by max_new_tokens at the latest.
        return cast(list[Completion], results)

    def _take_prefixes(self, prompts: list[list[int]]) -> list[_Prefix | None]:
        """For each prompt, the longest kept sequence it extends; starts this call's store."""
        if not self.prefix_cache:
            return [None] * len(prompts)
        previous, self._kept = self._kept, _PrefixStore()
        weights = self._weights_key()
        if weights != self._kept_for:
            previous, self._kept_for = _PrefixStore(), weights
        return [previous.longest(prompt) for prompt in prompts]

    def _weights_key(self) -> tuple:
        """Changes when a parameter is replaced, moved or modified in place (a safety net only)."""
        device = self.device.type
        autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        return autocast, tuple((p.data_ptr(), p._version) for p in self.model.parameters())

    def _prefill(self, prompts: list[list[int]], prefixes: list[_Prefix | None], indices: list[int], n: int) -> _Batch:
        """Prefills the uncached tokens in groups of similar length; returns the chunk's cache and logits."""
        lengths = [len(p) for p in prompts]
        # A prompt's last token always goes through the model: it gives the next-token logits.
        cached = [
            0 if prefix is None else min(len(prefix.token_ids), length - 1) for length, prefix in zip(lengths, prefixes)
        ]
        everything = [list(range(len(prompts)))]
        groups = (
            similar_lengths([length - c for length, c in zip(lengths, cached)]) if self._plain_cache else everything
        )
        parts = [
            self._prefill_group(
                [prompts[b] for b in group],
                [prefixes[b] for b in group],
                [cached[b] for b in group],
            )
            for group in groups
        ]
        width = max(lengths)
        cache, logits = parts[0] if groups == everything else self._merge(groups, parts, width)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, length in enumerate(lengths):
            attention_mask[b, width - length :] = 1
        attention_mask = attention_mask.to(self.device)
        next_position = torch.tensor(lengths, device=self.device)  # 0 .. length - 1 are cached
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attention_mask = attention_mask.repeat_interleave(n, dim=0)
            next_position = next_position.repeat_interleave(n, dim=0)
        rows = [i * n + j for i in indices for j in range(n)]
        row_prompts = [p for p in prompts for _ in range(n)]
        return _Batch(cache, attention_mask, next_position, logits, rows, row_prompts)

    def _prefill_group(
        self, prompts: list[list[int]], prefixes: list[_Prefix | None], cached: list[int]
    ) -> tuple[DynamicCache, torch.Tensor]:
        """One forward over the rows' uncached tokens; returns the cache and [G, V] float32 logits."""
        lengths = [len(p) for p in prompts]
        window = max(length - c for length, c in zip(lengths, cached))
        reused = [max(0, length - window) for length in lengths]
        kept = max(reused)
        width = kept + window
        input_ids = torch.full((len(prompts), window), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, ids in enumerate(prompts):
            shown = ids[reused[b] :]
            input_ids[b, window - len(shown) :] = torch.tensor(shown)
            attention_mask[b, width - len(ids) :] = 1
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        # Positions count real tokens only, so padding does not shift the rotary embeddings.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, kept:]  # [G, W]
        cache = self._kept_cache(prefixes, reused, kept)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.stats["prompt_tokens"] += sum(lengths)
        self.stats["reused_tokens"] += sum(reused)
        self.stats["prefill_tokens"] += sum(lengths) - sum(reused)
        self.stats["prefill_slots"] += len(prompts) * window
        return cache, out.logits[:, -1, :].float()

    def _merge(
        self,
        groups: list[list[int]],
        parts: list[tuple[DynamicCache, torch.Tensor]],
        width: int,
    ) -> tuple[DynamicCache, torch.Tensor]:
        """The groups' caches and logits as one batch, in chunk row order, right-aligned."""
        rows = sum(len(group) for group in groups)
        first_cache, first_logits = parts[0]
        logits = first_logits.new_empty((rows, first_logits.shape[-1]))
        merged = []
        # Full-attention layers only (DynamicLayer: keys and values set after a forward).
        first_layers: list[Any] = first_cache.layers
        for layer in range(len(first_layers)):
            heads, head_dim = first_layers[layer].keys.shape[1::2]
            keys = first_layers[layer].keys.new_zeros((rows, heads, width, head_dim))
            values = torch.zeros_like(keys)
            for group, (cache, _) in zip(groups, parts):
                index = torch.tensor(group, device=keys.device)
                part: Any = cache.layers[layer]
                keys[index, :, width - part.keys.shape[2] :] = part.keys
                values[index, :, width - part.values.shape[2] :] = part.values
            merged.append((keys, values))
        for group, (_, part_logits) in zip(groups, parts):
            logits[torch.tensor(group, device=logits.device)] = part_logits
        return DynamicCache(ddp_cache_data=merged, config=self.model.config), logits

    def _kept_cache(self, prefixes: list[_Prefix | None], reused: list[int], kept: int) -> DynamicCache:
        """A cache holding each row's first `reused[b]` cached tokens, right-aligned in `kept`."""
        if kept == 0:
            return DynamicCache(config=self.model.config)
        first = next(p for p, r in zip(prefixes, reused) if r > 0)
        assert first is not None  # a row that reuses tokens has a kept prefix
        layers, _, heads, _, head_dim = first.kv.shape
        kv = first.kv.new_zeros((layers, 2, len(prefixes), heads, kept, head_dim))
        for b, (prefix, count) in enumerate(zip(prefixes, reused)):
            if count > 0:
                assert prefix is not None  # count <= the row's cached tokens (see _prefill)
                kv[:, :, b, :, kept - count :] = prefix.kv[:, :, :, :count]
        return DynamicCache(ddp_cache_data=[(k, v) for k, v in kv], config=self.model.config)

    def _keep(self, layers: list[Any], b: int, end: int, token_ids: list[int]) -> None:
        """Keeps row b's keys and values (prompt and all but the last generated token) ending at column `end`."""
        start = end - len(token_ids)  # the row's true tokens; padding lies before them
        # One copy of just these columns: a view would keep the whole batch tensor alive.
        parts = [t[b, :, start:end] for layer in layers for t in (layer.keys, layer.values)]
        kv = torch.stack(parts).unflatten(0, (len(layers), 2))  # [layers, 2, kv_heads, L, head_dim]
        self._kept.add(_Prefix(token_ids, kv))

    def _sample(
        self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
    ) -> tuple[list[int], list[float] | None]:
        """One token per row and its log-probability; -1 marks non-finite logits."""
        tokens = sample_next(logits, temperature=params.temperature, top_p=params.top_p, generator=generator)  # [B]
        self.stats["decode_steps"] += 1
        if not params.logprobs:
            return tokens.tolist(), None
        logprobs = torch.log_softmax(logits, dim=-1)  # [B, V]
        chosen = logprobs.gather(-1, tokens.clamp(min=0)[:, None]).squeeze(-1)  # [B]
        both = torch.stack([tokens.double(), chosen.double()]).tolist()  # ids < 2^53: exact in float64
        return [int(t) for t in both[0]], both[1]

    def _advance(
        self,
        sequences: list[_Sequence | None],
        tokens: list[int],
        chosen: list[float] | None,
        params: SamplingParams,
        rows: list[int],
    ) -> list[tuple[int, Completion]]:
        """Appends each live row's token; returns (row, completion) for the rows it finished."""
        bad = [b for b, seq in enumerate(sequences) if seq is not None and tokens[b] < 0]
        if bad:
            named = [rows[b] for b in bad]
            raise NonFiniteError(_non_finite_message(named, params.n, sequences[bad[0]]), named)
        stop_filter = self._stop_filter(params.stop)
        window = max((len(s.encode("utf-8")) for s in params.stop), default=0) + 2
        finished = []
        for b, seq in enumerate(sequences):
            if seq is None:
                continue
            seq.token_ids.append(tokens[b])
            if seq.logprobs is not None and chosen is not None:
                seq.logprobs.append(chosen[b])
            completion = self._finished(seq, params, window, stop_filter)
            if completion is not None:
                finished.append((b, completion))
                sequences[b] = None
        self.stats["decoded_tokens"] += sum(seq is not None for seq in sequences) + len(finished)
        return finished

    def _decode(
        self, batch: _Batch, params: SamplingParams, generator: torch.Generator
    ) -> list[tuple[int, Completion]]:
        """Samples until every row has finished, dropping finished rows; returns (output row, completion) pairs."""
        sequences: list[_Sequence | None] = [_Sequence([], [] if params.logprobs else None) for _ in batch.rows]
        done: list[tuple[int, Completion]] = []
        while True:
            tokens, chosen = self._sample(batch.logits, params, generator)
            for b, completion in self._advance(sequences, tokens, chosen, params, batch.rows):
                done.append((batch.rows[b], completion))
                if self.prefix_cache:
                    token_ids = batch.prompts[b] + completion.token_ids[:-1]
                    self._keep(batch.cache.layers, b, batch.attention_mask.shape[1], token_ids)
            keep = [b for b, seq in enumerate(sequences) if seq is not None]
            if not keep:
                return done
            next_tokens = torch.tensor([tokens[b] for b in keep], device=batch.logits.device)
            if len(keep) < len(batch.rows):
                batch = _select_rows(batch, keep)
                sequences = [sequences[b] for b in keep]
            batch = self._step(batch, next_tokens)

    def _step(self, batch: _Batch, tokens: torch.Tensor) -> _Batch:
        """Feeds one new token per row through the model, extending the cache."""
        ones = batch.attention_mask.new_ones((len(batch.rows), 1))
        attention_mask = torch.cat([batch.attention_mask, ones], dim=-1)  # [B, T + 1]
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=attention_mask,
            position_ids=batch.next_position[:, None],
            past_key_values=batch.cache,
            use_cache=True,
        )
        return _Batch(
            cache=batch.cache,
            attention_mask=attention_mask,
            next_position=batch.next_position + 1,
            logits=out.logits[:, -1, :].float(),
            rows=batch.rows,
            prompts=batch.prompts,
        )

    def _decode_static(
        self, batch: _Batch, params: SamplingParams, generator: torch.Generator
    ) -> list[tuple[int, Completion]]:
        """`_decode` over a static cache with the compiled forward; finished rows stay, fed pad tokens."""
        rows, width = len(batch.rows), batch.attention_mask.shape[1]
        cache, attention_mask, size = self._static_state(batch, width + params.max_new_tokens)
        position = torch.zeros(size, dtype=torch.long, device=batch.logits.device)
        position[:rows] = batch.next_position
        pad = torch.full((size,), self.pad_id, dtype=torch.long, device=position.device)
        forward = self._compiled_forward()
        sequences: list[_Sequence | None] = [_Sequence([], [] if params.logprobs else None) for _ in batch.rows]
        done: list[tuple[int, Completion]] = []
        logits, fed = batch.logits, 0
        while True:
            tokens, chosen = self._sample(logits, params, generator)
            for b, completion in self._advance(sequences, tokens, chosen, params, batch.rows):
                done.append((batch.rows[b], completion))
                if self.prefix_cache:
                    token_ids = batch.prompts[b] + completion.token_ids[:-1]
                    self._keep(cache.layers, b, width + fed, token_ids)
            if all(seq is None for seq in sequences):
                return done
            live = torch.tensor([seq is not None for seq in sequences] + [False] * (size - rows), device=pad.device)
            fed_tokens = pad.clone()
            fed_tokens[:rows] = torch.tensor(tokens, device=pad.device).clamp(min=0)
            out = forward(
                input_ids=torch.where(live, fed_tokens, pad)[:, None],
                attention_mask=attention_mask,
                position_ids=(position + fed)[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            logits, fed = out.logits[:rows, -1, :].float(), fed + 1

    def _static_state(self, batch: _Batch, needed: int) -> tuple[StaticCache, torch.Tensor, int]:
        """A static cache holding the prefilled keys and values; returns (cache, attention mask, rows)."""
        rows, width = batch.attention_mask.shape
        size = 1 << (rows - 1).bit_length()
        length = -(-needed // STATIC_LENGTH_STEP) * STATIC_LENGTH_STEP
        cache = StaticCache(config=self.model.config, max_cache_len=length)
        static_layers: list[Any] = cache.layers
        dynamic_layers: list[Any] = batch.cache.layers
        for static, dynamic in zip(static_layers, dynamic_layers):
            heads, head_dim = dynamic.keys.shape[1], dynamic.keys.shape[3]
            static.lazy_initialization(*(dynamic.keys.new_zeros((size, heads, 1, head_dim)),) * 2)
            static.keys[:rows, :, :width] = dynamic.keys
            static.values[:rows, :, :width] = dynamic.values
            static.cumulative_length.fill_(width)
        attention_mask = batch.attention_mask.new_ones((size, length))
        attention_mask[:rows, :width] = batch.attention_mask
        return cache, attention_mask, size

    def _compiled_forward(self) -> Callable[..., Any]:
        """The model's forward under torch.compile, compiled on first use (CUDA graphs on a GPU)."""
        if self._compiled is None:
            self._compiled = torch.compile(self.model, mode="reduce-overhead", dynamic=False)
        return self._compiled

    def _stop_filter(self, stops: list[str]) -> list[bool] | None:
        """Per token id, whether it can complete one of `stops`; None when any token can."""
        key = tuple(stops)
        if not stops or any(s[-1].isspace() for s in stops):
            return None
        if key not in self._stop_filters:
            lasts = {s[-1] for s in stops}
            texts = self.tokenizer.batch_decode(
                [[i] for i in range(len(self.tokenizer))], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            self._stop_filters[key] = [("\ufffd" in text) or any(c in text for c in lasts) for text in texts]
        return self._stop_filters[key]

    def _finished(
        self, seq: _Sequence, params: SamplingParams, window: int, stop_filter: list[bool] | None
    ) -> Completion | None:
        """The completion of `seq` if its last token ended it, else None."""
        ids = seq.token_ids
        if ids[-1] in self.eos_ids:
            return Completion(ids, self._decode_text(ids[:-1]), "stop", None, seq.logprobs)
        if params.stop and (stop_filter is None or ids[-1] >= len(stop_filter) or stop_filter[ids[-1]]):
            tail = self._decode_text(ids[-window:])
            if any(s in tail for s in params.stop):
                text = self._decode_text(ids)
                # Earlier tokens held no stop string (we check every step), so the first
                # occurrence in the full text is the one this token completed; when several stop
                # strings complete at once, the one that ends first wins.
                ends = [(text.find(s) + len(s), s) for s in params.stop if s in text]
                if ends:
                    end, stop = min(ends)
                    return Completion(ids, text[:end], "stop", stop, seq.logprobs)
        if len(ids) >= params.max_new_tokens:
            return Completion(ids, self._decode_text(ids), "length", None, seq.logprobs)
        return None

    def _decode_text(self, ids: list[int]) -> str:
        # Special tokens are kept: the tiny tokenizer's tags are special tokens.
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))


def _select_rows(batch: _Batch, keep: list[int]) -> _Batch:
    """Keeps only the rows `keep` of the decode state."""
    index = torch.tensor(keep, device=batch.attention_mask.device)
    batch.cache.batch_select_indices(index)
    return _Batch(
        cache=batch.cache,
        attention_mask=batch.attention_mask[index],
        next_position=batch.next_position[index],
        logits=batch.logits[index],
        rows=[batch.rows[b] for b in keep],
        prompts=[batch.prompts[b] for b in keep],
    )


def _check_params(params: SamplingParams) -> None:
    """Rejects sampling settings the loop cannot honour, naming the field."""
    if params.temperature < 0:
        raise ValueError(f"SamplingParams.temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if params.max_new_tokens < 1:
        raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.n < 1:
        raise ValueError(f"SamplingParams.n must be >= 1, got {params.n}")
    if any(not s for s in params.stop):
        raise ValueError("SamplingParams.stop holds an empty string; remove it")


def _non_finite_message(rows: list[int], n: int, first: _Sequence | None) -> str:
    """What `NonFiniteError` says: which output rows (prompt, sample), at which generated token, what to do."""
    named = ", ".join(f"prompt {row // n} sample {row % n}" for row in rows[:8])
    more = f" and {len(rows) - 8} more" if len(rows) > 8 else ""
    token = len(first.token_ids) + 1 if first is not None else 1
    return (
        f"the model's next-token logits are inf or nan for {len(rows)} row(s) ({named}{more}) at generated token "
        f"{token}; nothing was sampled from them. The weights or activations overflowed or diverged: in bfloat16 "
        "or float16 try model.dtype=float32 to check, lower the learning rate, or resume from the last checkpoint"
    )
