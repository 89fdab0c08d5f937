#!/usr/bin/python3
"""PyTorch reference of Kuangchao's GPT model and optimizer, for the training benchmarks.

The model is the one the C++ engine trains (docs/user-guide/models.md): GPT-2 style,
decoder-only, pre-LayerNorm, written with plain matmuls and softmax so that every operation
is visible. Its parameters carry the C++ tensor names (wte, wpe, h.0.ln1.weight, ...,
lnf.bias, lm_head.weight) and are registered in the C++ arena order, so an exported
params.bin loads by name.

Used by compare_losses.py and throughput.py; importable on its own:

    import torch_gpt
    cfg = torch_gpt.load_config("examples/models/gpt-tiny.yaml")   # or a model.json
    model = torch_gpt.GPT(cfg)
    optimizer = torch_gpt.make_optimizer(model, cfg.training)
    losses = torch_gpt.train_steps(model, batches, steps=10, training=cfg.training,
                                   optimizer=optimizer)

Run directly, it is a self-test (gradient check in float64 and a short training run on
random tokens):

    bench/train/torch_gpt.py [--config examples/models/gpt-tiny.yaml] [--steps 20]

PyTorch comes from Debian (python3-torch, installed for /usr/bin/python3 only). Importing
this module under another Python re-executes the running script with /usr/bin/python3; if
torch is missing there and we are root, it is installed with apt-get.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _is_system_python() -> bool:
    try:
        return os.path.samefile(sys.executable, SYSTEM_PYTHON)
    except OSError:
        return False


def ensure_torch() -> None:
    """Makes `import torch` work: re-exec under /usr/bin/python3, install python3-torch if root."""
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    if not _is_system_python() and os.path.exists(SYSTEM_PYTHON):
        script = sys.argv[0] if sys.argv and sys.argv[0] else ""
        if script and os.path.exists(script):
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, script, *sys.argv[1:]])
        raise ImportError(
            f"torch is not importable from {sys.executable}; run this with {SYSTEM_PYTHON} "
            "(Debian's python3-torch is installed for it only)")
    if os.geteuid() == 0:
        print("torch_gpt: torch is missing; installing python3-torch with apt-get ...",
              file=sys.stderr, flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        rc = subprocess.call(["apt-get", "install", "-y", "-q", "python3-torch"], env=env,
                             stdout=subprocess.DEVNULL)
        if rc != 0:
            subprocess.call(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
            rc = subprocess.call(["apt-get", "install", "-y", "-q", "python3-torch"], env=env,
                                 stdout=subprocess.DEVNULL)
        if rc != 0:
            raise ImportError("apt-get install -y python3-torch failed; install it and rerun")
        import importlib
        importlib.invalidate_caches()
        return
    raise ImportError(
        "PyTorch is not installed. Install Debian's package as root: "
        "apt-get install -y python3-torch, then rerun with /usr/bin/python3")


ensure_torch()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Configuration: from an exported model.json or from a kc model YAML.


@dataclasses.dataclass
class TrainingConfig:
    lr: float = 3e-4
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    min_lr_fraction: float = 0.1


@dataclasses.dataclass
class GPTConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    batch: int  # sequences per step: batch_per_rank for a YAML, the global batch for model.json
    tied_embeddings: bool = True
    layernorm_eps: float = 1e-5
    steps: int | None = None  # total steps of the run (the LR schedule's S), if known
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)

    def __post_init__(self) -> None:
        if self.hidden % self.heads != 0:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameter_count(self) -> int:
        L, C, F_, V, T = self.layers, self.hidden, self.ffn_hidden, self.vocab, self.seq_len
        n = V * C + T * C + L * (4 * C * C + 2 * C * F_ + 9 * C + F_) + 2 * C
        return n + (0 if self.tied_embeddings else V * C)

    def flops_per_token(self) -> float:
        """Training FLOPs per token, as docs/user-guide/models.md counts them."""
        L, C, F_, V, T = self.layers, self.hidden, self.ffn_hidden, self.vocab, self.seq_len
        n_blocks = L * (4 * C * C + 2 * C * F_ + 9 * C + F_) + 2 * C
        return 6.0 * (n_blocks + V * C) + 6.0 * L * T * C


def _parse_scalar(text: str):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_parse_scalar(part) for part in inner.split(",")] if inner else []
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    if text in ("null", "~", ""):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _strip_comment(line: str) -> str:
    # A '#' starts a comment at the line start or after whitespace, outside quotes.
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def read_simple_yaml(path: Path) -> dict:
    """Reads the YAML subset kc model files use: nested maps by indentation, scalars, [a, b]."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = _strip_comment(raw).rstrip()
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        indent = len(line) - len(line.lstrip(" "))
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*:(.*)$", line.strip())
        if not m:
            raise ValueError(f"{path}:{lineno}: cannot read this line (only 'key: value' maps "
                             f"are supported without PyYAML): {raw!r}")
        while stack and indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        key, value = m.group(1), m.group(2).strip()
        if value == "":
            child: dict = {}
            parent[key] = child
            stack.append((indent, child))
        else:
            parent[key] = _parse_scalar(value)
    return root


