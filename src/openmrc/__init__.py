"""openmrc: an open Python implementation of MRC (Multipath Reliable Connection), OCP MRC 1.0."""

from openmrc import _native

_native.setup()

__version__ = "0.1.0"
