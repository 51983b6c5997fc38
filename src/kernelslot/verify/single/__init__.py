"""The single-device wing of the referee: the pipeline, CUDA-graph replay, timing and rooflines."""
