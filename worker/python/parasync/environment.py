"""The worker's settings from its environment: what parasync-launch --worker-command, the
Kubernetes and Slurm files and systemd units give a worker (docs/worker-environment.md).

The cluster itself (TF_CONFIG) is resolved by the client library, exactly as parasync-worker
resolves it; this module reads the rest. Explicit arguments always win over the environment.
"""

from __future__ import annotations

import dataclasses
import math
import os

from . import errors

# parasync-worker's --epochs default: parasync.training.Run's too, and the cosine
# schedule's length in epochs when neither the script nor PARASYNC_EPOCHS gives one.
DEFAULT_EPOCHS = 5
LR_SCHEDULES = ("constant", "cosine")  # parasync-worker's --lr-schedule values


def _number(name: str, kind, default, low=None):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise errors.InvalidArgument(f"{name}={raw!r} is not a {kind.__name__}") from None
    if low is not None and value < low:
        raise errors.InvalidArgument(f"{name}={raw!r} must be at least {low}")
    return value


def _text(name: str, default=None):
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else raw


def parse_eval_every(value) -> tuple[int, float]:
    """--eval-every's value (parasync-worker's): N steps ("100", or an int) or N seconds
    ("30s") as (steps, seconds), the other 0; None: (0, 0). InvalidArgument otherwise."""
    if value is None:
        return 0, 0.0
    text = str(value).strip()
    bad = errors.InvalidArgument(f"eval_every (--eval-every, PARASYNC_EVAL_EVERY) takes a "
                                 f"number of steps (100) or seconds (30s), not {text!r}")
    try:
        if text.endswith("s"):
            seconds = float(text[:-1])
            if not 0 <= seconds <= 1e9:
                raise bad
            return 0, seconds
        steps = int(text)
    except ValueError:
        raise bad from None
    if steps < 0:
        raise bad
    return steps, 0.0


def _choice(name: str, choices: tuple, default: str) -> str:
    value = _text(name, default)
    if value not in choices:
        raise errors.InvalidArgument(f"{name}={value!r}: expected {' or '.join(choices)}")
    return value


