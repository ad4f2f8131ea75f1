"""Neighbour-sampled mini-batches (``--sampler neighbor``): DGL's sampler wrapped as a reproducible batch
sampler (batches a pure function of seed, epoch and index; rank shares; resume at a batch), the options and
their errors, training every block model, mid-epoch checkpoints and no growth of cached structures."""
import os
import subprocess
import sys

import pytest
import torch

from dgl_exact import ops
from dgl_exact._compat import import_dgl
from dgl_exact.cli import main
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.neighbor import BlockBatch, NeighborSampler, format_fanouts, parse_fanouts
from dgl_exact.training.trainer import Trainer

dgl = import_dgl()

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = "synthetic:num_nodes=300,num_features=8,num_classes=3,avg_degree=6"


def make_graph(n=200, m=1200, seed=0):
    """A symmetric random graph with features, labels and a train mask."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (m,), generator=gen), torch.randint(0, n, (m,), generator=gen)
    g = dgl.remove_self_loop(dgl.to_bidirected(dgl.graph((src, dst), num_nodes=n)))
    g.ndata["feat"] = torch.randn(n, 4, generator=gen)
    g.ndata["label"] = torch.randint(0, 3, (n,), generator=gen)
    g.ndata["train_mask"] = torch.rand(n, generator=gen) < 0.5
    return g


@pytest.fixture(scope="module")
def graph():
    return make_graph()


def signature(batch):
    return (batch.seeds.tolist(), batch.input_nodes.tolist(),
            [tuple(t.tolist() for t in b.edges()) for b in batch.blocks])


def test_batches_cover_train_nodes_and_respect_fanouts(graph):
    s = NeighborSampler(graph, [3, 2], 16, seed=0)
    train = torch.nonzero(graph.ndata["train_mask"], as_tuple=True)[0]
    batches = list(s.iter_epoch(0))
    assert len(batches) == len(s) == -(-train.numel() // 16)
    seeds = torch.cat([b.seeds for b in batches])
    assert sorted(seeds.tolist()) == train.tolist()  # every training node once per epoch
    for b in batches:
        assert isinstance(b, BlockBatch) and len(b.blocks) == 2 and b.graph is b.blocks
        assert b.feat.shape == (b.input_nodes.numel(), 4) and torch.equal(b.feat, graph.ndata["feat"][b.input_nodes])
        assert torch.equal(b.label, graph.ndata["label"][b.seeds]) and bool(b.train_mask.all())
        assert torch.equal(b.blocks[0].srcdata[dgl.NID].long(), b.input_nodes)
        assert torch.equal(b.blocks[-1].dstdata[dgl.NID].long(), b.seeds)
        for block, fanout in zip(b.blocks, [3, 2]):
            assert int(block.in_degrees().max()) <= fanout
            assert "feat" not in block.srcdata  # structure only: no node data copied into blocks
    full = NeighborSampler(graph, [-1], 1000, seed=0)  # -1: all in-neighbours
    (b,) = list(full.iter_epoch(0))
    assert torch.equal(b.blocks[0].in_degrees(), graph.in_degrees(b.seeds.to(graph.idtype)))


def test_reproducible_and_resumable(graph):
    s = NeighborSampler(graph, [4, 4], 10, seed=3)
    a = [signature(b) for b in s.iter_epoch(2)]
    assert a == [signature(b) for b in s.iter_epoch(2)]
    assert a[3:] == [signature(b) for b in s.iter_epoch(2, start=3)]  # resume at batch 3: the same batches
    assert a != [signature(b) for b in s.iter_epoch(1)]
    assert a != [signature(b) for b in NeighborSampler(graph, [4, 4], 10, seed=4).iter_epoch(2)]
    shares = [NeighborSampler(graph, [4, 4], 10, seed=3, rank=r, world_size=3) for r in range(3)]
    got = {b.index: signature(b) for share in shares for b in share.iter_epoch(2)}
    assert [got[i] for i in range(len(a))] == a  # the ranks' union is the one-process epoch


def test_fanout_parsing_and_bad_arguments(graph):
    assert parse_fanouts("15, 10,5") == [15, 10, 5] and parse_fanouts([-1, 3]) == [-1, 3]
    assert format_fanouts([15, 10, 5]) == "15,10,5"
    for bad in ("", "0", "10,-2", "a", "1.5", [True], "5," + "1" + "0" * 30, [2**31]):
        with pytest.raises(ValueError, match="fanouts"):
            parse_fanouts(bad)
    assert parse_fanouts([2**31 - 1]) == [2**31 - 1]  # above every in-degree: all in-neighbours
    with pytest.raises(ValueError, match="batch_size"):
        NeighborSampler(graph, [2], 0)
    with pytest.raises(ValueError, match="empty"):
        NeighborSampler(graph, [2], 4, train_nodes=torch.tensor([], dtype=torch.int64))


def test_config_rules():
    cfg = TrainConfig(sampler="neighbor", layers=3, fanouts="15, 10,5", batch_size=8)
    assert cfg.fanouts == "15,10,5" and cfg.neighbor_fanouts() == [15, 10, 5]
    assert TrainConfig(sampler="neighbor", layers=3).neighbor_fanouts() == [10, 10, 10]
    with pytest.raises(ValueError, match="one per layer"):
        TrainConfig(sampler="neighbor", layers=2, fanouts="5,5,5")
    with pytest.raises(ValueError, match="-1 \\(all neighbours\\)"):
        TrainConfig(sampler="neighbor", fanouts="5,0")
    with pytest.raises(ValueError, match="--sampler neighbor"):
        TrainConfig(sampler="cluster", fanouts="5,5")
    with pytest.raises(ValueError, match="--sampler neighbor"):
        TrainConfig(batch_size=64)
    with pytest.raises(ValueError, match="gcn2"):
        TrainConfig(sampler="neighbor", model="gcn2")


@pytest.mark.parametrize("args, needle", [
    (["--fanouts", "5,5"], "--sampler neighbor"),
    (["--sampler", "neighbor", "--fanouts", "5,5,5"], "one per layer"),
    (["--sampler", "neighbor", "--fanouts", "5,0"], "-1 (all neighbours)"),
    (["--sampler", "neighbor", "--batch-size", "0"], "batch-size"),
    (["--sampler", "neighbor", "--model", "gcn2"], "gcn2"),
    (["--sampler", "neighbor", "--checkpoint-batches", "2"], "--checkpoint PATH"),
])
def test_cli_errors(args, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["train", "--dataset", TINY, "--epochs", "1", "-q", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def tiny_config(**kw):
    base = dict(dataset=TINY, sampler="neighbor", fanouts="4,3", batch_size=32, hidden=8, epochs=2,
                data_root="data", device="cpu")
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_trains_every_block_model(model):
    trainer = Trainer(tiny_config(model=model, heads=2, batch_norm=True), progress=False, log=None)
    result = trainer.fit().runs[0]
    assert 0.0 <= result.test <= 1.0 and result.final_loss == result.final_loss
    assert len(trainer.sampler) == -(-trainer.split["train"].numel() // 32)


def test_global_batch_emulator_takes_the_neighbor_sampler():
    """What a two-process DDP run is compared against: two ranks' batches per optimiser step."""
    from dgl_exact.training.distributed import GlobalBatchTrainer

    trainer = GlobalBatchTrainer(tiny_config(batch_size=16, epochs=1), global_batch=2, progress=False, log=None)
    assert len(trainer.sampler) == trainer.sampler.num_global_batches // 2
    assert trainer.fit().runs[0].final_loss > 0


