"""Print the requirements of dgl_exact without DGL, one per line, for CI's no-DGL environment (.ci/run):
setup.cfg's install_requires less DGL and what only DGL and the DGL front end import, plus the extras named
on the command line (``python .ci/requirements_without_dgl.py test pyg``). Read from setup.cfg, so a
dependency added there reaches this environment too."""
import configparser
import pathlib
import re
import sys

#: DGL, the packages DGL 2.1.0 imports without declaring them (setup.cfg says so beside them), and ogb
#: (read by dgl_exact.data's ogbn loader, through DGL)
DGL_ONLY = {"dgl", "packaging", "pandas", "pydantic", "ogb"}


def _lines(value: str):
    for line in value.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            yield line


def requirements(extras):
    cfg = configparser.ConfigParser()
    cfg.read(pathlib.Path(__file__).resolve().parents[1] / "setup.cfg")
    out = [r for r in _lines(cfg["options"]["install_requires"])
           if re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() not in DGL_ONLY]
    for extra in extras:
        if extra not in cfg["options.extras_require"]:
            sys.exit(f"error: setup.cfg has no extra {extra!r}; its extras: "
                     f"{', '.join(cfg['options.extras_require'])}")
        out.extend(_lines(cfg["options.extras_require"][extra]))
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
