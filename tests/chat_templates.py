"""Chat templates with tool support, written for these tests in the two call formats simsearch parses.

`HERMES_TEMPLATE` follows the layout of Qwen2.5's and Qwen3's templates (ChatML turns, the tools
listed in the system turn, calls in `<tool_call>` tags, results as `<tool_response>` in a user
turn; with `enable_thinking=False` an empty think block opens every assistant turn, as Qwen3's);
`LLAMA3_TEMPLATE` that of Llama 3.1's (header tokens, JSON calls, results in an `ipython`
turn). Neither is a copy of the real template.
"""

from __future__ import annotations

from simsearch.models import PAD_TOKEN, train_tokenizer

HERMES_TEMPLATE = """\
{%- set no_thinking = enable_thinking is defined and not enable_thinking -%}
{%- set think = "<think>\n\n</think>\n\n" -%}
{%- if tools -%}
<|im_start|>system{{ "\n" }}You may call the functions below. Their signatures:{{ "\n" }}<tools>
{%- for tool in tools %}{{ "\n" }}{{ tool | tojson }}{% endfor %}{{ "\n" }}</tools>{{ "\n" -}}
Call one with <tool_call>{"name": function name, "arguments": arguments as JSON}</tool_call>.<|im_end|>{{ "\n" }}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == "tool" -%}
{%- if loop.first or messages[loop.index0 - 1].role != "tool" %}<|im_start|>user{{ "\n" }}{% endif -%}
<tool_response>{{ "\n" }}{{ message.content }}{{ "\n" }}</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != "tool" %}<|im_end|>{{ "\n" }}{% else %}{{ "\n" }}{% endif -%}
{%- else -%}
{%- set empty_think = message.role == "assistant" and no_thinking and "</think>" not in message.content -%}
<|im_start|>{{ message.role }}{{ "\n" }}{% if empty_think %}{{ think }}{% endif -%}
{{ message.content }}<|im_end|>{{ "\n" }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant{{ "\n" }}{% if no_thinking %}{{ think }}{% endif %}{% endif -%}
"""


LLAMA3_TEMPLATE = """\
{{- bos_token -}}
{%- if tools -%}
<|start_header_id|>system<|end_header_id|>

To use a function, reply with JSON only: {"name": function name, "parameters": {name: value}}.
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|eot_id|>
{%- endif -%}
{%- for message in messages -%}
{%- set role = "ipython" if message.role == "tool" else message.role -%}
<|start_header_id|>{{ role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endfor -%}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif -%}
"""

HERMES_SPECIALS = (PAD_TOKEN, "<|im_end|>", "<|im_start|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
                   "<answer>", "</answer>")  # fmt: skip
LLAMA3_SPECIALS = (PAD_TOKEN, "<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|python_tag|>", "<think>", "</think>", "<answer>", "</answer>")  # fmt: skip

TEXTS = [
    "Who founded the Belsa rope works? search query arguments parameters name results passage Doc",
    '{"name": "search", "arguments": {"query": "Belsa rope works founder"}}',
    "You may call the functions below. Their signatures: system user assistant tool ipython",
] * 30


def tokenizer(template: str, specials: tuple[str, ...]):
    """A tiny byte-level tokenizer whose chat template is `template` (eos: `specials[1]`)."""
    tok = train_tokenizer(TEXTS, vocab_size=400, special_tokens=specials)
    tok.chat_template = template
    if specials is LLAMA3_SPECIALS:
        tok.bos_token = "<|begin_of_text|>"
    return tok
