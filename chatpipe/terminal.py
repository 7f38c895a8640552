"""`chatpipe chat`: a terminal client of the native API (docs/api/native.md).

Answers stream as they arrive; the queue position shows while a turn waits.
An answer streams on a thread of its own, so the prompt still reads `/stop`,
and Ctrl-C stops the answer instead of quitting. Stopping asks the gateway to
cancel the request and drops the stream. A stream that breaks off mid-answer is
followed again from the last event printed (`Last-Event-ID`), on any gateway.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from schemas.sse import SSEMessage, iter_messages

HELP = """\
  /new            start a new conversation
  /list           your conversations, newest first
  /open N|ID      continue conversation N of /list (or by id)
  /regen          another answer to the last message
  /stop           stop the answer (Ctrl-C does too)
  /quit           leave (Ctrl-D does too)"""

STOP_GRACE_S = 2.0
"""How long a stopped answer may take to end by itself before its stream is dropped."""
RESUME_FIRST_WAIT_S = 0.5
RESUME_MAX_WAIT_S = 4.0
RESUME_TIMEOUT_S = 30.0
"""A broken-off answer is followed again after 0.5, 1, 2, 4, 4 … s, for up to 30 s
without a new event."""
RECONNECTING = "[reconnecting…]"

Stream = AbstractContextManager[tuple[httpx.Response, Iterator[SSEMessage]]]

_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: cursor moves, clearing the screen, colours
    r"|\x1b[]PX^_].*?(?:\x07|\x1b\\|\Z)"  # OSC (titles, clipboard, links), DCS, SOS, PM, APC
    r"|\x9b[0-?]*[ -/]*[@-~]"  # the same as C1 controls
    r"|[\x90\x98\x9d\x9e\x9f].*?(?:\x07|\x9c|\x1b\\|\Z)"
    r"|\x1b[ -/]*[0-~]",  # the rest: reset (ESC c), charsets, keypad modes
    re.DOTALL,
)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but newline and tab, DEL, C1 controls, and the bidi overrides and isolates
that make a line read differently from what it holds."""


def printable(text: str) -> str:
    """`text` from the model (or anyone but this client) made safe to print: escape
    sequences removed whole, any other control character dropped; the rest of Unicode
    is kept. A sequence split across two deltas loses its ESC here, so what is left of
    it prints as plain text and does nothing."""
    return _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text.replace("\r\n", "\n")))


class ApiFailure(Exception):
    """An HTTP error answer of the gateway."""

    def __init__(self, status: int, code: str, message: str, retry_after: str | None) -> None:
        super().__init__(message)
        self.status, self.code, self.retry_after = status, code, retry_after

    @classmethod
    def of(cls, response: httpx.Response) -> ApiFailure:
        try:
            error = response.json()["error"]
            code, message = error["code"], error["message"]
        except (ValueError, KeyError, TypeError):
            code, message = f"http_{response.status_code}", response.text[:200]
        return cls(response.status_code, code, message, response.headers.get("retry-after"))

    def __str__(self) -> str:
        retry = f" (retry in {self.retry_after} s)" if self.retry_after else ""
        return f"{self.status} {self.code}: {self.args[0]}{retry}"


class ChatApi:
    """The native API routes this client uses, over one httpx client."""

    def __init__(self, url: str, api_key: str, model: str | None) -> None:
        self.model = model
        self.http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(30.0, read=None),
        )

    def close(self) -> None:
        self.http.close()

    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self.http.request(method, path, json=body)
        if response.is_error:
            raise ApiFailure.of(response)
        return response.json()

    def models(self) -> list[str]:
        return [m["id"] for m in self._json("GET", "/v1/models")["data"]]

    def new_conversation(self) -> str:
        return self._json("POST", "/v1/conversations", {})["conversation_id"]

    def conversations(self, limit: int = 20) -> list[dict[str, Any]]:
        return self._json("GET", f"/v1/conversations?limit={limit}")["data"]

    def thread(self, conversation_id: str) -> list[dict[str, Any]]:
        """The selected thread's messages, root first."""
        detail = self._json("GET", f"/v1/conversations/{conversation_id}")
        by_id = {m["message_id"]: m for m in detail["messages"]}
        return [by_id[i] for i in detail["thread"] if i in by_id]

    def cancel(self, request_id: str) -> None:
        self.http.post(f"/v1/requests/{request_id}/cancel")

    def answer(self, path: str, body: dict[str, Any]) -> Stream:
        """POST a turn; yields the response and its SSE messages as they arrive."""
        if self.model:
            body = {**body, "model": self.model}
        return self._events("POST", path, json=body)

    def resume(self, request_id: str, last_event_id: str | None) -> Stream:
        """The answer's events after `last_event_id` (all of them with None), live until
        its end, from any gateway."""
        headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
        return self._events("GET", f"/v1/requests/{request_id}/events", headers=headers)

    @contextmanager
    def _events(self, method: str, path: str, **options: Any) -> Iterator[
            tuple[httpx.Response, Iterator[SSEMessage]]]:  # fmt: skip
        with self.http.stream(method, path, **options) as response:
            if response.is_error:
                response.read()
                raise ApiFailure.of(response)
            yield response, iter_messages(response.iter_lines())