@dataclasses.dataclass
class Settings:
    """A worker's settings. Each field is the environment variable named beside it, else the
    default parasync-worker uses for the flag of that name."""

    mode: str = "async"                   # PARASYNC_MODE
    log_dir: str = "."                    # PARASYNC_LOG_DIR: eval.jsonl, metrics snapshot
    log_level: str = "info"               # PARASYNC_LOG_LEVEL
    metrics_port: int = -1                # PARASYNC_METRICS_PORT (-1: no /metrics; 0: any)
    metrics_bind: str = "127.0.0.1"       # PARASYNC_METRICS_BIND
    request_timeout: float = 120.0        # PARASYNC_REQUEST_TIMEOUT, seconds
    connect_timeout: float = 60.0         # PARASYNC_CONNECT_TIMEOUT, seconds
    heartbeat_interval: float = 1.0       # PARASYNC_HEARTBEAT_INTERVAL, seconds
    wire_dtype: str = "float32"           # PARASYNC_WIRE_DTYPE
    topk_probe: bool = True               # PARASYNC_TOPK_PROBE: on or off
    delta_pulls: bool = True              # PARASYNC_DELTA_PULLS: on or off
    # Local aggregation (sync modes): this host's ranks, e.g. "0,1" (parasync-launch
    # --local-aggregation sets it), and where the lowest listens (None: a default).
    local_group: str | None = None        # PARASYNC_LOCAL_GROUP
    local_group_endpoint: str | None = None  # PARASYNC_LOCAL_GROUP_ENDPOINT
    curve_key: str | None = None          # PARASYNC_CURVE_KEY (this worker's key pair file)
    curve_server_key: str | None = None   # PARASYNC_CURVE_SERVER_KEY (the servers' public key)
    # Training settings a script may take as its defaults (parasync.training.Run does).
    data: str | None = None               # PARASYNC_DATA
    epochs: int | None = None             # PARASYNC_EPOCHS
    batch_size: int | None = None         # PARASYNC_BATCH_SIZE
    lr: float | None = None               # PARASYNC_LR
    optimizer: str | None = None          # PARASYNC_OPTIMIZER
    # What the servers do with the learning rate: Client.register applies it (see
    # lr_schedule_options), as parasync-worker applies --lr-schedule.
    lr_schedule: str = "constant"         # PARASYNC_LR_SCHEDULE: constant or cosine
    seed: int | None = None               # PARASYNC_SEED
    max_steps: int | None = None          # PARASYNC_MAX_STEPS
    log_every: float | None = None        # PARASYNC_LOG_EVERY, seconds
    eval_every: str | None = None         # PARASYNC_EVAL_EVERY: "N" steps or "Ns" seconds
    wait_for_workers: float = 0.0         # PARASYNC_WAIT_FOR_WORKERS, seconds (the chief)
    checkpoint_each_epoch: bool = False   # PARASYNC_CHECKPOINT_EACH_EPOCH=1
    local_rank: int = 0                   # LOCAL_RANK
    # This process is the launcher's restart of a worker (--kill ...+RESTART): how many times.
    restart: int = 0                      # PARASYNC_RESTART
    # Not counted live by the servers until a gather admits it back (parasync.horovod.elastic
    # sets it for a restarted worker; no variable).
    joining: bool = False

    @staticmethod
    def from_environment() -> "Settings":
        """Reads the variables; InvalidArgument naming one that does not parse."""
        return Settings(
            mode=_text("PARASYNC_MODE", "async"),
            log_dir=_text("PARASYNC_LOG_DIR", "."),
            log_level=_text("PARASYNC_LOG_LEVEL", "info"),
            metrics_port=_number("PARASYNC_METRICS_PORT", int, -1, low=0),
            metrics_bind=_text("PARASYNC_METRICS_BIND", "127.0.0.1"),
            request_timeout=_number("PARASYNC_REQUEST_TIMEOUT", float, 120.0),
            connect_timeout=_number("PARASYNC_CONNECT_TIMEOUT", float, 60.0),
            heartbeat_interval=_number("PARASYNC_HEARTBEAT_INTERVAL", float, 1.0),
            wire_dtype=_text("PARASYNC_WIRE_DTYPE", "float32"),
            topk_probe=_choice("PARASYNC_TOPK_PROBE", ("on", "off"), "on") == "on",
            delta_pulls=_choice("PARASYNC_DELTA_PULLS", ("on", "off"), "on") == "on",
            local_group=_text("PARASYNC_LOCAL_GROUP"),
            local_group_endpoint=_text("PARASYNC_LOCAL_GROUP_ENDPOINT"),
            curve_key=_text("PARASYNC_CURVE_KEY"),
            curve_server_key=_text("PARASYNC_CURVE_SERVER_KEY"),
            data=_text("PARASYNC_DATA"),
            epochs=_number("PARASYNC_EPOCHS", int, None, low=1),
            batch_size=_number("PARASYNC_BATCH_SIZE", int, None, low=1),
            lr=_number("PARASYNC_LR", float, None),
            optimizer=_text("PARASYNC_OPTIMIZER"),
            lr_schedule=_choice("PARASYNC_LR_SCHEDULE", LR_SCHEDULES, "constant"),
            seed=_number("PARASYNC_SEED", int, None, low=0),
            max_steps=_number("PARASYNC_MAX_STEPS", int, None, low=0),
            log_every=_number("PARASYNC_LOG_EVERY", float, None, low=0),
            eval_every=_text("PARASYNC_EVAL_EVERY"),
            wait_for_workers=_number("PARASYNC_WAIT_FOR_WORKERS", float, 0.0, low=0),
            checkpoint_each_epoch=_text("PARASYNC_CHECKPOINT_EACH_EPOCH", "0") == "1",
            local_rank=_number("LOCAL_RANK", int, 0, low=0),
            restart=_number("PARASYNC_RESTART", int, 0, low=0),
        )

    def lr_schedule_options(self, train_size: int | None, epochs: int | None) -> dict:
        """The servers' optimizer settings for lr_schedule, as parasync-worker makes them of
        --lr-schedule: none for constant; for cosine, cosine_decay_examples = `epochs` (else
        PARASYNC_EPOCHS, else DEFAULT_EPOCHS) times `train_size`, the examples of the whole
        training set (every rank's shard), rounded as parasync-worker rounds it, so the
        servers decay the rate along a half cosine to 0 over those examples applied.
        InvalidArgument for an unknown schedule, or cosine without `train_size` (the decay's
        length is unknown: refused rather than trained at a constant rate)."""
        if self.lr_schedule not in LR_SCHEDULES:
            raise errors.InvalidArgument(f"learning-rate schedule {self.lr_schedule!r}: "
                                         f"expected {' or '.join(LR_SCHEDULES)}")
        if self.lr_schedule == "constant":
            return {}
        if train_size is None:
            raise errors.InvalidArgument(
                "PARASYNC_LR_SCHEDULE=cosine (parasync-launch --lr-schedule cosine) needs the "
                "decay's length: pass train_size (the training set's examples, every rank's) to "
                "pst.Optimizer or Client.register")
        epochs = epochs if epochs is not None else (
            self.epochs if self.epochs is not None else DEFAULT_EPOCHS)
        if train_size < 1 or epochs <= 0:
            raise errors.InvalidArgument(f"a cosine schedule over {epochs} epochs of "
                                         f"{train_size} examples: both must be positive")
        # std::llround, as parasync-worker rounds epochs x examples.
        return {"cosine_decay_examples": max(1, math.floor(epochs * train_size + 0.5))}