def read_yaml(path: Path) -> dict:
    try:
        import yaml  # python3-yaml, if installed
    except ImportError:
        return read_simple_yaml(path)
    with open(path) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a map at the top level")
    return data


def _num(value, what: str) -> float:
    # PyYAML (YAML 1.1) reads "1e-3" as a string; kc reads it as a number.
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected a number, got {value!r}") from None


def config_from_yaml_dict(d: dict) -> GPTConfig:
    for key in ("layers", "hidden", "heads", "seq_len", "batch_per_rank"):
        if key not in d:
            raise ValueError(f"model YAML: required key '{key}' is missing")
    t = d.get("training") or {}
    betas = t.get("betas", [0.9, 0.95])
    if not isinstance(betas, (list, tuple)) or len(betas) != 2:
        raise ValueError(f"training.betas: expected two numbers, got {betas!r}")
    training = TrainingConfig(
        lr=_num(t.get("lr", 3e-4), "training.lr"),
        warmup_steps=int(t.get("warmup_steps", 0)),
        weight_decay=_num(t.get("weight_decay", 0.0), "training.weight_decay"),
        grad_clip=_num(t.get("grad_clip", 1.0), "training.grad_clip"),
        beta1=_num(betas[0], "training.betas[0]"),
        beta2=_num(betas[1], "training.betas[1]"),
        eps=_num(t.get("eps", 1e-8), "training.eps"),
        min_lr_fraction=_num(t.get("min_lr_fraction", 0.1), "training.min_lr_fraction"),
    )
    hidden = int(d["hidden"])
    return GPTConfig(
        name=str(d.get("name", "model")), layers=int(d["layers"]), hidden=hidden,
        heads=int(d["heads"]), ffn_hidden=int(d.get("ffn_hidden", 4 * hidden)),
        vocab=int(d.get("vocab", 256)), seq_len=int(d["seq_len"]),
        batch=int(d["batch_per_rank"]), tied_embeddings=bool(d.get("tied_embeddings", True)),
        layernorm_eps=_num(d.get("layernorm_eps", 1e-5), "layernorm_eps"), training=training)


def config_from_model_json(d: dict) -> GPTConfig:
    for key in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len", "batch"):
        if key not in d:
            raise ValueError(f"model.json: required key '{key}' is missing")
    t = d.get("training") or {}
    defaults = TrainingConfig()
    training = TrainingConfig(**{f.name: type(getattr(defaults, f.name))(t[f.name])
                                 for f in dataclasses.fields(TrainingConfig) if f.name in t})
    return GPTConfig(
        name=str(d.get("name", "model")), layers=int(d["layers"]), hidden=int(d["hidden"]),
        heads=int(d["heads"]), ffn_hidden=int(d["ffn_hidden"]), vocab=int(d["vocab"]),
        seq_len=int(d["seq_len"]), batch=int(d["batch"]),
        tied_embeddings=bool(d.get("tied_embeddings", True)),
        layernorm_eps=float(d.get("layernorm_eps", 1e-5)),
        steps=int(d["steps"]) if d.get("steps") is not None else None, training=training)


