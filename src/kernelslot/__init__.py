"""kernelslot: a referee, a kernel library and engine integration for LLM inference kernel slots."""
__version__ = "0.1.0"
