"""Root pytest configuration: how nbval compares notebook outputs.

Only plain-text outputs are compared (and only in cells marked ``# NBVAL_CHECK_OUTPUT``, since the
test command runs nbval in lax mode); rich outputs that differ between runs without meaning anything
— HTML tables, SVG/PNG images, widgets, JavaScript, progress bars on stderr — are never compared.
"""

SKIPPED_OUTPUTS = (
    "text/html",
    "image/svg+xml",
    "image/png",
    "application/javascript",
    "application/vnd.jupyter.widget-view+json",
    "stderr",
)


def pytest_collectstart(collector):
    if getattr(collector, "path", None) is not None and collector.path.suffix == ".ipynb":
        collector.skip_compare += SKIPPED_OUTPUTS