@dataclass
class Answer:
    """One answer being streamed, on its own thread."""

    path: str
    body: dict[str, Any]
    request_id: str | None = None
    message_id: str | None = None
    last_event_id: str | None = None
    ending: str = ""
    """What to print once the answer ends."""
    mid_line: bool = False
    """The answer's last line printed so far is not finished."""
    halt: threading.Event = field(default_factory=threading.Event)
    response: httpx.Response | None = None
    thread: threading.Thread | None = None

    @property
    def stopped(self) -> bool:
        return self.halt.is_set()


class TerminalChat:
    """The prompt loop. Everything it prints goes through `say`, under one lock."""

    def __init__(self, api: ChatApi, conversation_id: str | None, out: TextIO = sys.stdout):
        self.api = api
        self.conversation_id: str | None = None
        self._resume = conversation_id
        self.out = out
        self.last_answer: str | None = None  # the message /regen answers again
        self.answer: Answer | None = None
        self._conversations: list[str] = []
        self._lock = threading.RLock()
        self._prompted = False
        self._passing_line = False  # the line below the text (queue position, reconnecting)

    # --- output -------------------------------------------------------------------

    def say(self, text: str, end: str = "\n") -> None:
        with self._lock:
            if self._passing_line:
                self.out.write("\r\x1b[2K")
                self._passing_line = False
            self.out.write(printable(text) + end)
            self.out.flush()

    def _say_in_passing(self, text: str) -> None:
        """A line the next output replaces."""
        with self._lock:
            self.say(text, end="")
            self._passing_line = True

    def _prompt(self) -> None:
        with self._lock:
            if not self._prompted and self.answer is None:
                self.say("> ", end="")
                self._prompted = True

    # --- the loop -----------------------------------------------------------------

    def run(self) -> int:
        # Ctrl-C stops an answer even when this process was started with SIGINT ignored
        # or blocked (a parent's disposition and mask are inherited across exec).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        try:
            models = self.api.models()
        except (ApiFailure, httpx.HTTPError) as error:
            self.say(f"cannot use {self.api.http.base_url}: {error}")
            return 1
        model = self.api.model or (models[0] if models else "?")
        self.say(f"chatpipe at {self.api.http.base_url} · model {model}. /help for commands.")
        if self._resume:
            self.handle(f"/open {self._resume}")
        while True:
            self._prompt()
            try:
                line = input()
                self._prompted = False
                if not self.handle(line.strip()):
                    self.stop()
                    return 0
            except KeyboardInterrupt:
                self._prompted = False
                if self.answer is not None:
                    self.stop()
                else:
                    self.say("\n(/quit or Ctrl-D to leave)")
            except EOFError:
                self.stop()
                self.say("")
                return 0

    def handle(self, line: str) -> bool:
        """Act on one line; False to leave."""
        command, _, argument = line.partition(" ")
        busy = self.answer is not None
        try:
            match command:
                case "":
                    pass
                case "/quit" | "/exit":
                    return False
                case "/help":
                    self.say(HELP)
                case "/stop" if busy:
                    self.stop()
                case "/stop":
                    self.say("(nothing to stop)")
                case _ if busy:
                    self.say("(an answer is streaming: /stop or Ctrl-C first)")
                case "/new":
                    self.conversation_id, self.last_answer = None, None
                    self.say("(new conversation)")
                case "/list":
                    self._list()
                case "/open":
                    self._open(argument.strip())
                case "/regen":
                    self._regenerate()
                case _ if command.startswith("/"):
                    self.say(f"(unknown command {command}; /help)")
                case _:
                    self._send(line)
        except (ApiFailure, httpx.HTTPError) as error:
            self.say(f"[error: {error}]")
        return True

    # --- commands -----------------------------------------------------------------

    def _list(self) -> None:
        conversations = self.api.conversations()
        self._conversations = [c["conversation_id"] for c in conversations]
        if not conversations:
            self.say("(no conversations yet)")
        for n, c in enumerate(conversations, 1):
            mark = "*" if c["conversation_id"] == self.conversation_id else " "
            self.say(f"{mark}{n:3}  {c['title'] or '(untitled)'}  [{c['conversation_id']}]")

    def _open(self, which: str) -> None:
        if which.isdigit() and 0 < int(which) <= len(self._conversations):
            which = self._conversations[int(which) - 1]
        if not which:
            self.say("(/open N after /list, or /open ID)")
            return
        messages = self.api.thread(which)
        self.conversation_id = which
        for message in messages:
            who = "you" if message["role"] == "user" else "chatpipe"
            self.say(f"{who}: {message['content']}")
        answers = [m["message_id"] for m in messages if m["role"] == "assistant"]
        self.last_answer = answers[-1] if answers else None

    def _send(self, text: str) -> None:
        if self.conversation_id is None:
            self.conversation_id = self.api.new_conversation()
        self._start(Answer(f"/v1/conversations/{self.conversation_id}/messages", {"content": text}))

    def _regenerate(self) -> None:
        if self.conversation_id is None or self.last_answer is None:
            self.say("(no answer to regenerate yet)")
            return
        path = f"/v1/conversations/{self.conversation_id}/messages/{self.last_answer}/regenerate"
        self._start(Answer(path, {}))

    # --- answers ------------------------------------------------------------------

    def _start(self, answer: Answer) -> None:
        self.answer = answer
        answer.thread = threading.Thread(target=self._stream, args=(answer,), daemon=True)
        answer.thread.start()

    def stop(self) -> None:
        """Stop the answer streaming now, if there is one, and wait for it to end."""
        answer = self.answer
        if answer is None:
            return
        answer.halt.set()
        if answer.request_id is not None:
            with suppress(httpx.HTTPError):
                self.api.cancel(answer.request_id)
        assert answer.thread is not None
        answer.thread.join(STOP_GRACE_S)
        if answer.thread.is_alive() and answer.response is not None:
            answer.response.close()  # the reader fails, and the gateway cancels on disconnect
            answer.thread.join(STOP_GRACE_S)

    def _stream(self, answer: Answer) -> None:
        # Ctrl-C must reach the main thread, which waits in input(): a SIGINT the kernel
        # hands to this thread only sets Python's flag, and input() goes on waiting.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            ending = self._follow(answer)
        except ApiFailure as error:
            ending = f"[error: {error}]"
        except Exception as error:  # noqa: BLE001 - whatever broke the stream, the prompt must come back
            ending = f"[connection lost: {error!r}]"
        if answer.stopped:
            ending = "[stopped]"
        with self._lock:
            self.say("" if not ending else f"\n{ending}")
            self.answer = None
            self._prompt()

    def _follow(self, answer: Answer) -> str:
        """Print the answer to its end; returns what to print then. A stream that breaks
        off mid-answer is followed again from the last event printed, waiting longer after
        each failed try, until the answer ends, is stopped, or nothing new came for
        RESUME_TIMEOUT_S."""
        stream = self.api.answer(answer.path, answer.body)
        wait, deadline, noted = RESUME_FIRST_WAIT_S, None, False
        while True:
            seen = answer.last_event_id
            try:
                if self._read(answer, stream):
                    return answer.ending
                broke: Exception = ConnectionError("the stream ended before the answer")
            except (ApiFailure, httpx.HTTPError) as error:
                broke = error
            if answer.stopped or answer.request_id is None:
                raise broke
            if isinstance(broke, ApiFailure):  # unknown request or event id: no way back
                return f"[connection lost: {broke}]"
            if deadline is None or answer.last_event_id != seen:
                wait, noted = RESUME_FIRST_WAIT_S, False
                deadline = time.monotonic() + RESUME_TIMEOUT_S
            elif time.monotonic() > deadline:
                return (
                    f"[connection lost: no way back to the answer for "
                    f"{RESUME_TIMEOUT_S:.0f} s ({broke!r}); /open the conversation for "
                    "what was saved]"
                )
            if not noted:
                self._say_in_passing(("\n" if answer.mid_line else "") + RECONNECTING)
                answer.mid_line, noted = False, True
            if answer.halt.wait(wait):
                return ""
            wait = min(wait * 2, RESUME_MAX_WAIT_S)
            stream = self.api.resume(answer.request_id, answer.last_event_id)

    def _read(self, answer: Answer, stream: Stream) -> bool:
        """Print the events of `stream`; True once the answer ended (or was stopped),
        False if the stream stopped short."""
        with stream as (response, messages):
            answer.response = response
            for message in messages:
                if answer.stopped or message.is_done:
                    return True
                if message.id is not None:
                    answer.last_event_id = message.id
                answer.ending = self._show(answer, message) or answer.ending
        return False

    def _show(self, answer: Answer, message: SSEMessage) -> str | None:
        """Print one event; returns what to print once the answer ends, if anything."""
        data = message.json()
        match message.event:
            case "request":
                answer.request_id, answer.message_id = data["request_id"], data["message_id"]
                self.last_answer = data["message_id"]
            case "queued":
                eta = f" · about {max(1, round(data['eta_ms'] / 1000))} s" if data["eta_ms"] else ""
                self._say_in_passing(f"[waiting in line: position {data['position']}{eta}]")
            case "model":
                self.say(f"[answered by {data['model']}: {data['reason']}]")
            case "delta":
                self.say(data["delta"], end="")
                answer.mid_line = not data["delta"].endswith("\n")
            case "retract":
                return f"[withdrawn by the safety filter ({data['reason']})] {data['replacement']}"
            case "error":
                retry = f"; try again in {data['retry_after']:.0f} s" if data["retry_after"] else ""
                return f"[error {data['code']}: {data['message']}{retry}]"
            case "done" if data["status"] == "finished_length":
                return "[stopped at the length limit]"
        return None


def run_terminal(url: str, api_key: str, model: str | None, conversation_id: str | None) -> int:
    api = ChatApi(url, api_key, model)
    try:
        return TerminalChat(api, conversation_id).run()
    finally:
        api.close()
