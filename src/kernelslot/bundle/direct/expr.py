"""Checked expressions of the direct-artifact form: bounded integer arithmetic over live call facts.

Syntax is a subset of Python expressions, parsed once with :mod:`ast` into a closed tree::

    shape(x, -1)          extent of dimension -1 of tensor x (negative indices count from the end;
                          past the rank, a negative index reads a broadcast leading dimension:
                          shape 1, stride 0, as in numpy broadcasting)
    stride(out, -2)       stride in elements, same indexing
    rank(x)  numel(x)  elsize(x)  offset(x)     rank, element count, element size in bytes,
                                                storage offset in elements
    dtype(x)              the dtype name ("float32", ...): only in ``specializes`` comparisons
    eps                   an admitted scalar of the slot call (by argument name)
    + - * // %  unary -   integer arithmetic; ``/`` is rejected (write ``//``)
    min(a, b) max(a, b) cdiv(a, b)

A tensor is named by its slot argument (``x``, ``out``, ``w13``) or by an artifact resource
(``workspace.acc``). Nothing else exists: no attribute access, no pointer, no callback, no
ambient stream or group. Bounds: at most ``MAX_NODES`` nodes and depth ``MAX_DEPTH``; every
intermediate value must stay within ±2**62; dividing by zero is an evaluation error.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Callable, Mapping

MAX_NODES = 64
MAX_DEPTH = 8
LIMIT = 1 << 62
TENSOR_FUNCS = ("shape", "stride", "rank", "numel", "elsize", "offset", "dtype")
INT_FUNCS = ("min", "max", "cdiv")
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


class ExprError(ValueError):
    """An expression outside the vocabulary (at parse) or one that cannot be evaluated (at a call)."""


@dataclass(frozen=True)
class TensorFacts:
    """What an expression may read of a live tensor."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    elsize: int
    offset: int
    dtype: str

    @staticmethod
    def of(t: Any) -> "TensorFacts":
        return TensorFacts(tuple(t.shape), tuple(t.stride()), t.element_size(), t.storage_offset(),
                           str(t.dtype).removeprefix("torch."))


@dataclass(frozen=True)
class Expr:
    """A parsed expression: its text, tree, and the names it reads (tensors and scalars)."""

    text: str
    tree: ast.expr
    tensors: frozenset[str]
    scalars: frozenset[str]

    def eval(self, tensors: Mapping[str, TensorFacts], scalars: Mapping[str, int]) -> int | str:
        fn = self.__dict__.get("_fn")
        if fn is None:  # compiled once into closures over the checked tree
            fn = _compile(self.tree, self.text)
            object.__setattr__(self, "_fn", fn)
        return fn(tensors, scalars)


def _tensor_name(node: ast.expr, text: str) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("workspace", "prepared", "state"):
        return f"{node.value.id}.{node.attr}"
    raise ExprError(f"{text!r}: the first argument of a tensor function must name a tensor (a slot argument or a resource)")


