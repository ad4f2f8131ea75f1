"""The bundled training configurations (YAML), read by file path: ``dgl-exact train --conf NAME``."""
