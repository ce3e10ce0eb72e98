"""Every agent-loop protocol by its recipe name (`rollout.protocol`); the interface is `policy.protocol`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from simsearch.policy.selfsearch import SELF_SEARCH_TEMPLATE, SelfSearch
from simsearch.policy.tags import TagProtocol
from simsearch.policy.toolcalls import ToolCallProtocol

if TYPE_CHECKING:
    from simsearch.policy.protocol import AgentProtocol, RolloutChoices, SelfSearchable

PROTOCOLS: dict[str, Callable[[RolloutChoices], SelfSearchable]] = {
    "tags": TagProtocol,
    "tool-call": ToolCallProtocol,
}
"""Every agent-loop protocol by its recipe name (`rollout.protocol`); a new one is one entry."""


def make_protocol(cfg: RolloutChoices) -> AgentProtocol:
    """The protocol a rollout section runs: `rollout.protocol`, self-searching under the self-search template."""
    protocol = PROTOCOLS[cfg.protocol](cfg)
    if cfg.template == SELF_SEARCH_TEMPLATE:
        return SelfSearch(protocol, cfg.self_search_real_share)
    return protocol
