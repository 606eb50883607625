"""Line numbers from one plain code generation (apexlite.migrate.lines) are libcst's PositionProvider's
start lines, node for node, on every golden input (CRLF, tabs, latin-1, multi-line strings included)."""
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from apexlite.migrate.lines import LineIndex

HERE = Path(__file__).parent
SOURCES = sorted((HERE / "golden").glob("*.in.py")) + [HERE / "scripts" / "comments_around_amp.py"]
STRINGS = b'x = """a\nb\r\nc"""\nif x:\r\n    y = (1,\n         2)  # c\n\n\n@d\ndef f(\n    a,\n):\n    return a\n'


@pytest.mark.parametrize("source", [path.read_bytes() for path in SOURCES] + [STRINGS],
                         ids=[path.name for path in SOURCES] + ["strings-and-line-endings"])
def test_every_node_starts_on_the_line_position_provider_gives(source):
    module = cst.parse_module(source)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    lines = LineIndex(module)
    assert len(positions) > 10
    assert [(type(node).__name__, lines.line(node)) for node in positions] == \
        [(type(node).__name__, position.start.line) for node, position in positions.items()]
