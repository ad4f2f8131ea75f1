"""Opt-in download, offline: a local HTTP server on 127.0.0.1 serves tiny archives in the real layouts
(ogb's ``arxiv.zip`` holding ``arxiv/``; DGL's ``dataset/flickr.zip`` holding the GraphSAINT files).
ogb's URL comes from its ``master.csv`` (patched here); DGL's from ``DGL_REPO``. Nothing is fetched
unless ``download=True`` / ``--download`` is given."""
import functools
import http.server
import os
import shutil
import sys
import threading
import zipfile

import pandas as pd
import pytest
import torch

from dgl_exact.data import DatasetNotFoundError, load_dataset
from tests.data._helpers import make_graphsaint, make_ogb


pytestmark = pytest.mark.usefixtures("closed_stdin")


@pytest.fixture
def server(tmp_path):
    """Serve ``tmp_path/www`` on 127.0.0.1 (a free port); yields (base url, list of requested paths)."""
    www = tmp_path / "www"
    www.mkdir()
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(www)))
    httpd.timeout = 5
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", www, requests
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _zip(folder, zip_path, arc_root=""):
    os.makedirs(os.path.dirname(zip_path), exist_ok=True)
    with zipfile.ZipFile(zip_path, "w") as z:
        for dirpath, _, files in os.walk(folder):
            for f in files:
                full = os.path.join(dirpath, f)
                z.write(full, os.path.join(arc_root, os.path.relpath(full, folder)))


@pytest.fixture
def ogb_url(monkeypatch):
    """Point ogb's master.csv entry of a dataset at a URL (ogb reads master.csv on every construction)."""
    import dgl_exact  # noqa: F401  (DGL importable)
    from ogb.nodeproppred import dataset_dgl

    urls = {}
    real = pd.read_csv

    def read_csv(path, *args, **kwargs):
        df = real(path, *args, **kwargs)
        if str(path).endswith("master.csv"):
            for name, url in urls.items():
                df.loc["url", name] = url
        return df

    monkeypatch.setattr(dataset_dgl.pd, "read_csv", read_csv)
    return urls


def test_ogb_download_matches_ogb_loading_the_same_files(tmp_path, server, ogb_url, capfd):
    base, www, requests = server
    src = tmp_path / "build"
    folder, *_ = make_ogb(str(src), "ogbn-arxiv", n=40, e=90)
    _zip(folder, str(www / "arxiv.zip"), arc_root="arxiv")      # ogb's archive: arxiv/{RELEASE_v1.txt,raw,split}
    ogb_url["ogbn-arxiv"] = f"{base}/arxiv.zip"
    root = tmp_path / "data"

    with pytest.raises(DatasetNotFoundError):
        load_dataset("ogbn-arxiv", root)                          # never downloads unless asked
    assert requests == [] and not root.exists()

    ds = load_dataset("ogbn-arxiv", root, download=True)
    assert "/arxiv.zip" in requests
    assert "Downloaded" in capfd.readouterr().err                 # ogb's progress bar
    assert os.path.isfile(root / "ogbn_arxiv" / "RELEASE_v1.txt") and not os.path.exists(root / "arxiv.zip")
    ref = load_dataset("ogbn-arxiv", src)                         # what ogb loads from the original files
    assert torch.equal(ds.features, ref.features) and torch.equal(ds.labels, ref.labels)
    assert torch.equal(torch.stack(ds.graph.edges()), torch.stack(ref.graph.edges()))
    assert all(torch.equal(ds.idx(s), ref.idx(s)) for s in ("train", "val", "test"))

    n = len(requests)
    load_dataset("ogbn-arxiv", root, download=True)               # already there: nothing fetched
    assert len(requests) == n


def test_ogb_download_never_deletes_an_existing_folder(tmp_path, server, ogb_url):
    base, www, requests = server
    root = tmp_path / "data"
    make_ogb(str(root), "ogbn-arxiv", n=20, e=30, release=False)   # ogb would offer to delete it
    ogb_url["ogbn-arxiv"] = f"{base}/arxiv.zip"
    with pytest.raises(DatasetNotFoundError):
        load_dataset("ogbn-arxiv", root, download=True)
    assert requests == [] and os.path.isfile(root / "ogbn_arxiv" / "raw" / "edge.csv.gz")


