#!/usr/bin/env python3
"""parasync.torch trains step for step as torch.optim does: one worker in sync mode, a small
CNN with a pst.Embedding, N steps through real servers (2 shards) end with the parameters a
local copy of the model reaches with torch.optim.SGD (and with momentum), within 1e-5
relative; the embedding rows as nn.Embedding(sparse=True) with torch.optim.SGD. A gradient
dropped or pushed twice moves a parameter by a whole learning-rate step, far past that.

Usage: torch_equivalence_test.py BIN_DIR PYTHON_DIR SOURCE_DIR
"""

import os
import sys
import tempfile

import numpy as np

BIN_DIR, PYTHON_DIR, SOURCE_DIR = sys.argv[1:4]
sys.path[:0] = [PYTHON_DIR, os.path.join(SOURCE_DIR, "tests", "support")]
from checks import check, report, require_torch  # noqa: E402

torch = require_torch()
import parasync  # noqa: E402
import parasync.torch as pst  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from ps_servers import Servers  # noqa: E402

STEPS = 8
BATCH = 16
# int64 ids anywhere in the range: small, repeated within a batch, negative and huge.
VOCAB = np.array([0, 1, 2, 3, 5, 8, 13, 21, 34, 55, -7, -2**40, 2**62, 2**63 - 1], np.int64)


class Net(nn.Module):
    def __init__(self, embedding: nn.Module):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 10)
        self.embedding = embedding
        self.head = nn.Linear(8, 10)

    def forward(self, x, ids):
        h = F.relu(self.conv(x)).flatten(1)
        return self.fc(h) + self.head(self.embedding(ids).mean(1))


