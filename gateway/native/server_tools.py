"""Server-side tools on the native API: what a turn's `tool_choice`
offers the model, read before anything is charged or queued (pure).

The tools are the operator's (`CHATPIPE_SERVER_TOOLS`), run by the `chat.tools` stage;
a turn opts in with `tool_choice`: `auto` (the model decides), `required` (it calls
one), or a tool's name (it calls that one). A forced choice holds only the first round:
after the results the model may answer in text. `none` (the default) shows no tools.
"""

from __future__ import annotations

from gateway.config import ServerToolsConfig
from gateway.refusals import NotFound, Unacceptable
from schemas.events import GenerationRequest
from schemas.tools import ServerToolTurn, ToolUse


def server_tool_use(config: ServerToolsConfig, choice: str) -> ToolUse | None:
    """What `choice` shows the model; None for `none`. `invalid_tool_choice` when no
    server tools are on, `tool_not_found` for a tool that is not on."""
    if choice == "none":
        return None
    if not config.tools:
        raise Unacceptable(
            "invalid_tool_choice",
            "no server tools are on here (CHATPIPE_SERVER_TOOLS)",
            param="tool_choice",
        )
    if choice in ("auto", "required"):
        return ToolUse(tools=config.tools, choice=choice, parallel=True)
    if all(tool.function.name != choice for tool in config.tools):
        names = ", ".join(tool.function.name for tool in config.tools)
        raise NotFound(
            "tool_not_found",
            f"tool_choice names {choice!r}, which is not a server tool on here ({names})",
            param="tool_choice",
        )
    return ToolUse(tools=config.tools, choice="function", function=choice, parallel=False)


def with_server_tools(request: GenerationRequest, config: ServerToolsConfig,
                      tool_use: ToolUse | None) -> GenerationRequest:  # fmt: skip
    """The turn's first round, offered `tool_use` (unchanged without it)."""
    if tool_use is None:
        return request
    return request.model_copy(
        update={
            "tool_use": tool_use,
            "server_tools": ServerToolTurn(
                answer_id=request.request_id, max_rounds=config.max_rounds
            ),
        }
    )
