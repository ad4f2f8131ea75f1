"""The bundled real dataset (Cora, ``.npz``), read by file path: :mod:`dgl_exact.data`."""
