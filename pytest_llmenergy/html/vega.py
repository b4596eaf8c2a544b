"""The charting library, inlined: Vega, Vega-Lite and vega-embed as one script.

vl-convert-python (the Vega project's own converter) carries the three libraries and
bundles them into one classic script that defines ``window.vegaEmbed``; the report
inlines it, so it opens from disk with no network.  Why Vega-Lite and not plotly:
``docs/report.md``.
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import ConfigError

INSTALL_HINT = "pip install 'pytest-llmenergy[report]'"


def check_available() -> None:
    """Fail early (session start, before any measurement) when the library is missing."""
    try:
        import vl_convert  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"the HTML report needs vl-convert-python, which is not installed: {INSTALL_HINT}"
        ) from None


def versions() -> str:
    """What the report inlines, for its footer and the bundle's comment."""
    import vl_convert

    lite = vl_convert.get_vegalite_versions()[-1]
    return (
        f"Vega {vl_convert.get_vega_version()}, Vega-Lite {lite}, "
        f"vega-embed {vl_convert.get_vega_embed_version()} (BSD-3-Clause), "
        f"bundled by vl-convert-python {getattr(vl_convert, '__version__', '')}".rstrip()
    )


@lru_cache(maxsize=1)
def bundle() -> str:
    """The libraries as one script (about 0.9 MB); built once per process (a few seconds)."""
    check_available()
    import vl_convert

    return str(vl_convert.javascript_bundle())
