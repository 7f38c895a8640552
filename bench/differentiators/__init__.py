"""`python -m bench differentiators`: what chatpipe promises beyond an engine's own
server, measured on a pipeline of processes (sim engine, embedded broker), recorded in
bench/RESULTS.md.

    .venv/bin/python -m bench differentiators [--kills 100] [--no-write]   # minutes

- queue-position ETA error under a backlog (`eta`),
- retraction latency and what the client saw before it (`retraction`),
- cancel latency and the tokens generated after a hang-up (`cancel_latency`),
- resume success over gateway kills (`resume`).

`suite` runs them in turn and writes the section.
"""