def test_no_cached_structure_growth():
    """Blocks are not kept: the structure cache holds no more graphs after five epochs than after one."""
    trainer = Trainer(tiny_config(epochs=1, act_fp=False), progress=False, log=None)
    model, optimizer, scaler = trainer.build(0)
    sizes = []
    for epoch in range(5):
        trainer.train_epoch(model, optimizer, scaler, epoch)
        trainer.evaluate(model)
        sizes.append(ops.structure.cache_size())
    assert max(sizes) <= sizes[0], sizes  # (other tests in this worker may hold cached graphs of their own)


def test_checkpoint_inside_an_epoch_resumes_bit_for_bit(tmp_path):
    """Saved every 2 batches and killed inside epoch 1, the resumed run ends with the weights of an
    uninterrupted one."""
    cfg = tiny_config(batch_size=16, epochs=2)
    straight = Trainer(cfg, progress=False, log=None)
    straight.fit()
    expected = straight.model.state_dict()

    first = Trainer(cfg, progress=False, log=None)
    first.checkpoint_batches = 2
    steps, step = [0], first._step

    def dying_step(*a, **k):
        steps[0] += 1
        if steps[0] == len(first.sampler) + 4:  # the 4th batch of epoch 1: batches 0-2 are saved
            raise KeyboardInterrupt
        return step(*a, **k)

    first._step = dying_step
    path = str(tmp_path / "run.pt")
    with pytest.raises(KeyboardInterrupt):
        first.fit(checkpoint=path)
    from dgl_exact.training.checkpoint import RunState

    saved = RunState.load(path)
    assert (saved.epoch, saved.batch, len(saved.batch_losses)) == (0, 2, 2)
    resumed = Trainer(cfg, progress=False, log=None)
    resumed.checkpoint_batches = 2
    resumed.fit(checkpoint=path, resume=True)
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, expected[name]), name


_SAMPLE_IN_A_FRESH_PROCESS = """
import hashlib, sys, threading
import torch
from dgl_exact._compat import import_dgl
from dgl_exact.training.neighbor import NeighborSampler
dgl = import_dgl()
if sys.argv[1] == "other-thread":  # as an OpenMP worker winning the race of a multi-threaded dgl.seed
    t = threading.Thread(target=lambda: dgl.seed(0))
    t.start()
    t.join()
src = torch.arange(3000) % 300
g = dgl.graph((src, (src * 7 + torch.arange(3000) // 300) % 300), num_nodes=300)
g.ndata["feat"], g.ndata["label"] = torch.zeros(300, 1), torch.zeros(300, dtype=torch.long)
inp, _, blocks = NeighborSampler(g, [3, 3], 32, seed=0).blocks_of(0, 0)
h = hashlib.sha256(inp.numpy().tobytes())
for b in blocks:
    for t in b.edges():
        h.update(t.numpy().tobytes())
print(h.hexdigest())
"""


@pytest.mark.slow
def test_seeded_sampling_does_not_depend_on_which_thread_used_dgls_rng_first():
    """DGL numbers each thread's random stream in the order threads first use it (process-wide): a worker
    thread that gets there before the main thread gives the main thread another stream under the same seed
    (the 2-process neighbour test failed so, ~1 in 4 runs under load). Importing DGL through dgl_exact numbers
    the main thread first, so another thread's later use changes nothing."""
    def sample(mode):
        proc = subprocess.run([sys.executable, "-c", _SAMPLE_IN_A_FRESH_PROCESS, mode], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert sample("other-thread") == sample("main-thread-only")
