"""Bundles: manifest.toml + sources, content hashing, candidate loading."""
from kernelslot.bundle.hashing import bundle_hash
from kernelslot.bundle.loader import Bundle, load_bundle, resolve_callables, static_problems
from kernelslot.bundle.manifest import ABI_VERSION, Manifest, ManifestError, OpRow, load_manifest

__all__ = ["bundle_hash", "Bundle", "load_bundle", "resolve_callables", "static_problems", "ABI_VERSION",
           "Manifest", "ManifestError", "OpRow", "load_manifest"]
