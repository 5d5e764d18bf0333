"""The data the example models train on, as NumPy arrays (NumPy only: no torchvision, no
PyTorch), each deterministic: the files, or the seed alone, decide every byte.

  fashion_mnist(split)          Debian's dataset-fashion-mnist, scaled as parasync's worker
                                scales it (worker/data/dataset.cc: pixel / 255)
  dates(n_train, n_test, seed)  a seq2seq task generated here with a known answer: dates
                                written in one of 12 formats, to be rewritten as YYYY-MM-DD
  ctr(directory, split)         the .npy files parasync-gen-ctr writes (docs/embeddings.md)

Every loader returns arrays ready for torch.from_numpy; none holds state.
"""
import datetime
import gzip
import os
from typing import NamedTuple

import numpy as np

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


class DataError(Exception):
    """Data that is missing or not what a loader reads: the message is one line naming the
    file and what is wrong with it."""


# ---- Fashion-MNIST ---------------------------------------------------------------------------

def _idx(path, magic, dims):
    """The payload of a gzipped IDX file after its header (magic, then `dims` big-endian
    uint32 sizes), and those sizes."""
    try:
        with gzip.open(path) as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e} (Debian's "
                        f"dataset-fashion-mnist installs it)") from None
    header = 4 + 4 * dims
    if len(raw) < header or int.from_bytes(raw[:4], "big") != magic:
        raise DataError(f"{path} is not an IDX file of {dims} dimension(s)")
    sizes = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    data = np.frombuffer(raw, np.uint8, offset=header)
    if data.size != int(np.prod(sizes)):
        raise DataError(f"{path}: {data.size} bytes of data, its header says {sizes}")
    return data.reshape(sizes), sizes


def fashion_mnist(split, directory=FASHION_MNIST):
    """Fashion-MNIST's `split` ("train": 60,000 examples, or "test": 10,000) from
    `directory`: (x, y), x float32 [n, 1, 28, 28] in [0, 1] (each pixel / 255, as parasync's
    worker scales it), y int64 [n] in 0..9. Raises DataError naming the file that is missing
    or malformed."""
    name = {"train": "train", "test": "t10k"}.get(split)
    if name is None:
        raise ValueError(f"split must be train or test, not {split!r}")
    images, (n, rows, cols) = _idx(os.path.join(directory, f"{name}-images-idx3-ubyte.gz"),
                                   0x803, 3)
    labels, (m,) = _idx(os.path.join(directory, f"{name}-labels-idx1-ubyte.gz"), 0x801, 1)
    if m != n:
        raise DataError(f"{directory}: {n} {name} images but {m} labels")
    x = images.reshape(n, 1, rows, cols).astype(np.float32) * np.float32(1 / 255)
    return x, labels.astype(np.int64)


# ---- Dates: a seq2seq task with a known answer ------------------------------------------------

PAD, START, END = 0, 1, 2
# The fixed vocabulary of source and target alike: three markers, then every character a
# source or target date can hold. Its order is part of the data format.
VOCAB = ["<pad>", "<s>", "</s>"] + list(" ,-./0123456789"
                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                       "abcdefghijklmnopqrstuvwxyz")
TOKEN = {c: i for i, c in enumerate(VOCAB)}
TARGET_LENGTH = len("2026-11-27") + 1  # the date, then END

FIRST_DAY = datetime.date(1950, 1, 1)
LAST_DAY = datetime.date(2049, 12, 31)  # two-digit years: 50-99 are 19xx, 00-49 are 20xx
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _ordinal(day):
    if 10 <= day % 100 <= 20:
        return f"{day}th"
    return f"{day}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th') }"


# Each format writes a date (English names, no locale): the source side of the task.
FORMATS = [
    lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",               # 27 November 2026
    lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",              # November 27, 2026
    lambda d: f"{MONTHS[d.month - 1][:3]} {d.day}, {d.year}",          # Nov 27, 2026
    lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {d.year}",           # 27 Nov 2026
    lambda d: f"{d.month:02d}/{d.day:02d}/{d.year}",                   # 11/27/2026
    lambda d: f"{d.month:02d}/{d.day:02d}/{d.year % 100:02d}",         # 11/27/26
    lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",                   # 27.11.2026
    lambda d: (f"{WEEKDAYS[d.weekday()]}, {MONTHS[d.month - 1]} {d.day}, "
               f"{d.year}"),                                           # Friday, November 27, 2026
    lambda d: f"{d.day:02d}-{MONTHS[d.month - 1][:3].upper()}-{d.year}",  # 27-NOV-2026
    lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",                   # 2026/11/27
    lambda d: (f"{WEEKDAYS[d.weekday()][:3]} {d.day} "
               f"{MONTHS[d.month - 1][:3]} {d.year}"),                 # Fri 27 Nov 2026
    lambda d: f"{MONTHS[d.month - 1]} {_ordinal(d.day)}, {d.year}",    # November 27th, 2026
]
# The longest source: format 7 with the longest weekday and month names and a two-digit day.
SOURCE_LENGTH = len("Wednesday, September 27, 2000")


