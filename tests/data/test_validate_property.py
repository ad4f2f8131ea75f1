"""Property: a small valid dataset in each real layout (GraphSAINT files in PyG's raw/ folder and in DGL's folder,
ogb's folder), with one file mutated (dropped, truncated, emptied, its values retyped, its ids shifted out of
range), either loads to exactly the valid dataset's data or is refused with one error naming a file of the
dataset (the CLI turns that into ``error: ...``, exit 2). Never another exception, never different data."""
import gzip
import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgl_exact.data import DatasetNotFoundError, load_dataset
from dgl_exact.data.base import DatasetFileError
from dgl_exact.data.dgl_builtin import DGL_SPECS, dgl_raw_folder_name
from tests.cli._helpers import _in_tmp_and_signals_restored, assert_one_line_error, run  # noqa: F401
from tests.data._helpers import _csv_gz, make_graphsaint, make_ogb

pytestmark = pytest.mark.usefixtures("closed_stdin")

N = 30          # ogb nodes
NS = 50         # GraphSAINT nodes (make_graphsaint's split sizes are for 50)
RETYPE = ["float", "half", "string", "bool"]

# (file, field, mutations) per layout; field None: the whole file
GRAPHSAINT = [("adj_full.npz", "indices", RETYPE + ["shift"]), ("adj_full.npz", "indptr", RETYPE),
              ("adj_full.npz", "shape", RETYPE + ["0d"]), ("feats.npy", None, ["string"]),
              ("class_map.json", "values", RETYPE + ["shift", "null"]),
              ("class_map.json", "keys", ["half", "shift"]),
              ("role.json", "tr", RETYPE + ["shift", "null"]), ("role.json", "va", RETYPE + ["shift", "null"]),
              ("role.json", "te", RETYPE + ["shift", "null"])]
OGB = [("raw/edge.csv.gz", None, RETYPE + ["shift"]), ("raw/num-node-list.csv.gz", None, RETYPE + ["shrink"]),
       ("raw/num-edge-list.csv.gz", None, ["string", "shift"]), ("raw/node-feat.csv.gz", None, ["string", "drop-row"]),
       ("raw/node-label.csv.gz", None, RETYPE + ["shift"]), ("raw/node_year.csv.gz", None, ["string", "drop-row"]),
       ("split/time/train.csv.gz", None, RETYPE + ["shift", "two-columns"]),
       ("split/time/valid.csv.gz", None, RETYPE + ["shift", "two-columns"]),
       ("split/time/test.csv.gz", None, RETYPE + ["shift", "two-columns"])]
WHOLE_FILE = ["delete", "truncate", "empty"]


def _retype(a: np.ndarray, how: str, shift: int) -> np.ndarray:
    a = np.asarray(a)
    if how == "float":
        return a.astype(np.float64)
    if how == "half":
        return a.astype(np.float64) + 0.5
    if how == "string":
        return a.astype(str)
    if how == "bool":
        return a != 0
    if how == "shift":
        return a + shift
    raise AssertionError(how)


def _json_values(values, how, shift):
    if how == "null":
        return None
    out = _retype(np.asarray(values), how, shift)
    return out.tolist()


def _mutate_graphsaint(folder, fname, field, how, pos):
    path = os.path.join(folder, fname)
    if fname == "adj_full.npz":
        with np.load(path) as z:
            arrays = dict(z)
        if how == "0d":
            arrays["shape"] = np.array(NS)
        else:
            arrays[field] = _retype(arrays[field], how, NS)
        np.savez(path, **arrays)
    elif fname == "feats.npy":
        np.save(path, _retype(np.load(path), how, 0))
    elif fname == "class_map.json":
        with open(path) as fh:
            cm = json.load(fh)
        keys = list(cm)
        k = keys[pos % len(keys)]
        if field == "keys":
            cm[str(int(k) + NS) if how == "shift" else f"{k}.5"] = cm.pop(k)
        else:
            cm[k] = _json_values([cm[k]], how, 7)[0] if how != "null" else None
        with open(path, "w") as fh:
            json.dump(cm, fh)
    else:
        with open(path) as fh:
            role = json.load(fh)
        if how == "null":
            role[field] = None
        else:
            ids = list(role[field])
            i = pos % len(ids)
            ids[i] = _json_values([ids[i]], how, NS)[0]
            role[field] = ids
        with open(path, "w") as fh:
            json.dump(role, fh)


def _mutate_ogb(folder, rel, how, pos):
    path = os.path.join(folder, rel)
    a = pd.read_csv(path, header=None, compression="gzip").values
    if how == "shrink":
        a = a - 5
    elif how == "drop-row":
        a = a[:-1]
    elif how == "two-columns":
        a = np.concatenate([a, a], 1)
    else:
        shift = 40 if "label" in rel else (1 if "num-edge" in rel else N)
        if how in ("string", "shift"):
            a = a.astype(object)
            r = pos % len(a)
            a[r, 0] = (f"x{a[r, 0]}" if how == "string" else a[r, 0] + shift)
        else:
            a = _retype(a, how, shift)
    _csv_gz(path, a)