def load_config(path: str | Path) -> GPTConfig:
    """A GPTConfig from a kc model YAML (*.yaml, *.yml) or an exported model.json."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model file not found: {path}")
    if path.suffix == ".json":
        return config_from_model_json(json.loads(path.read_text()))
    return config_from_yaml_dict(read_yaml(path))


# ---------------------------------------------------------------------------------------------
# The model.


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        # Biased variance, as F.layer_norm.
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class Linear(nn.Module):
    """y = x @ weight^T + bias, weight [out, in] row-major as in the C++ engine."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim))
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None

    def forward(self, x):
        y = x @ self.weight.t()
        return y + self.bias if self.bias is not None else y


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.qkv = Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = Linear(cfg.hidden, cfg.hidden)
        self.heads = cfg.heads
        self.hidden = cfg.hidden
        self._masks: dict = {}  # not a buffer: DDP would broadcast it, and gloo has no bool

    def causal_mask(self, T: int, device) -> torch.Tensor:
        key = (T, str(device))
        if key not in self._masks:
            self._masks[key] = torch.ones(T, T, dtype=torch.bool, device=device).triu(1)
        return self._masks[key]

    def forward(self, x):
        B, T, C = x.shape
        NH, hd = self.heads, C // self.heads
        qkv = self.qkv(x)
        q, k, v = qkv.split(C, dim=-1)  # cols [0,C), [C,2C), [2C,3C)
        # Head h takes columns [h*hd, (h+1)*hd) of each.
        q = q.view(B, T, NH, hd).transpose(1, 2)
        k = k.view(B, T, NH, hd).transpose(1, 2)
        v = v.view(B, T, NH, hd).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        scores = scores.masked_fill(self.causal_mask(T, x.device), float("-inf"))
        att = torch.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = Linear(cfg.hidden, cfg.ffn_hidden)
        self.proj = Linear(cfg.ffn_hidden, cfg.hidden)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        # Registration order is the arena order: ln1, attn.qkv, attn.proj, ln2, mlp.fc, mlp.proj.
        self.ln1 = LayerNorm(cfg.hidden, cfg.layernorm_eps)
        self.attn = Attention(cfg)
        self.ln2 = LayerNorm(cfg.hidden, cfg.layernorm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """named_parameters() yields the C++ names in the C++ arena order."""

    def __init__(self, cfg: GPTConfig, seed: int = 1337):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))
        self.wpe = nn.Parameter(torch.empty(cfg.seq_len, cfg.hidden))
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.lnf = LayerNorm(cfg.hidden, cfg.layernorm_eps)
        self.lm_head = None if cfg.tied_embeddings else Linear(cfg.hidden, cfg.vocab, bias=False)
        self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """GPT-2's initialisation (for standalone runs; compare_losses loads kc's weights)."""
        g = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0 if name.endswith("ln1.weight") or name.endswith("ln2.weight")
                        or name == "lnf.weight" else 0.0)
            else:
                std = residual_std if name.endswith("proj.weight") else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than seq_len {self.cfg.seq_len}")
        x = self.wte[idx] + self.wpe[:T]
        for block in self.h:
            x = block(x)
        x = self.lnf(x)
        head = self.wte if self.lm_head is None else self.lm_head.weight
        logits = x @ head.t()
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss


def expected_tensors(cfg: GPTConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The C++ arena layout: (name, shape) in order."""
    C, F_, V, T = cfg.hidden, cfg.ffn_hidden, cfg.vocab, cfg.seq_len
    out = [("wte", (V, C)), ("wpe", (T, C))]
    for l in range(cfg.layers):
        p = f"h.{l}."
        out += [(p + "ln1.weight", (C,)), (p + "ln1.bias", (C,)),
                (p + "attn.qkv.weight", (3 * C, C)), (p + "attn.qkv.bias", (3 * C,)),
                (p + "attn.proj.weight", (C, C)), (p + "attn.proj.bias", (C,)),
                (p + "ln2.weight", (C,)), (p + "ln2.bias", (C,)),
                (p + "mlp.fc.weight", (F_, C)), (p + "mlp.fc.bias", (F_,)),
                (p + "mlp.proj.weight", (C, F_)), (p + "mlp.proj.bias", (C,))]
    out += [("lnf.weight", (C,)), ("lnf.bias", (C,))]
    if not cfg.tied_embeddings:
        out.append(("lm_head.weight", (V, C)))
    return out


@torch.no_grad()
def load_params(model: GPT, params_path: str | Path, tensors: list[dict] | None = None) -> None:
    """Loads a float32 little-endian arena (params.bin) into the model, by tensor name.

    tensors: model.json's [{"name", "shape", "offset"}] (offset in float32 elements); without
    it the arena is assumed to be packed back to back in the C++ order.
    """
    arena = np.fromfile(params_path, dtype="<f4")
    if tensors is None:
        tensors, offset = [], 0
        for name, shape in expected_tensors(model.cfg):
            tensors.append({"name": name, "shape": list(shape), "offset": offset})
            offset += math.prod(shape)
    params = dict(model.named_parameters())
    seen = set()
    for t in tensors:
        name, shape, offset = t["name"], tuple(t["shape"]), int(t["offset"])
        if name not in params:
            raise ValueError(f"{params_path}: tensor '{name}' is not a parameter of the torch "
                             f"model (its parameters: {', '.join(list(params)[:4])}, ...)")
        p = params[name]
        if tuple(p.shape) != shape:
            raise ValueError(f"{params_path}: tensor '{name}' has shape {list(shape)}, "
                             f"the torch model expects {list(p.shape)}")
        n = math.prod(shape)
        if offset < 0 or offset + n > arena.size:
            raise ValueError(f"{params_path}: tensor '{name}' at offset {offset} with {n} "
                             f"elements runs past the end of the file ({arena.size} floats)")
        p.copy_(torch.from_numpy(arena[offset:offset + n].reshape(shape).copy()).to(p.dtype))
        seen.add(name)
    missing = [n for n in params if n not in seen]
    if missing:
        raise ValueError(f"{params_path}: no values for {len(missing)} parameters, "
                         f"e.g. {missing[0]}")


# ---------------------------------------------------------------------------------------------
# Optimizer and schedule.


def lr_at(step: int, total_steps: int, t: TrainingConfig) -> float:
    """Learning rate of step `step` (from 0) of `total_steps`: linear warmup, cosine decay."""
    if t.warmup_steps > 0 and step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, total_steps - t.warmup_steps)
    min_lr = t.lr * t.min_lr_fraction
    return min_lr + 0.5 * (t.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, t: TrainingConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on the 2-D tensors only (wte, wpe, the matrices)."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps)


def train_step(model: nn.Module, optimizer, inputs, targets, lr: float, grad_clip: float):
    """One step: forward, backward, clip, AdamW. Returns (loss, grad_norm before clipping)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(inputs, targets)
    loss.backward()
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters()
                              if p.grad is not None))
    optimizer.step()
    return loss.detach(), float(norm)


def train_steps(model: nn.Module, batches, steps: int, training: TrainingConfig | None = None,
                optimizer=None, total_steps: int | None = None, on_step=None) -> list[float]:
    """Trains `steps` steps on `batches` (an iterable of (inputs, targets) int64 tensors [B, T]).

    The LR schedule runs over total_steps (default: steps). on_step(step, loss, lr, grad_norm)
    is called after each step (step from 0). Returns the losses, one per step.
    """
    core = model.module if hasattr(model, "module") else model
    training = training or core.cfg.training
    optimizer = optimizer or make_optimizer(model, training)
    total = total_steps or steps
    losses = []
    model.train()
    for s, (inputs, targets) in zip(range(steps), batches):
        lr = lr_at(s, total, training)
        loss, norm = train_step(model, optimizer, inputs, targets, lr, training.grad_clip)
        losses.append(float(loss))
        if on_step:
            on_step(s, losses[-1], lr, norm)
    if len(losses) < steps:
        raise ValueError(f"batches ran out after {len(losses)} of {steps} steps")
    return losses