class DateSplit(NamedTuple):
    """One split of the dates task. n examples:
    source          int64 [n, SOURCE_LENGTH]: the written date's characters as VOCAB
                    indices, padded at the end with PAD
    source_lengths  int64 [n]: how many of them are characters (1..SOURCE_LENGTH)
    target          int64 [n, TARGET_LENGTH]: YYYY-MM-DD's characters, then END
    source_text, target_text: the strings themselves (lists of n str)"""
    source: np.ndarray
    source_lengths: np.ndarray
    target: np.ndarray
    source_text: list
    target_text: list


def encode(text, length):
    """`text`'s VOCAB indices padded with PAD to `length` (int64 [length])."""
    out = np.full(length, PAD, np.int64)
    out[:len(text)] = [TOKEN[c] for c in text]
    return out


def decode(tokens):
    """The characters of `tokens` (VOCAB indices) before the first END; PAD and START
    dropped."""
    out = []
    for t in tokens:
        t = int(t)
        if t == END:
            break
        if t > END:
            out.append(VOCAB[t])
    return "".join(out)


def _split(days, n, formats, rng):
    chosen = days[rng.integers(0, len(days), n)]
    fmt = rng.integers(0, len(formats), n)
    source_text, target_text = [], []
    for day, f in zip(chosen, fmt):
        d = FIRST_DAY + datetime.timedelta(days=int(day))
        source_text.append(formats[f](d))
        target_text.append(d.isoformat())
    source = np.stack([encode(s, SOURCE_LENGTH) for s in source_text])
    lengths = np.array([len(s) for s in source_text], np.int64)
    target = np.stack([np.append(encode(t, TARGET_LENGTH - 1), END) for t in target_text])
    return DateSplit(source, lengths, target, source_text, target_text)


def dates(n_train, n_test, seed=1):
    """The dates task: (train, test), DateSplits of n_train and n_test examples. Each
    example is a day between 1950-01-01 and 2049-12-31 written in one of the 12 FORMATS
    (chosen uniformly), to be rewritten as YYYY-MM-DD. The days are split first: a tenth of
    them (3,652, chosen by the seed) are test days, never seen in training, so a model must
    learn the rewriting, not the days. The seed alone decides every example."""
    if n_train < 1 or n_test < 1:
        raise ValueError("dates: n_train and n_test must be at least 1")
    days = np.random.default_rng([seed, 0]).permutation((LAST_DAY - FIRST_DAY).days + 1)
    n_test_days = len(days) // 10
    test_days, train_days = np.sort(days[:n_test_days]), np.sort(days[n_test_days:])
    train = _split(train_days, n_train, FORMATS, np.random.default_rng([seed, 1]))
    test = _split(test_days, n_test, FORMATS, np.random.default_rng([seed, 2]))
    return train, test


# ---- CTR: parasync-gen-ctr's files ------------------------------------------------------------

class CtrSplit(NamedTuple):
    """One split of a click-through data set. n examples, K id columns, D dense features:
    ids  int64 [n, K]: the categorical features' ids (uint64 files reinterpreted bit for bit,
         so a hashed id above 2^63 becomes a negative int64: the same 64 bits, which is what
         an unbounded table keys on)
    x    float32 [n, D] (D = 0 when the split has no _x.npy)
    y    float32 [n]: 0 or 1 (clicked)"""
    ids: np.ndarray
    x: np.ndarray
    y: np.ndarray


def _npy(path):
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise DataError(f"no {path} (parasync-gen-ctr --out DIR writes it)") from None
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path}: {e}") from None


def ctr(directory, split):
    """The `split` ("train" or "test") of a click-through data set in `directory`, as
    parasync reads one (docs/data.md): <split>_ids.npy (int64 or uint64, [n] or [n, K]),
    <split>_y.npy (0/1, [n]) and, if present, <split>_x.npy (float32 [n, D]). Returns a
    CtrSplit; raises DataError naming the file that is missing or does not fit."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, not {split!r}")
    base = os.path.join(directory, split)
    ids = _npy(base + "_ids.npy")
    y = _npy(base + "_y.npy")
    if ids.dtype not in (np.int64, np.uint64) or ids.ndim not in (1, 2):
        raise DataError(f"{base}_ids.npy is {ids.dtype} {list(ids.shape)}, not int64 or uint64 "
                        f"[n] or [n, K]")
    ids = ids.reshape(len(ids), -1).view(np.int64)
    if y.ndim != 1 or len(y) != len(ids) or not np.isin(y, (0, 1)).all():
        raise DataError(f"{base}_y.npy must be {len(ids)} labels, each 0 or 1")
    if os.path.exists(base + "_x.npy"):
        x = _npy(base + "_x.npy")
        if x.ndim != 2 or len(x) != len(ids):
            raise DataError(f"{base}_x.npy is {list(x.shape)}, not [{len(ids)}, D]")
        x = x.astype(np.float32, copy=False)
    else:
        x = np.zeros((len(ids), 0), np.float32)
    return CtrSplit(np.ascontiguousarray(ids), x, y.astype(np.float32))
