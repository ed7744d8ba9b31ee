"""The progress line of `laneway batches watch`: what it says, the rate it measures, and where it
goes (in place on a terminal, a line now and then into a pipe). Time is passed in."""

from __future__ import annotations

import io

from laneway.batch_progress import ASCII_BAR, Counts, Rate, Screen, bar, clock, line


class Terminal(io.StringIO):
    encoding = "utf-8"

    def isatty(self) -> bool:
        return True


def test_the_line_says_done_failed_rate_and_time_left() -> None:
    text = line("in_progress", Counts(total=300, completed=120, failed=3), rate=10.0, bar_width=20)
    assert text.startswith("in_progress ")
    assert " 41% 123/300 lines, 3 failed  10.0 lines/s  eta 0:00:17" in text
    assert "━" * 8 in text and len(bar(0.41, 20)) == 20


def test_no_rate_no_eta_and_an_unknown_total_while_validating() -> None:
    assert line("validating", Counts(0, 0, 0), rate=None, bar_width=0) == "validating     0% 0/? lines, 0 failed"


def test_bars_fill_and_fall_back_to_ascii() -> None:
    assert bar(0.0, 4) == "────" and bar(1.0, 4) == "━━━━" and bar(0.5, 4) == "━━──"
    assert bar(0.625, 4) == "━━╺─"
    assert bar(0.5, 4, ASCII_BAR) == "##--"
    assert clock(3725.9) == "1:02:05"


def test_rate_is_over_the_recent_window() -> None:
    rate = Rate(window_s=10.0)
    rate.add(0.0, 0)
    assert rate.per_s() is None  # one sighting: no rate yet
    rate.add(5.0, 50)
    assert rate.per_s() == 10.0
    rate.add(20.0, 60)  # slowed down: the first sighting ages out
    rate.add(25.0, 65)
    assert rate.per_s() == (65 - 50) / (25 - 5)  # from the last sighting a window or more ago


def test_a_terminal_redraws_one_line_in_place() -> None:
    screen = Screen(Terminal(), width=120)
    screen.show(0.0, "in_progress", Counts(10, 1, 0), None)
    screen.show(1.0, "in_progress", Counts(10, 2, 0), 1.0)
    screen.close()
    written = screen.stream.getvalue()
    assert written.count("\r") == 2 and written.count("\n") == 1 and written.endswith("\x1b[K\n")
    assert "2/10 lines" in written.split("\r")[-1]


def test_a_pipe_gets_a_line_per_status_and_progress_every_so_often() -> None:
    screen = Screen(io.StringIO(), width=80, every_s=10.0)
    screen.show(0.0, "validating", Counts(0, 0, 0), None)
    screen.show(1.0, "in_progress", Counts(10, 0, 0), None)  # new status: a line
    screen.show(2.0, "in_progress", Counts(10, 3, 0), 3.0)  # progress, too soon: none
    screen.show(9.0, "in_progress", Counts(10, 6, 0), 0.7)  # more, still too soon: none
    screen.show(11.5, "in_progress", Counts(10, 6, 0), 0.6)  # 10 s since the last line: a line
    screen.show(13.0, "in_progress", Counts(10, 6, 0), 0.5)  # no progress since: none
    screen.show(14.0, "completed", Counts(10, 9, 1), 0.7)  # the end: a line
    screen.close()
    lines = screen.stream.getvalue().splitlines()
    assert [ln.split()[0] for ln in lines] == ["validating", "in_progress", "in_progress", "completed"]
    assert "6/10" in lines[2] and "10/10 lines, 1 failed" in lines[3]
    assert "\r" not in screen.stream.getvalue() and "━" not in screen.stream.getvalue()
