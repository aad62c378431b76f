"""The calculator: exact arithmetic through `ast`, every refusal an error observation."""

from __future__ import annotations

import pytest

from literl.tools import calculator


@pytest.mark.parametrize("expression, expected", [
    ("3+4*5-2", "21"),            # precedence: 4*5=20, 3+20=23, 23-2=21
    ("(3+4)*5/2", "17.5"),        # 7*5=35, 35/2=17.5
    ("7/2*2", "7"),               # exact fractions: 7/2 = 3.5 exactly, *2 = 7 (an integer, shown without .0)
    ("0.1+0.2", "0.3"),           # Fraction(0.1)+Fraction(0.2) is the sum of the two doubles, 0.30000000000000004..,
                                  # shown with 12 significant digits: 0.3
    ("-2**2", "-4"),              # Python's precedence: -(2**2)
    ("2^10", "1024"),             # ^ is read as a power, as people write it
    ("17//5 + 17%5", "5"),        # 3 + 2
    ("1/3", "0.333333333333"),
])
def test_calculator_computes_hand_checked_values(expression, expected):
    assert calculator(expression) == expected
    assert calculator(expression).__class__ is str     # a plain result: status ok


@pytest.mark.parametrize("expression, message", [
    ("1/0", "division by zero"),
    ("__import__('os').system('true')", "is not arithmetic"),
    ("x+1", "is not arithmetic"),
    ("2**0.5", "whole-number exponents"),
    ("10**2000", "larger than 1000"),
    ("99**999", "would exceed 10^1000"),     # 999 * 2 digits = 1998 > 1000
    ("3+", "cannot read"),
])
def test_calculator_refusals_are_error_observations_not_exceptions(expression, message):
    out = calculator(expression)
    assert out.startswith("Error: ") and message in out
    assert out.status == "error"