def test_dgl_download_via_dgl_repo(tmp_path, server, monkeypatch, capfd):
    base, www, requests = server
    src = tmp_path / "build" / "flickr"
    adj, labels, role = make_graphsaint(str(src), n=30, e=60, f=4)
    _zip(str(src), str(www / "dataset" / "flickr.zip"))
    monkeypatch.setenv("DGL_REPO", base + "/")
    root = tmp_path / "data"
    with pytest.raises(DatasetNotFoundError):
        load_dataset("flickr", root)
    assert requests == []
    ds = load_dataset("flickr", root, download=True)
    assert requests == ["/dataset/flickr.zip"]
    assert "Downloading" in capfd.readouterr().out                # DGL's own download log and progress bar
    shutil.copytree(src, tmp_path / "ref" / "flickr")
    ref = load_dataset("flickr", tmp_path / "ref")
    assert torch.equal(ds.features, ref.features) and torch.equal(ds.labels, ref.labels)
    assert torch.equal(torch.stack(ds.graph.edges()), torch.stack(ref.graph.edges()))


def test_cli_download(tmp_path, server, ogb_url):
    from click.testing import CliRunner

    from dgl_exact.cli import cli

    base, www, requests = server
    folder, *_ = make_ogb(str(tmp_path / "build"), "ogbn-products", n=30, e=50, f=3)
    _zip(folder, str(www / "products.zip"), arc_root="products")
    ogb_url["ogbn-products"] = f"{base}/products.zip"
    root = str(tmp_path / "data")
    out = CliRunner().invoke(cli, ["datasets", "--data-root", root])
    assert out.exit_code == 0 and requests == []
    out = CliRunner().invoke(cli, ["datasets", "--data-root", root, "--download", "ogbn-products"])
    assert out.exit_code == 0, out.output
    assert "loaded ogbn-products: 30 nodes" in out.output
    assert any(line.startswith("[x] ogbn-products") for line in out.output.splitlines())