def _whole_file(path, how, pos):
    if how == "delete":
        os.remove(path)
    elif how == "empty":
        if path.endswith(".gz"):
            with gzip.open(path, "wb"):
                pass
        else:
            open(path, "wb").close()
    else:
        data = open(path, "rb").read()
        with open(path, "wb") as fh:
            fh.write(data[: pos % max(1, len(data))])


def _data(ds):
    return {"feat": ds.features, "label": ds.labels, "edges": torch.stack(ds.graph.edges()),
            **{s: ds.idx(s) for s in ("train", "val", "test")}}


def _check(name, root, folder, files, reference):
    try:
        ds = load_dataset(name, root)
    except DatasetFileError as err:
        msg = str(err)
        assert "\n" not in msg and any(os.path.join(folder, f) in msg for f in files), msg
        return "refused"
    except DatasetNotFoundError as err:
        assert err.missing and set(err.missing) <= set(files), str(err)
        return "refused"
    got = _data(ds)
    for key, value in reference.items():
        assert torch.equal(got[key], value), f"{key} differs from the valid dataset's"
    return "same"


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    base = tmp_path_factory.mktemp("valid")
    made = {}
    for layout, sub in (("pyg", "Flickr/raw"), ("dgl", dgl_raw_folder_name(DGL_SPECS["flickr"]))):
        root = base / layout
        make_graphsaint(str(root / sub), n=NS, e=120, f=3)
        made[layout] = (root, sub, _data(load_dataset("flickr", root)))
        if layout == "dgl":
            os.remove(root / sub / "dgl_graph.bin")
            os.remove(root / sub / "dgl_graph.bin.dgl_exact.json")
    root = base / "ogb"
    make_ogb(str(root), "ogbn-arxiv", n=N, e=60, f=3)
    made["ogb"] = (root, "ogbn_arxiv", _data(load_dataset("ogbn-arxiv", root)))
    shutil.rmtree(root / "ogbn_arxiv" / "processed")
    return made


PROPERTY = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _copy(valid, layout, tmp_path, counter=[0]):
    counter[0] += 1
    src_root, sub, reference = valid[layout]
    root = tmp_path / f"case{counter[0]}"
    shutil.copytree(src_root, root)
    return root, str(root / sub), reference


@pytest.mark.parametrize("layout", ["pyg", "dgl"])
@PROPERTY
@given(data=st.data())
def test_mutated_graphsaint_is_refused_or_equal(valid, tmp_path, layout, data):
    root, folder, reference = _copy(valid, layout, tmp_path)
    files = sorted({f for f, _, _ in GRAPHSAINT})
    pos = data.draw(st.integers(0, 1000), label="pos")
    if data.draw(st.booleans(), label="whole file"):
        fname = data.draw(st.sampled_from(files), label="file")
        how = data.draw(st.sampled_from(WHOLE_FILE), label="how")
        _whole_file(os.path.join(folder, fname), how, pos)
    else:
        fname, field, kinds = data.draw(st.sampled_from(GRAPHSAINT), label="field")
        how = data.draw(st.sampled_from(kinds), label="how")
        _mutate_graphsaint(folder, fname, field, how, pos)
    _check("flickr", root, folder, files, reference)


@PROPERTY
@given(data=st.data())
def test_mutated_ogb_is_refused_or_equal(valid, tmp_path, data):
    root, folder, reference = _copy(valid, "ogb", tmp_path)
    files = [f for f, _, _ in OGB]
    pos = data.draw(st.integers(0, 1000), label="pos")
    if data.draw(st.booleans(), label="whole file"):
        rel = data.draw(st.sampled_from(files), label="file")
        how = data.draw(st.sampled_from(WHOLE_FILE), label="how")
        _whole_file(os.path.join(folder, rel), how, pos)
    else:
        rel, _, kinds = data.draw(st.sampled_from(OGB), label="file")
        how = data.draw(st.sampled_from(kinds), label="how")
        _mutate_ogb(folder, rel, how, pos)
    _check("ogbn-arxiv", root, folder, files, reference)


def test_cli_refuses_a_bad_label_with_one_line_before_training(tmp_path, capsys):
    """What the property's refusals become on the command line: exit 2, one line naming the file."""
    folder = tmp_path / "Flickr" / "raw"
    _, _, role = make_graphsaint(str(folder), n=NS, e=120, f=3)
    with open(folder / "class_map.json") as fh:
        cm = json.load(fh)
    cm[str(role["tr"][0])] = 9
    with open(folder / "class_map.json", "w") as fh:
        json.dump(cm, fh)
    assert_one_line_error(run(["train", "--dataset", "flickr", "--data-root", tmp_path, "--epochs", "1", "-q"], capsys),
                          str(folder / "class_map.json"), "9", "[0, 7)")