def parse_expr(text: Any, *, allow_dtype: bool = False) -> Expr:
    """Parse ``text`` into an :class:`Expr` or raise :class:`ExprError` saying what is outside the vocabulary."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ExprError(f"an expression must be a string or an integer, got {text!r}")
    text = str(text)
    if len(text) > 400:
        raise ExprError(f"expression of {len(text)} characters; at most 400")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ExprError(f"{text!r} does not parse ({exc.msg})") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise ExprError(f"{text!r} has {nodes} nodes; at most {MAX_NODES}")
    tensors: set[str] = set()
    scalars: set[str] = set()

    def check(node: ast.expr, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ExprError(f"{text!r} nests deeper than {MAX_DEPTH}")
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                raise ExprError(f"{text!r}: constant {node.value!r} is not an integer")
            return
        if isinstance(node, ast.Name):
            if node.id in TENSOR_FUNCS + INT_FUNCS:
                raise ExprError(f"{text!r}: {node.id} is a function; call it")
            scalars.add(node.id)
            return
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                hint = " (integer division is //)" if isinstance(node.op, ast.Div) else ""
                raise ExprError(f"{text!r}: operator {type(node.op).__name__} is outside the vocabulary{hint}; "
                                f"allowed: {' '.join(_BINOPS.values())}")
            check(node.left, depth + 1)
            check(node.right, depth + 1)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            check(node.operand, depth + 1)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            fn, args = node.func.id, node.args
            if fn in TENSOR_FUNCS:
                if fn == "dtype" and not allow_dtype:
                    raise ExprError(f"{text!r}: dtype() is only allowed as a `specializes` key")
                want = 2 if fn in ("shape", "stride") else 1
                if len(args) != want:
                    raise ExprError(f"{text!r}: {fn}() takes {want} argument(s)")
                tensors.add(_tensor_name(args[0], text))
                if want == 2:
                    idx = args[1]
                    if isinstance(idx, ast.UnaryOp) and isinstance(idx.op, ast.USub) and isinstance(idx.operand, ast.Constant):
                        idx = ast.Constant(-idx.operand.value)
                        node.args[1] = idx
                    if not isinstance(idx, ast.Constant) or isinstance(idx.value, bool) or not isinstance(idx.value, int):
                        raise ExprError(f"{text!r}: the dimension of {fn}() must be an integer constant")
                return
            if fn in INT_FUNCS:
                if len(args) != 2:
                    raise ExprError(f"{text!r}: {fn}() takes 2 arguments")
                for a in args:
                    check(a, depth + 1)
                return
        what = ast.unparse(node) if hasattr(ast, "unparse") else type(node).__name__
        raise ExprError(f"{text!r}: {what!r} is outside the expression vocabulary; allowed: integers, slot scalars, "
                        f"{', '.join(TENSOR_FUNCS)}(tensor...), {', '.join(INT_FUNCS)}, {' '.join(_BINOPS.values())}")

    check(tree, 0)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "dtype"]
    if calls and calls[0] is not tree:
        raise ExprError(f"{text!r}: dtype() must be the whole expression")
    return Expr(text, tree, frozenset(tensors), frozenset(scalars))


def _checked(v: int, text: str) -> int:
    if not -LIMIT <= v <= LIMIT:
        raise ExprError(f"{text!r} overflows the bounded range (±2**62)")
    return v


Fn = Callable[[Mapping[str, TensorFacts], Mapping[str, int]], Any]


def _divisor(b: int, text: str) -> int:
    if b == 0:
        raise ExprError(f"{text!r}: division by zero")
    return b


_ARITH: dict[type, Callable[[int, int, str], int]] = {
    ast.Add: lambda a, b, t: a + b, ast.Sub: lambda a, b, t: a - b, ast.Mult: lambda a, b, t: a * b,
    ast.FloorDiv: lambda a, b, t: a // _divisor(b, t), ast.Mod: lambda a, b, t: a % _divisor(b, t),
}
_INT: dict[str, Callable[[int, int, str], int]] = {
    "min": lambda a, b, t: min(a, b), "max": lambda a, b, t: max(a, b), "cdiv": lambda a, b, t: -(-a // _divisor(b, t)),
}


def _compile(node: ast.expr, text: str) -> Fn:
    """Closures evaluating a tree that :func:`parse_expr` accepted (every node kind is known)."""
    if isinstance(node, ast.Constant):
        value = node.value
        return lambda ts, ss: value
    if isinstance(node, ast.Name):
        name = node.id

        def scalar(ts: Mapping, ss: Mapping) -> int:
            v = ss.get(name)
            if v is None or isinstance(v, bool) or not isinstance(v, int):
                raise ExprError(f"{text!r}: scalar {name!r} is not available here as an integer (got {v!r})")
            return v
        return scalar
    if isinstance(node, ast.UnaryOp):
        inner = _compile(node.operand, text)
        return lambda ts, ss: _checked(-inner(ts, ss), text)
    if isinstance(node, ast.BinOp):
        left, right, op = _compile(node.left, text), _compile(node.right, text), _ARITH[type(node.op)]
        return lambda ts, ss: _checked(op(left(ts, ss), right(ts, ss), text), text)
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    fn = node.func.id
    if fn in INT_FUNCS:
        left, right, op = _compile(node.args[0], text), _compile(node.args[1], text), _INT[fn]
        return lambda ts, ss: _checked(op(left(ts, ss), right(ts, ss), text), text)
    name = _tensor_name(node.args[0], text)
    index = node.args[1].value if fn in ("shape", "stride") else 0

    def read(ts: Mapping, ss: Mapping) -> Any:
        t = ts.get(name)
        if t is None:
            raise ExprError(f"{text!r}: tensor {name!r} is not available here")
        if fn in ("shape", "stride"):
            rank = len(t.shape)
            if -rank <= index < rank:
                return t.shape[index] if fn == "shape" else t.stride[index]
            if index < -rank:
                return 1 if fn == "shape" else 0
            raise ExprError(f"{text!r}: dimension {index} is out of range for {name} of rank {rank}")
        if fn == "numel":
            n = 1
            for s in t.shape:
                n *= s
            return n
        return {"rank": len(t.shape), "elsize": t.elsize, "offset": t.offset, "dtype": t.dtype}[fn]
    return read