# ---------------------------------------------------------------------------------------------
# Data.


def read_batches_bin(path: str | Path, steps: int, batch: int, seq_len: int) -> np.ndarray:
    """batches.bin (int32 LE; per step inputs [B, T] then targets [B, T]) as [S, 2, B, T]."""
    data = np.fromfile(path, dtype="<i4")
    need = steps * 2 * batch * seq_len
    if data.size < need:
        raise ValueError(f"{path}: {data.size} int32 values, {steps} steps of 2 x {batch} x "
                         f"{seq_len} need {need}")
    return data[:need].reshape(steps, 2, batch, seq_len)


SHARD_MAGIC = 0x3154434B  # "KCT1"


def read_token_shard(path: str | Path) -> tuple[np.ndarray, int, int]:
    """A kc token shard: (tokens uint16, vocab_size, eot_token)."""
    raw = Path(path).read_bytes()
    if len(raw) < 64:
        raise ValueError(f"{path}: shorter than the 64-byte token shard header")
    magic, version, token_bytes, vocab, eot, _ = np.frombuffer(raw[:24], dtype="<u4")
    (count,) = np.frombuffer(raw[24:32], dtype="<u8")
    if magic != SHARD_MAGIC:
        raise ValueError(f"{path}: bad magic, not a kc token shard")
    if version != 1 or token_bytes != 2:
        raise ValueError(f"{path}: shard version {version} / token width {token_bytes} "
                         "is not supported (expected 1 / 2)")
    if len(raw) != 64 + 2 * int(count):
        raise ValueError(f"{path}: {len(raw)} bytes, expected 64 + 2 x {count}")
    return np.frombuffer(raw[64:], dtype="<u2"), int(vocab), int(eot)


def read_manifest_tokens(manifest: str | Path, split: str = "train") -> np.ndarray:
    """All tokens of one split of a data/…/manifest.json, concatenated."""
    manifest = Path(manifest)
    m = json.loads(manifest.read_text())
    if split not in m:
        raise ValueError(f"{manifest}: no '{split}' split")
    parts = [read_token_shard(manifest.parent / s["file"])[0] for s in m[split]]
    if not parts:
        raise ValueError(f"{manifest}: the '{split}' split has no shards")
    return np.concatenate(parts)


def random_windows(tokens: np.ndarray, vocab: int, batch: int, seq_len: int,
                   rng: np.random.Generator):
    """One batch (inputs, targets) of windows of seq_len + 1 tokens at random offsets.

    Tokens >= vocab (e.g. the end-of-text token 256 with a 256-token model) wrap modulo vocab.
    """
    if tokens.size < seq_len + 1:
        raise ValueError(f"{tokens.size} tokens are fewer than one window of {seq_len + 1}")
    starts = rng.integers(0, tokens.size - seq_len - 1, size=batch)
    w = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64) % vocab
    return torch.from_numpy(w[:, :-1].copy()), torch.from_numpy(w[:, 1:].copy())


