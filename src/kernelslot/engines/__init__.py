"""Engine integrations: kernelslot kernels and verified bundles inside inference engines.

Each engine lives in its own subpackage and imports its engine lazily (importing
``kernelslot.engines.transformers`` does not import ``transformers``). ``e2e`` qualifies a
candidate inside the engine against the pristine model (docs/engines.md).
"""
