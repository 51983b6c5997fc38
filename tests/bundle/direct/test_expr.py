"""The closed expression vocabulary: what parses, what is rejected, how it evaluates."""
from __future__ import annotations

import pytest

from kernelslot.bundle.direct.expr import ExprError, TensorFacts, parse_expr

X = TensorFacts(shape=(5, 8), stride=(8, 1), elsize=2, offset=3, dtype="bfloat16")
OUT = TensorFacts(shape=(2, 5, 4), stride=(60, 12, 1), elsize=4, offset=16, dtype="float32")


@pytest.mark.parametrize("text, value", [
    ("shape(x, -1) // 2", 4),
    ("numel(out) // shape(out, -1)", 10),
    ("stride(out, -2) * elsize(out) + offset(x)", 51),
    ("shape(x, -3)", 1),  # past the rank: a broadcast leading dimension
    ("stride(x, -3)", 0),
    ("cdiv(numel(x), 3) - min(rank(x), max(1, 7)) % 5", 12),
    ("block * 2", 64),
    ("-shape(x, 0)", -5),
])
def test_expressions_evaluate(text, value):
    assert parse_expr(text).eval({"x": X, "out": OUT}, {"block": 32}) == value


def test_dtype_only_in_specializes():
    assert parse_expr("dtype(x)", allow_dtype=True).eval({"x": X}, {}) == "bfloat16"
    with pytest.raises(ExprError, match="only allowed as a `specializes` key"):
        parse_expr("dtype(x)")
    with pytest.raises(ExprError, match="must be the whole expression"):
        parse_expr("dtype(x) + 1", allow_dtype=True)


@pytest.mark.parametrize("text, reason", [
    ("x.data_ptr()", "outside the expression vocabulary"),
    ("shape(x, -1) / 2", "integer division is //"),
    ("__import__('os')", "outside the expression vocabulary"),
    ("shape(x, n)", "must be an integer constant"),
    ("1.5 * shape(x, 0)", "not an integer"),
    ("(lambda: 0)()", "outside the expression vocabulary"),
    ("shape(x)", "takes 2 argument"),
    ("x[0]", "outside the expression vocabulary"),
    ("shape(x, 0) << 3", "outside the vocabulary"),
    ("1" + " + 1" * 40, "nodes"),
    ("min(" * 9 + "1" + ", 1)" * 9, "nests deeper"),
])
def test_outside_the_vocabulary_is_rejected(text, reason):
    with pytest.raises(ExprError, match=reason.replace("(", r"\(")):
        parse_expr(text)


@pytest.mark.parametrize("text, reason", [
    ("shape(x, 0) // (shape(x, 0) - 5)", "division by zero"),
    ("shape(x, 2)", "out of range"),
    ("numel(y)", "not available"),
    ("eps", "not available"),
    ("2305843009213693952 * 4", "overflows"),
])
def test_evaluation_errors(text, reason):
    with pytest.raises(ExprError, match=reason):
        parse_expr(text).eval({"x": X}, {})