def batches(fixed_ids: bool):
    rng = np.random.default_rng(5)
    for _ in range(STEPS):
        x = torch.from_numpy(rng.standard_normal((BATCH, 1, 8, 8)).astype(np.float32))
        y = torch.from_numpy(rng.integers(0, 10, BATCH))
        if fixed_ids:  # every id in every batch: lazy and dense momentum agree
            pos = np.resize(np.arange(len(VOCAB)), (BATCH, 4))
        else:
            pos = rng.integers(0, len(VOCAB) // 2, (BATCH, 3))  # repeats within a batch
            pos[0, 0] = len(VOCAB) - 1 - rng.integers(0, 4)     # and a rare large id
        yield x, torch.from_numpy(VOCAB[pos]), torch.from_numpy(pos.astype(np.int64)), y


def worst_difference(model: nn.Module, ref: nn.Module) -> dict:
    """Each dense parameter's largest difference from the reference's, relative to the
    reference's largest value."""
    ref_params = dict(ref.named_parameters())
    out = {}
    for n, p in model.named_parameters():
        want = ref_params[n].detach()
        out[n] = float((p.detach() - want).abs().max() / want.abs().max())
    return out


def run(optimizer: str, momentum: float, fixed_ids: bool, table: bool, workdir: str,
        device: str = "cpu") -> None:
    """N steps through parasync and through torch.optim side by side. `table`: the embedding
    is a pst.Embedding (rows on the servers; its pushes go at step()), else a dense
    nn.Embedding parameter (every push may go out during backward)."""
    tag = (f"{optimizer}{' fixed ids' if fixed_ids else ''}{' table' if table else ' dense'}"
           f"{' on ' + device if device != 'cpu' else ''}")
    with Servers(BIN_DIR, shards=2, workers=1, log_dir=workdir, mode="sync") as servers:
        client = parasync.Client(servers.addresses, workers=1, rank=0, mode="sync",
                                 log_dir=workdir, request_timeout=60, connect_timeout=60)
        torch.manual_seed(0)
        embedding = (pst.Embedding("words", dim=8, init=("uniform", 0.5)) if table
                     else nn.Embedding(len(VOCAB), 8))
        model = Net(embedding).to(device)
        initial = {n: p.detach().clone() for n, p in model.named_parameters()}
        settings = {"momentum": momentum} if optimizer == "momentum" else {}
        opt = pst.Optimizer(client, model, optimizer=optimizer, lr=0.1, **settings)
        # The reference starts from rank 0's values (what the servers hold) and, for a table,
        # from the rows the servers initialized.
        ref = Net(nn.Embedding(len(VOCAB), 8, sparse=table)).to(device)
        ref_params = dict(ref.named_parameters())
        order = np.argsort(VOCAB.view(np.uint64))
        rows0 = np.empty((len(VOCAB), 8), np.float32)
        with torch.no_grad():
            if table:
                client.pull([], rows=[(0, np.sort(VOCAB.view(np.uint64)), rows0)])
                rows0 = rows0[np.argsort(order)]  # back to VOCAB's order
                ref.embedding.weight.copy_(torch.from_numpy(rows0).to(device))
            for n, p in model.named_parameters():
                ref_params[n].copy_(initial[n])
                check(torch.equal(p, initial[n]), f"{tag}: {n} starts as rank 0's value")
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=momentum)
        early = 0
        for x, ids, pos, y in batches(fixed_ids):
            x, ids, pos, y = (t.to(device) for t in (x, ids, pos, y))
            loss = F.cross_entropy(model(x, ids if table else pos), y)
            opt.zero_grad()
            loss.backward()
            opt.step(examples=BATCH, loss=loss.item())
            early += opt.timeline["early_pushes"]
            ref_loss = F.cross_entropy(ref(x, pos), y)
            ref_opt.zero_grad()
            ref_loss.backward()
            ref_opt.step()
        if not table:
            check(early > 0, f"{tag}: no push went out during backward")
        differences = worst_difference(model, ref)
        for n, err in differences.items():
            check(err <= 1e-5, f"{tag}: {n} differs from torch.optim's by {err:.2e} relative")
        rows_err = 0.0
        if table:
            rows = np.empty((len(VOCAB), 8), np.float32)
            client.pull([], rows=[(0, np.sort(VOCAB.view(np.uint64)), rows)])
            rows = rows[np.argsort(order)]
            want = ref.embedding.weight.detach().cpu().numpy()
            rows_err = float(np.abs(rows - want).max() / np.abs(want).max())
            check(rows_err <= 1e-5,
                  f"{tag}: the embedding rows differ from torch's by {rows_err:.2e} relative")
            moved = float(np.abs(rows - rows0).max())
            check(moved > 1e-3, f"{tag}: the rows moved by {moved:.2e} only: no gradient "
                                "reached them")
        # Exactly one update per step: none dropped, none applied twice.
        step, examples = client.global_progress()
        check(step == STEPS and examples == STEPS * BATCH,
              f"{tag}: the servers applied {step} steps of {examples} examples, not {STEPS} of "
              f"{STEPS * BATCH}")
        # The comparison sees a gradient pushed twice: the last one again moves every
        # parameter it reaches past the bound.
        if not table:
            x, ids, pos, y = (t.to(device) for t in list(batches(fixed_ids))[-1])
            loss = F.cross_entropy(model(x, pos), y)
            opt.zero_grad()
            loss.backward()
            opt.step(examples=BATCH)
            again = max(worst_difference(model, ref).values())
            check(again > 1e-4, f"{tag}: a gradient applied twice changed the parameters by "
                                f"{again:.2e} only: the comparison cannot see it")
        client.finish()
        client.close()
        print(f"{tag}: {STEPS} steps, dense worst {max(differences.values()):.2e}, rows "
              f"{rows_err:.2e} relative, {early} shard pushes sent during backward")


