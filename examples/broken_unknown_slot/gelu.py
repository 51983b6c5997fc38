def gelu_and_mul(x, out):
    raise RuntimeError("never reached")
