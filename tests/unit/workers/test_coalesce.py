import itertools

from workers.coalesce import ChunkPacing, Coalescer


def test_first_output_goes_at_once_then_every_interval():
    c = Coalescer(0.05)
    first = c.add("a", 1, now=0.0)
    assert first is not None and first.text == "a"
    assert c.add("b", 1, now=0.01) is None
    assert c.add("c", 1, now=0.04) is None
    out = c.add("d", 1, now=0.06)
    assert out is not None and (out.text, out.tokens) == ("bcd", 3)
    assert c.add("e", 1, now=0.07) is None
    tail = c.flush(now=0.08)
    assert tail is not None and tail.text == "e"
    assert c.flush(now=0.09) is None


def test_zero_interval_sends_everything():
    c = Coalescer(0.0)
    assert [c.add(t, 1, now=0.0).text for t in "abc"] == ["a", "b", "c"]


def test_the_interval_may_widen_between_outputs():
    c = Coalescer(0.05)
    c.add("a", 1, now=0.0)
    c.interval_s = 0.1
    assert c.add("b", 1, now=0.06) is None
    out = c.add("c", 1, now=0.11)
    assert out is not None and out.text == "bc"


def test_sends_keep_to_the_schedule_when_outputs_come_in_steps():
    # Outputs every 50 ms, a little early or late; a 100 ms interval sends every other one.
    c = Coalescer(0.1)
    sent = [
        t
        for step in range(41)
        if c.add("x", 1, now=(t := step * 0.05 + (0.003 if step % 3 else -0.003)))
    ]
    assert len(sent) == 21
    assert max(b - a for a, b in itertools.pairwise(sent)) < 0.11


def test_a_quiet_spell_does_not_bring_a_burst_after_it():
    c = Coalescer(0.1)
    c.add("a", 1, now=0.0)
    assert c.add("b", 1, now=1.0) is not None
    assert c.add("c", 1, now=1.02) is None
    assert c.add("d", 1, now=1.06) is not None  # half an interval after: catching up a little
    assert c.add("e", 1, now=1.1) is None


def test_pacing_widens_with_streams_within_its_bounds():
    pacing = ChunkPacing(0.05, 0.15, max_chunks_per_s=500)
    assert pacing.interval(1) == pacing.interval(25) == 0.05
    assert pacing.interval(50) == 0.1
    assert pacing.interval(1000) == 0.15
    assert ChunkPacing(0.05, 0.15, max_chunks_per_s=0).interval(1000) == 0.05
    assert ChunkPacing(0.05, 0.0, max_chunks_per_s=500).interval(1000) == 0.05