# ---------------------------------------------------------------------------------------------
# Multi-process (DDP) launching: torch.distributed.run does not work on Debian's Python 3.11.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(argv: list[str], world_size: int, env_per_rank=None, timeout: float | None = None,
                 quiet: bool = False) -> None:
    """Runs `/usr/bin/python3 *argv` once per rank with RANK/WORLD_SIZE/MASTER_* set; waits.

    env_per_rank(rank) -> dict of extra environment variables. Raises if a rank fails.
    """
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        if env_per_rank:
            env.update({k: str(v) for k, v in env_per_rank(rank).items()})
        out = subprocess.DEVNULL if quiet and rank > 0 else None
        procs.append(subprocess.Popen([SYSTEM_PYTHON, *argv], env=env, stdout=out))
    deadline = None if timeout is None else time.monotonic() + timeout
    failed = []
    try:
        for rank, p in enumerate(procs):
            left = None if deadline is None else max(1.0, deadline - time.monotonic())
            rc = p.wait(timeout=left)
            if rc != 0:
                failed.append((rank, rc))
    except subprocess.TimeoutExpired:
        failed.append(("timeout", timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if failed:
        raise RuntimeError(f"DDP ranks failed: {failed} (command: {SYSTEM_PYTHON} "
                           f"{' '.join(argv)})")


def init_distributed():
    """In a rank started by launch_ranks: init gloo, return (rank, world_size)."""
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return rank, world


def finish_distributed(code: int = 0) -> None:
    """Ends a rank: barrier, flush, _exit (destroy_process_group can hang with a live reducer)."""
    import torch.distributed as dist
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---------------------------------------------------------------------------------------------
# kc helpers: the binary, its training data, its metrics.

DEFAULT_KC = REPO_ROOT / "build/release/apps/kc/kc"
DEFAULT_MANIFEST = REPO_ROOT / "data/fortunes/manifest.json"
FORTUNES_DIR = Path("/usr/share/games/fortunes")


def find_kc(path: str | None) -> Path:
    kc = Path(path) if path else DEFAULT_KC
    if not kc.is_file() or not os.access(kc, os.X_OK):
        raise FileNotFoundError(
            f"kc binary not found at {kc}; build it with `cmake --workflow --preset release` "
            "in the repository root, or pass --kc PATH")
    return kc.resolve()


def kc_has_train(kc: Path) -> bool:
    """Whether `kc --help` lists a `train` subcommand (CLI11 answers `kc train --help` with the
    top-level help, exit 0, when there is none)."""
    r = subprocess.run([str(kc), "--help"], capture_output=True, text=True)
    return r.returncode == 0 and re.search(r"^\s+train\b", r.stdout, re.MULTILINE) is not None


def model_config_path(name_or_path: str) -> Path:
    """gpt-tiny -> examples/models/gpt-tiny.yaml; a path is taken as it is (or repo-relative)."""
    p = Path(name_or_path)
    for candidate in (p, REPO_ROOT / p, REPO_ROOT / "examples/models" / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return candidate.resolve()
    raise FileNotFoundError(f"model config not found: {name_or_path} (tried {p}, "
                            f"{REPO_ROOT / p}, examples/models/{name_or_path}.yaml)")


def ensure_data(kc: Path | None, manifest: str | None) -> Path | None:
    """The training data's manifest; makes data/fortunes with `kc data prepare` if missing.

    Returns None when there is no data and it cannot be made (the caller says so).
    """
    if manifest:
        m = Path(manifest)
        if not m.is_file():
            raise FileNotFoundError(f"data manifest not found: {m}")
        return m.resolve()
    if DEFAULT_MANIFEST.is_file():
        return DEFAULT_MANIFEST
    if kc is None:
        return None
    if not FORTUNES_DIR.is_dir() and os.geteuid() == 0:
        print("data: installing the Debian package fortunes ...", file=sys.stderr, flush=True)
        subprocess.call(["apt-get", "install", "-y", "-q", "fortunes"],
                        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
                        stdout=subprocess.DEVNULL)
    if not FORTUNES_DIR.is_dir():
        return None
    out = DEFAULT_MANIFEST.parent
    print(f"data: {DEFAULT_MANIFEST} is missing; making it with kc data prepare",
          file=sys.stderr, flush=True)
    r = subprocess.run([str(kc), "data", "prepare", "--out", str(out), "--doc-separator", "%",
                        str(FORTUNES_DIR)], capture_output=True, text=True)
    if r.returncode != 0 or not DEFAULT_MANIFEST.is_file():
        raise RuntimeError(f"kc data prepare failed (exit {r.returncode}): {r.stderr.strip()}")
    return DEFAULT_MANIFEST


def read_metrics(path: str | Path) -> tuple[list[dict], dict | None]:
    """kc's metrics JSONL: (the "step" records sorted by step, the "summary" record or None)."""
    steps, summary = [], None
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not JSON: {e}") from None
        if rec.get("type") == "step":
            steps.append(rec)
        elif rec.get("type") == "summary":
            summary = rec
    steps.sort(key=lambda r: r["step"])
    return steps, summary


# ---------------------------------------------------------------------------------------------
# Self-test.


def _self_test(args) -> int:
    cfg = load_config(args.config)
    print(f"config {args.config}: {cfg.name} L{cfg.layers} C{cfg.hidden} NH{cfg.heads} "
          f"F{cfg.ffn_hidden} V{cfg.vocab} T{cfg.seq_len} B{cfg.batch}, "
          f"{cfg.parameter_count():,} parameters, {cfg.flops_per_token():.3g} FLOPs/token")
    names = [(n, tuple(p.shape)) for n, p in GPT(cfg).named_parameters()]
    assert names == expected_tensors(cfg), "parameter names/order differ from the C++ arena"
    print("parameter names and order match the C++ arena layout")

    # Gradient check in float64 on a tiny model (every parameter, through the loss).
    tiny = GPTConfig(name="gradcheck", layers=2, hidden=8, heads=2, ffn_hidden=12, vocab=11,
                     seq_len=5, batch=2, tied_embeddings=False)
    for tied in (True, False):
        tiny.tied_embeddings = tied
        m = GPT(tiny, seed=1).double()
        with torch.no_grad():  # non-trivial LayerNorm and bias values
            for p in m.parameters():
                if p.dim() == 1:
                    p.add_(torch.randn(p.shape, dtype=p.dtype) * 0.1)
        g = torch.Generator().manual_seed(2)
        idx = torch.randint(0, tiny.vocab, (2, 5), generator=g)
        tgt = torch.randint(0, tiny.vocab, (2, 5), generator=g)
        names, params = zip(*m.named_parameters())

        # Compare autograd with central finite differences on sampled coordinates.
        _, loss = m(idx, tgt)
        grads = torch.autograd.grad(loss, params)
        worst = 0.0
        for name, p, grad in zip(names, params, grads):
            flat = p.data.view(-1)
            for i in torch.randperm(flat.numel(), generator=g)[:6].tolist():
                old = flat[i].item()
                with torch.no_grad():
                    flat[i] = old + 1e-6
                    lp = m(idx, tgt)[1].item()
                    flat[i] = old - 1e-6
                    lm = m(idx, tgt)[1].item()
                    flat[i] = old
                fd = (lp - lm) / 2e-6
                diff = abs(fd - grad.view(-1)[i].item())
                worst = max(worst, diff / max(1e-3, abs(fd)))
                if diff > 1e-7 + 1e-4 * abs(fd):  # finite differences carry ~1e-9 of noise
                    print(f"gradient check FAILED at {name}[{i}]: autograd "
                          f"{grad.view(-1)[i].item():.8g}, finite difference {fd:.8g}")
                    return 1
        print(f"gradient check (float64, tied={tied}): autograd matches finite differences, "
              f"worst error {worst:.2e} (relative, or absolute below 1e-3)")

    # A short training run on random tokens: the loss must fall.
    torch.manual_seed(0)
    model = GPT(cfg)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, min(cfg.vocab, 32), size=50_000).astype(np.uint16)
    tokens = np.tile(tokens[:997], 60)  # a repeating pattern that the model can learn
    batches = (random_windows(tokens, cfg.vocab, 4, min(cfg.seq_len, 64), rng)
               for _ in range(args.steps))
    t = dataclasses.replace(cfg.training, warmup_steps=min(cfg.training.warmup_steps, 2))
    t0 = time.perf_counter()
    losses = train_steps(model, batches, args.steps, training=t)
    dt = time.perf_counter() - t0
    print(f"training on a repeating random sequence, {args.steps} steps in {dt:.1f} s: "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f} (ln V = {math.log(cfg.vocab):.4f})")
    if not losses[-1] < losses[0] - 0.1:
        print("FAILED: the loss did not fall")
        return 1
    print("ok")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO_ROOT / "examples/models/gpt-tiny.yaml"),
                    help="kc model YAML or exported model.json (default: gpt-tiny)")
    ap.add_argument("--steps", type=int, default=20, help="training steps of the self-test")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return _self_test(args)


if __name__ == "__main__":
    sys.exit(main())
