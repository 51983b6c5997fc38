"""Bundles: manifest.toml + sources, content hashing, candidate loading."""
from kernelslot.bundle.hashing import bundle_hash
from kernelslot.bundle.loader import Bundle, load_bundle
from kernelslot.bundle.manifest import ManifestError, load_manifest

__all__ = ["bundle_hash", "Bundle", "load_bundle", "ManifestError", "load_manifest"]
