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
from typing import Any, Mapping

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
        return _eval(self.tree, tensors, scalars, self.text)


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


def _eval(node: ast.expr, tensors: Mapping[str, TensorFacts], scalars: Mapping[str, int], text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in scalars:
            raise ExprError(f"{text!r}: scalar {node.id!r} is not available here")
        v = scalars[node.id]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ExprError(f"{text!r}: scalar {node.id!r} is {v!r}, not an integer")
        return v
    if isinstance(node, ast.UnaryOp):
        return _checked(-_eval(node.operand, tensors, scalars, text), text)
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, tensors, scalars, text), _eval(node.right, tensors, scalars, text)
        op = type(node.op)
        if op in (ast.FloorDiv, ast.Mod) and b == 0:
            raise ExprError(f"{text!r}: division by zero")
        return _checked({ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}.get(op) if op in (ast.Add, ast.Sub, ast.Mult)
                        else a // b if op is ast.FloorDiv else a % b, text)
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    fn = node.func.id
    if fn in INT_FUNCS:
        a, b = (_eval(x, tensors, scalars, text) for x in node.args)
        if fn == "cdiv":
            if b == 0:
                raise ExprError(f"{text!r}: division by zero")
            return _checked(-(-a // b), text)
        return min(a, b) if fn == "min" else max(a, b)
    name = _tensor_name(node.args[0], text)
    if name not in tensors:
        raise ExprError(f"{text!r}: tensor {name!r} is not available here")
    t = tensors[name]
    if fn in ("shape", "stride"):
        i = node.args[1].value
        rank = len(t.shape)
        if 0 <= i < rank or -rank <= i < 0:
            return t.shape[i] if fn == "shape" else t.stride[i]
        if i < -rank:
            return 1 if fn == "shape" else 0
        raise ExprError(f"{text!r}: dimension {i} is out of range for {name} of rank {rank}")
    n = 1
    for s in t.shape:
        n *= s
    return {"rank": len(t.shape), "numel": n, "elsize": t.elsize, "offset": t.offset, "dtype": t.dtype}[fn]
