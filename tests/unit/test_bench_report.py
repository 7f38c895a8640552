"""`python -m bench` rewrites its own part of bench/RESULTS.md and keeps the rest."""

from bench.report import BEGIN, END, _merged


def test_a_new_file_holds_only_the_run(tmp_path):
    path = tmp_path / "RESULTS.md"
    assert _merged(path, "# run 1\n") == f"{BEGIN}\n# run 1\n{END}\n"


def test_sections_other_benchmarks_recorded_survive_a_new_run(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(_merged(path, "# run 1\nold numbers\n") + "\n## Overload\nkept\n")
    merged = _merged(path, "# run 2\nnew numbers\n")
    assert "old numbers" not in merged and "new numbers" in merged
    assert merged.endswith(f"{END}\n\n## Overload\nkept\n")


def test_a_file_without_markers_is_replaced(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# hand-written\n")
    assert _merged(path, "# run\n") == f"{BEGIN}\n# run\n{END}\n"
