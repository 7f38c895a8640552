"""The server tools' settings (composed into `chatpipe.settings.Settings`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator


class ServerToolsSettings(BaseModel):
    """The tools chatpipe runs itself, their time limit and the rounds a turn may take."""

    server_tools: list[str] = Field(
        default_factory=lambda: ["calculator", "clock", "search_documents"],
        description="tools chatpipe runs itself (the chat.tools stage) that a native turn "
        "may offer the model (tool_choice); any of calculator, clock, search_documents; "
        "empty: none",
    )
    server_tool_timeout_s: float = Field(
        10.0, gt=0, description="a server tool call running longer gives the model an error result"
    )
    max_tool_rounds: int = Field(
        4,
        ge=1,
        description="tool rounds one native turn may take; after them the model is "
        "shown no tools and answers in text",
    )

    @model_validator(mode="after")
    def _check_server_tools(self) -> ServerToolsSettings:
        from servertools.catalog import SPECS

        unknown = sorted(set(self.server_tools) - set(SPECS))
        if unknown:
            raise ValueError(f"server_tools: unknown {unknown}; known: {sorted(SPECS)}")
        return self
