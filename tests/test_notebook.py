"""apexlite.notebook: a notebook's code cells as one program (IPython lines kept out of Python's way, cell
magics that are not Python left out) and the notebook rebuilt around new cell sources, byte for byte
where nothing changed."""
import json
from pathlib import Path

import pytest

from apexlite.notebook import NBFORMAT_LAYOUT, NotebookError, dump, read_notebook

NOTEBOOK = Path(__file__).parent / "migrate" / "notebooks" / "amp_training.ipynb"


def notebook(cells, metadata=None, layout=NBFORMAT_LAYOUT, final_newline=True):
    document = {"cells": cells, "metadata": metadata if metadata is not None else {
        "kernelspec": {"language": "python", "name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    return dump(document, layout, final_newline)


def code(source, as_list=True):
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": source.splitlines(True) if as_list else source}


def test_program_is_the_code_cells_in_order_with_ipython_lines_held_apart():
    data = NOTEBOOK.read_bytes()
    book = read_notebook(data, "nb.ipynb")
    program = book.program().decode()
    compile(program, "program", "exec")
    assert "!pip" not in program and "%matplotlib" not in program and "model?" not in program
    assert "Training with apex.amp" not in program  # markdown stays out
    assert "echo 'from apex import amp'" not in program  # a %%bash cell is not Python: kept out
    assert book.kept_cells == [(5, "%%bash")]
    assert "with amp.scale_loss(loss, optimizer) as scaled_loss:" in program  # %%time runs its body as Python
    assert book.program_cells == [1, 2, 4, 6]


@pytest.mark.parametrize("layout", [NBFORMAT_LAYOUT, dict(indent=2, sort_keys=False, ensure_ascii=True),
                                    dict(indent=None, sort_keys=False, ensure_ascii=False)])
@pytest.mark.parametrize("final_newline", [True, False])
def test_unchanged_program_rebuilds_the_same_bytes(layout, final_newline):
    cells = [code("x = 1\n\n"), code("y = 'é'", as_list=False), code(""), code("%time z = 2\nfor i in range(2):\n"
                                                                              "    !echo {i}\n"),
             code("! cd /tmp && \\\n    make install\n!echo done \\\nnext\nw = 3")]
    data = notebook(cells, layout=layout, final_newline=final_newline)
    book = read_notebook(data, "nb.ipynb")
    assert book.layout is not None  # a layout json.dumps reproduces (sorted keys may match unsorted ones)
    compile(book.program(), "program", "exec")  # IPython lines, continuations included, are out of the way
    assert book.rebuilt(book.program()) == data


def test_rebuilt_changes_only_the_sources_of_changed_cells():
    data = NOTEBOOK.read_bytes()
    book = read_notebook(data, "nb.ipynb")
    program = book.program().replace(b"losses = []", b"losses = [0.0]")
    rebuilt = json.loads(book.rebuilt(program))
    original = json.loads(data)
    changed = [index for index, (a, b) in enumerate(zip(original["cells"], rebuilt["cells"])) if a != b]
    assert changed == [4]
    assert rebuilt["cells"][4]["source"][1] == "losses = [0.0]\n" and rebuilt["cells"][4]["source"][0] == "%%time\n"
    assert rebuilt["cells"][4]["outputs"] == original["cells"][4]["outputs"]
    assert {key: value for key, value in rebuilt.items() if key != "cells"} == \
        {key: value for key, value in original.items() if key != "cells"}


def test_a_magic_moved_into_a_block_keeps_its_line():
    book = read_notebook(notebook([code("!nvidia-smi\nx = 1")]), "nb.ipynb")
    program = book.program().decode().replace("pass  #", "if True:\n    pass  #")
    assert json.loads(book.rebuilt(program.encode()))["cells"][0]["source"] == ["if True:\n", "    !nvidia-smi\n",
                                                                             "x = 1"]


def test_a_block_spanning_cells_is_refused():
    book = read_notebook(notebook([code("a = 1"), code("b = 2")]), "nb.ipynb")
    lines = book.program().decode().splitlines()
    spanning = "\n".join([lines[0], "with ctx():", *("    " + line for line in lines[1:])]) + "\n"
    with pytest.raises(NotebookError, match="puts cell 2 inside a block that begins in cell 1"):
        book.rebuilt(spanning.encode())


def test_line_of_the_program_names_its_cell():
    data = NOTEBOOK.read_bytes()
    book = read_notebook(data, "nb.ipynb")
    program = book.program()
    line = program.decode().splitlines().index("from apex import amp") + 1
    assert book.cell_of_line(line, program) == (2, 4)


@pytest.mark.parametrize("data,message", [
    (b"{not json", "not a Jupyter notebook (not JSON"),
    (b'{"worksheets": [], "nbformat": 3}', "nbformat 3: convert it"),
    (json.dumps({"cells": [], "metadata": {"kernelspec": {"language": "R"}}, "nbformat": 4}).encode(),
     "is a R notebook, not a Python one"),
    (json.dumps({"cells": [1], "metadata": {}, "nbformat": 4}).encode(), "a cell is not a JSON object"),
])
def test_what_is_not_a_python_notebook_is_refused(data, message):
    with pytest.raises(NotebookError) as raised:
        read_notebook(data, "x.ipynb")
    assert message in str(raised.value)
