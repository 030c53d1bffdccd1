"""The Quarter value: parse, label, order, shift, start date and decimal years."""

from __future__ import annotations

import datetime

import numpy as np
import pytest

from geodbk.errors import InputDataError
from geodbk.quarters import Quarter, parse_quarter_label, quarter_years


@pytest.mark.parametrize("year", [1999, 2019, 2023, 2024])
@pytest.mark.parametrize("number", [1, 2, 3, 4])
def test_label_and_parse_round_trip(year: int, number: int) -> None:
    quarter = Quarter(year, number)
    assert str(quarter) == f"{year}Q{number}"
    assert Quarter.parse(str(quarter)) == quarter
    assert Quarter.parse(quarter) is quarter
    assert parse_quarter_label(str(quarter).lower()) == (year, number)


def test_parse_takes_the_forms_the_cli_takes() -> None:
    assert Quarter.parse(" 2023q4 ") == Quarter(2023, 4)
    assert Quarter.parse_list("2023Q1, 2023q4") == [Quarter(2023, 1), Quarter(2023, 4)]
    assert Quarter.parse_list(["2020Q3", Quarter(2021, 2)]) == [Quarter(2020, 3), Quarter(2021, 2)]
    assert Quarter.parse_list(" , ") == []
    assert Quarter.parse_span("2022Q4: 2023q4") == (Quarter(2022, 4), Quarter(2023, 4))


@pytest.mark.parametrize("bad", ["2023-4", "2023Q5", "2023Q0", "23Q1", "", "Q4-2023", "2023Q4x", None, 2023.875])
def test_bad_quarters_are_one_line_input_errors(bad: object) -> None:
    with pytest.raises(InputDataError, match="write it like 2023Q4"):
        Quarter.parse(bad)  # type: ignore[arg-type]


def test_bad_numbers_and_spans_are_input_errors() -> None:
    with pytest.raises(InputDataError, match="1-4"):
        Quarter(2023, 5)
    with pytest.raises(InputDataError, match="--change takes FROM:TO"):
        Quarter.parse_span("2022Q4", "--change")
    with pytest.raises(InputDataError, match="2023Q9"):
        Quarter.parse_span("2022Q4:2023Q9")


def test_quarters_order_by_time() -> None:
    labels = ["2023Q1", "2021Q4", "2022Q2", "2021Q1"]
    assert [str(q) for q in sorted(map(Quarter.parse, labels))] == sorted(labels)
    assert Quarter(2022, 4) < Quarter(2023, 1) and max(Quarter(2020, 3), Quarter(2019, 4)) == Quarter(2020, 3)


@pytest.mark.parametrize(
    ("start", "n", "expected"),
    [
        ("2023Q4", 1, "2024Q1"),
        ("2024Q1", -1, "2023Q4"),
        ("2023Q3", -4, "2022Q3"),
        ("2022Q2", 7, "2024Q1"),
        ("2020Q1", 0, "2020Q1"),
        ("2019Q1", -9, "2016Q4"),
    ],
)
def test_shift_crosses_year_ends(start: str, n: int, expected: str) -> None:
    assert str(Quarter.parse(start).shift(n)) == expected
    assert Quarter.parse(expected).shift(-n) == Quarter.parse(start)


def test_start_dates() -> None:
    assert Quarter(2023, 1).start == datetime.date(2023, 1, 1)
    assert Quarter(2023, 4).start == datetime.date(2023, 10, 1)
    assert Quarter(2023, 4).shift(1).start == datetime.date(2024, 1, 1)


def test_decimal_years_equal_quarter_years_and_map_back() -> None:
    years, numbers = np.repeat(np.arange(2016, 2026), 4), np.tile(np.arange(1, 5), 10)
    expected = quarter_years(years, numbers)
    got = np.array([Quarter(int(y), int(q)).years for y, q in zip(years, numbers, strict=True)])
    np.testing.assert_array_equal(got, expected)
    assert Quarter(2023, 4).years == 2023.875
    for value, y, q in zip(expected, years, numbers, strict=True):
        assert Quarter.of_years(value) == Quarter(int(y), int(q))
    assert Quarter.of_years(2024.0) == Quarter(2024, 1)  # a quarter's first instant is in it
    assert Quarter.of_years(2023.9999) == Quarter(2023, 4)


def test_quarter_indices_are_consecutive_ordered_and_read_back() -> None:
    years, numbers = np.repeat(np.arange(2016, 2026), 4), np.tile(np.arange(1, 5), 10)
    index = Quarter.index_of(years, numbers)
    assert index.dtype == np.int64 and index.shape == (40,)
    np.testing.assert_array_equal(np.diff(index), 1)  # one per quarter, across year ends
    assert [Quarter.of_index(i) for i in index] == [Quarter(int(y), int(q)) for y, q in zip(years, numbers, strict=True)]
    assert Quarter(2023, 4).index == int(Quarter.index_of(2023, 4)) == Quarter(2024, 1).index - 1
    assert Quarter.of_index(Quarter(2019, 1).shift(-9).index) == Quarter(2016, 4)
