"""Small real models shared by test_models.py and scripts/bench-torch:
an MLP, a CNN of ResNet basic blocks, nn.TransformerEncoderLayer and a
GPT-style decoder block (and CachedAttention, one decode step over a
static KV cache, for test_backend.py and test_aot_cache.py). Each entry: (constructor, input maker, loss)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=64, hidden=128, d_out=10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                                 nn.Tanh(), nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.net(x)


class CachedAttention(nn.Module):
    """One decode step of attention over a static KV cache written with
    index_copy_, as transformers' StaticCache writes it."""

    def __init__(self, d=16, heads=2, length=24):
        super().__init__()
        self.h, self.e = heads, d // heads
        self.q, self.kv = nn.Linear(d, d), nn.Linear(d, 2 * d)
        self.register_buffer("k", torch.randn(1, heads, length, d // heads))
        self.register_buffer("v", torch.randn(1, heads, length, d // heads))

    def forward(self, x, pos):
        q = self.q(x).view(1, 1, self.h, self.e).transpose(1, 2)
        k, v = self.kv(x).view(1, 1, 2, self.h, self.e).permute(2, 0, 3, 1, 4)
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        att = torch.softmax(q @ self.k.transpose(-1, -2) * self.e ** -0.5, -1)
        return (att @ self.v).transpose(1, 2).reshape(1, 1, -1)


class BasicBlock(nn.Module):
    """ResNet's basic block: conv-bn-relu-conv-bn + (projected) shortcut, relu."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.short is None else self.short(x)))


class ResNetSmall(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class GPTBlock(nn.Module):
    """Pre-LN decoder block: causal self-attention + GELU MLP, residuals."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def _encoder_layer():
    return nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                      batch_first=True)


def _xent(out, target):
    return F.cross_entropy(out, target)


def _mse(out, target):
    return F.mse_loss(out, target)


# name -> (make model, make (input, target), loss)
MODELS = {
    "mlp": (MLP, lambda b=32: (torch.randn(b, 64), torch.randint(0, 10, (b,))), _xent),
    "resnet": (ResNetSmall, lambda b=8: (torch.randn(b, 3, 16, 16), torch.randint(0, 10, (b,))),
               _xent),
    "transformer": (_encoder_layer, lambda b=4: (torch.randn(b, 16, 64), torch.randn(b, 16, 64)),
                    _mse),
    "gpt": (GPTBlock, lambda b=4: (torch.randn(b, 16, 64), torch.randn(b, 16, 64)), _mse),
}


class BertEncoder(nn.Module):
    """BERT from `transformers`, random-initialised small config (no
    downloads), as a module from token ids to its last hidden state."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        cfg = BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=128,
                         max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
        self.bert = BertModel(cfg, add_pooling_layer=False)

    def forward(self, ids):
        return self.bert(input_ids=ids).last_hidden_state


# The benchmark's models (scripts/bench-torch): the test models, and BERT
# when `transformers` is installed.
BENCH_MODELS = dict(MODELS)
try:
    import transformers  # noqa: F401

    BENCH_MODELS["bert"] = (BertEncoder, lambda b=4: (torch.randint(0, 256, (b, 24)),
                                                      torch.randn(b, 24, 64)), _mse)
except ImportError:
    pass