def test_cli_train_download(tmp_path, server, ogb_url):
    """`dgl-exact train --download` fetches a missing dataset, then trains on it; without the flag nothing is
    fetched and the error says how to get it."""
    from click.testing import CliRunner

    from dgl_exact.cli import cli

    base, www, requests = server
    folder, *_ = make_ogb(str(tmp_path / "build"), "ogbn-arxiv", n=40, e=90, f=4)
    _zip(folder, str(www / "arxiv.zip"), arc_root="arxiv")
    ogb_url["ogbn-arxiv"] = f"{base}/arxiv.zip"
    root = str(tmp_path / "data")
    args = ["train", "--dataset", "ogbn-arxiv", "--data-root", root, "--epochs", "1", "--hidden", "4", "-q",
            "--device", "cpu"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code != 0 and "--download" in out.output
    assert requests == [] and not os.path.exists(root)
    out = CliRunner().invoke(cli, args + ["--download"])
    assert out.exit_code == 0, out.output
    assert requests == ["/arxiv.zip"] and "40 nodes" in out.output and "test acc" in out.output
    out = CliRunner().invoke(cli, args + ["--download"])              # already there: nothing fetched
    assert out.exit_code == 0, out.output
    assert requests == ["/arxiv.zip"]


def test_reddit2_has_no_downloader(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="no downloader"):
        load_dataset("reddit2", tmp_path, download=True)


@pytest.mark.slow
def test_ogb_advice_runs_in_a_fresh_interpreter(tmp_path):
    """The "how to get it" command works where dgl_exact is installed (a bare `from ogb.nodeproppred import
    DglNodePropPredDataset` fails there: DGL 2.1 cannot import on this torch without dgl_exact's shim)."""
    import re
    import subprocess

    from dgl_exact.data.ogbn import OGB_SPECS

    make_ogb(str(tmp_path), "ogbn-arxiv", n=20, e=30)   # complete: the command loads it offline
    advice = OGB_SPECS["ogbn-arxiv"].instructions(str(tmp_path))
    code = re.search(r'`python -c "(.*?)"`', advice).group(1)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.path.isfile(tmp_path / "ogbn_arxiv" / "processed" / "dgl_data_processed")
    assert "dgl-exact datasets --download ogbn-arxiv" in advice


@pytest.mark.slow
def test_dgl_advice_runs_in_a_fresh_interpreter(tmp_path):
    """Same for DGL's datasets: the advice imports dgl_exact first, so DGL imports on this torch."""
    import re
    import subprocess

    from dgl_exact.data.dgl_builtin import DGL_SPECS, dgl_raw_folder_name

    folder = tmp_path / dgl_raw_folder_name(DGL_SPECS["flickr"])
    make_graphsaint(str(folder), n=20, e=30, f=3)          # complete: DGL processes it offline
    advice = DGL_SPECS["flickr"].instructions(str(tmp_path))
    code = re.search(r'`python -c "(.*?)"`', advice).group(1)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL, env={k: v for k, v in os.environ.items() if k != "DGL_REPO"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.path.isfile(folder / "dgl_graph.bin")
    assert "dgl-exact datasets --download flickr" in advice


@pytest.fixture
def failing_server():
    """A local server answering every GET with the status in its path (``/404/x.zip``: 404); counts requests."""
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            requests.append(self.path)
            self.send_error(int(self.path.split("/")[1]))

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", requests
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_http_error_status_is_one_line_with_url_and_status(tmp_path, failing_server):
    from dgl_exact.data.download import DownloadError, fetch

    base, requests = failing_server
    with pytest.raises(DownloadError) as err:
        fetch(f"{base}/404/x.zip", str(tmp_path / "x.zip"), quiet=True)
    msg = str(err.value)
    assert "\n" not in msg and f"{base}/404/x.zip" in msg and "404" in msg and "attempt 1 of 3" in msg
    assert len(requests) == 1 and not os.listdir(tmp_path)          # not retried, nothing left behind
    with pytest.raises(DownloadError) as err:
        fetch(f"{base}/503/x.zip", str(tmp_path / "x.zip"), quiet=True, wait=0)
    assert "after 3 attempts" in str(err.value) and "503" in str(err.value) and len(requests) == 4


def test_cli_dgl_download_http_error_is_one_line(tmp_path, failing_server, monkeypatch):
    from click.testing import CliRunner

    from dgl_exact.cli import cli

    base, requests = failing_server
    monkeypatch.setenv("DGL_REPO", base + "/404/")
    out = CliRunner().invoke(cli, ["datasets", "--data-root", str(tmp_path / "data"), "--download", "flickr"])
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output and "404" in out.output and "/404/dataset/flickr.zip" in out.output
    assert len(requests) == 1


def test_cli_ogb_download_http_error_is_one_line(tmp_path, failing_server, ogb_url):
    from click.testing import CliRunner

    from dgl_exact.cli import cli

    base, requests = failing_server
    ogb_url["ogbn-arxiv"] = f"{base}/404/arxiv.zip"
    out = CliRunner().invoke(cli, ["datasets", "--data-root", str(tmp_path / "data"), "--download", "ogbn-arxiv"])
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output and "HTTP 404" in out.output and "/404/arxiv.zip" in out.output


def test_quiet_silences_ogb_download_and_processing(tmp_path, server, ogb_url, capfd):
    base, www, requests = server
    folder, *_ = make_ogb(str(tmp_path / "build"), "ogbn-arxiv", n=40, e=90)
    _zip(folder, str(www / "arxiv.zip"), arc_root="arxiv")
    ogb_url["ogbn-arxiv"] = f"{base}/arxiv.zip"
    capfd.readouterr()
    ds = load_dataset("ogbn-arxiv", tmp_path / "data", download=True, quiet=True)
    out, err = capfd.readouterr()
    assert ds.num_nodes == 40 and requests == ["/arxiv.zip"]
    assert out == "" and err == "", (out, err)


def test_cli_train_quiet_prints_no_ogb_processing(tmp_path):
    from click.testing import CliRunner

    from dgl_exact.cli import cli

    make_ogb(str(tmp_path), "ogbn-arxiv", n=40, e=90, f=4)
    out = CliRunner().invoke(cli, ["train", "--dataset", "ogbn-arxiv", "--data-root", str(tmp_path), "--epochs", "1",
                                   "--hidden", "4", "-q", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    text = out.output                                             # stdout and stderr
    assert "Loading necessary files" not in text and "Saving" not in text and "Converting" not in text


def test_download_on_a_full_disk_is_one_write_error_not_retried(tmp_path, server, full_disk):
    """The network did its part: a local disk that is full is said in one line naming the file, at once."""
    from dgl_exact.data.download import fetch
    from dgl_exact.errors import WriteError

    base, www, requests = server
    (www / "x.zip").write_bytes(os.urandom(200_000))
    target = tmp_path / "data" / "x.zip"
    target.parent.mkdir()
    target.write_bytes(b"an earlier download")
    with pytest.raises(WriteError) as err:
        fetch(f"{base}/x.zip", str(target), quiet=True, wait=0)
    assert str(err.value).startswith(f"could not write {target}: no space left on device")
    assert requests == ["/x.zip"] and target.read_bytes() == b"an earlier download"
    assert os.listdir(target.parent) == ["x.zip"]


def test_download_is_written_whole(tmp_path, server):
    from dgl_exact.data.download import fetch

    base, www, requests = server
    payload = os.urandom(300_000)
    (www / "x.zip").write_bytes(payload)
    target = tmp_path / "data" / "x.zip"
    assert fetch(f"{base}/x.zip", str(target), quiet=True) == str(target)
    assert target.read_bytes() == payload and os.listdir(target.parent) == ["x.zip"]
    assert target.stat().st_mode & 0o777 == 0o644  # a dataset file others may read
