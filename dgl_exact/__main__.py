"""``python -m dgl_exact``: the ``dgl-exact`` command (:func:`dgl_exact.cli.main`)."""
from .cli import main

main()