def run_delayed(prediction: bool, workdir: str) -> None:
    """sync:delayed with the exchange behind the next step's compute: N steps through the
    servers end where a one-process reproduction of the algorithm ends (step t's gradient is
    computed at the parameters of version t - 2, or at 2 w[t-1] - w[t-2] with the
    prediction; the servers apply it to version t - 1), within 1e-5; and far from where
    plain sync ends, so the comparison sees an exchange that did not overlap."""
    tag = f"sync:delayed {'with' if prediction else 'without'} prediction"
    with Servers(BIN_DIR, shards=2, workers=1, log_dir=workdir, mode="sync:delayed") as servers:
        client = parasync.Client(servers.addresses, workers=1, rank=0, mode="sync:delayed",
                                 log_dir=workdir, request_timeout=60, connect_timeout=60)
        torch.manual_seed(0)
        model = Net(nn.Embedding(len(VOCAB), 8))
        initial = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = pst.Optimizer(client, model, optimizer="momentum", lr=0.1, momentum=0.9,
                            weight_prediction=prediction)
        # The servers' model (`server`, stepped by torch.optim) and where each gradient is
        # computed (`at`); `plain`: sync's steps, for the comparison's reach.
        server, at, plain = (Net(nn.Embedding(len(VOCAB), 8)) for _ in range(3))
        for m in (server, at, plain):
            m.load_state_dict({**m.state_dict(), **initial})
        server_opt = torch.optim.SGD(server.parameters(), lr=0.1, momentum=0.9)
        plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
        versions = [{n: p.detach().clone() for n, p in server.named_parameters()}]
        for x, _ids, pos, y in batches(False):
            loss = F.cross_entropy(model(x, pos), y)
            opt.zero_grad()
            loss.backward()
            opt.step(examples=BATCH, loss=loss.item())
            at.zero_grad()
            F.cross_entropy(at(x, pos), y).backward()
            with torch.no_grad():
                for p, q in zip(server.parameters(), at.parameters()):
                    p.grad = q.grad.clone()
            server_opt.step()
            versions.append({n: p.detach().clone() for n, p in server.named_parameters()})
            # The client knows the versions before the one its exchange brings.
            known = len(versions) - 2
            with torch.no_grad():
                for n, p in at.named_parameters():
                    latest = versions[known][n]
                    p.copy_(2 * latest - versions[known - 1][n]
                            if prediction and known >= 1 else latest)
            plain_opt.zero_grad()
            F.cross_entropy(plain(x, pos), y).backward()
            plain_opt.step()
        opt.synchronize()
        differences = worst_difference(model, server)
        for n, err in differences.items():
            check(err <= 1e-5, f"{tag}: {n} differs from the one-process reproduction by "
                               f"{err:.2e} relative")
        reach = max(worst_difference(model, plain).values())
        check(reach > 1e-4, f"{tag}: within {reach:.2e} of plain sync's steps: the comparison "
                            "cannot tell an overlapped exchange from a waited one")
        step, examples = client.global_progress()
        check(step == STEPS and examples == STEPS * BATCH,
              f"{tag}: the servers applied {step} steps of {examples} examples, not {STEPS} of "
              f"{STEPS * BATCH}")
        client.finish()
        client.close()
        print(f"{tag}: {STEPS} steps, worst {max(differences.values()):.2e} relative to the "
              f"reproduction, {reach:.2e} from plain sync")


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        for optimizer, momentum, fixed, table in (("sgd", 0.0, False, True),
                                                  ("momentum", 0.9, True, True),
                                                  ("sgd", 0.0, False, False),
                                                  ("momentum", 0.9, False, False)):
            workdir = tempfile.mkdtemp(dir=d)
            run(optimizer, momentum, fixed, table, workdir)
        for prediction in (True, False):
            run_delayed(prediction, tempfile.mkdtemp(dir=d))
        # Parameters on a GPU go through host buffers: where PyTorch has one (the GPU machine).
        if torch.cuda.is_available():
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            for table in (True, False):
                run("sgd", 0.0, False, table, tempfile.mkdtemp(dir=d), device="cuda")
        else:
            print("no GPU here: the cases with the model on a GPU run where PyTorch has one")
    return report()


if __name__ == "__main__":
    sys.exit(main())
