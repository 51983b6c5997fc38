"""Fills the output with a constant: plausible, finite, and wrong."""
SLOT = "norm.rmsnorm"
CATCHES = {"compare"}


def entry(x, weight, out, eps):
    out.fill_(0.5)
