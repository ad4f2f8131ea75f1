"""``dgl_exact._docs``: docstring fragments written once, filled in where a line names them."""
import pytest

from dgl_exact._docs import doc_filler


def test_a_fragment_line_becomes_the_fragment_at_its_indentation_with_the_name_filled_in():
    fill = doc_filler({"params": "x : int\n    The {name}'s input.\n\ny : int"})

    @fill
    class Layer:
        """Summary.

        Parameters
        ----------
        %(params)s
        """

    assert Layer.__doc__.splitlines()[4:8] == ["        x : int", "            The Layer's input.", "",
                                              "        y : int"]


def test_an_unknown_fragment_raises_at_definition():
    with pytest.raises(KeyError, match="nope"):
        @doc_filler({})
        def f():
            """%(nope)s"""


def test_the_drop_ins_render_their_shared_text():
    pytest.importorskip("torch_geometric")
    from dgl_exact import pyg

    for cls in (pyg.GATConv, pyg.GATv2Conv):
        assert "heads : int, default 1\n        Attention heads." in cls.__doc__
        assert f">>> conv = {cls.__name__}(16, 8, heads=3" in cls.__doc__
    assert "%(" not in "".join(c.__doc__ for c in (pyg.GCNConv, pyg.GCN2Conv, pyg.SAGEConv))
