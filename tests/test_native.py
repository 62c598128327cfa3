"""Which modules run compiled (`openmrc._native`)."""

from __future__ import annotations

from openmrc import _native


def test_a_compiled_module_since_moved_is_imported_from_where_it_is_now() -> None:
    """A build that compiled ``openmrc.provider.udp`` when it was a module is out of date once it is a
    package: the package is imported as it is now, not looked for as ``udp.py``."""
    finder = _native._SourceOnly(frozenset({"openmrc.provider.udp", "openmrc.provider.udp.device"}))
    assert finder.find_spec("openmrc.provider.udp", None) is None
    spec = finder.find_spec("openmrc.provider.udp.device", None)
    assert spec is not None and spec.origin is not None and spec.origin.endswith("udp/device.py")
