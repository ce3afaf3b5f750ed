"""The fresh-process check of a compiled AOTInductor package: what ``ferry archive`` says
when torch's loader crashes or refuses (the crash itself was seen on an H200)."""

from __future__ import annotations

from ferry.handlers.builtin.aot_check import check_failure


def test_a_crash_names_its_signal_and_archives_nothing() -> None:
    message = check_failure("r18.pt2", -11, "Fatal Python error: Segmentation fault\n")
    assert message.startswith("r18.pt2: torch crashed (SIGSEGV)")
    assert "not archived" in message
    assert "without --aot-inductor" in message


def test_an_unknown_signal_is_still_named() -> None:
    assert "(signal 99)" in check_failure("m.pt2", -99, "")


def test_a_refusal_quotes_the_last_line_of_the_checker() -> None:
    stderr = "some warning\nRuntimeError: no such package\n\n"
    message = check_failure("m.pt2", 1, stderr)
    assert "(RuntimeError: no such package)" in message
    assert check_failure("m.pt2", 3, "").endswith("(exit 3); not archived")
