"""A small vision transformer in plain torch, a module osdp-sim did not write, for describe_module
and a real 2-rank run of a plan applied through its LAYOUT (tests/test_model_describe.py).

patch_embed (a Conv2d over 4x4 patches, a class token, learned positions) -> blocks (pre-LN:
norm1, attn (qkv Linear, SDPA, proj Linear), norm2, mlp (fc1, GELU, fc2)) -> norm -> head (a
Linear classifier on the class token). forward(images, labels) is the cross-entropy loss;
forward(images) the logits.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from osdp_sim.model.layout import GroupLayout, ModelLayout, SplitTarget

LAYOUT = ModelLayout(
    name="vit",
    blocks="blocks",
    attn=GroupLayout(modules=("norm1", "attn"), splits=(SplitTarget("attn.qkv"), SplitTarget("attn.proj"))),
    mlp=GroupLayout(modules=("norm2", "mlp"), splits=(SplitTarget("mlp.fc1"), SplitTarget("mlp.fc2"))),
    root=("patch_embed", "norm", "head"),
    embed=("patch_embed",),
)


@dataclass(frozen=True)
class ViTArgs:
    image: int = 32
    patch: int = 4
    channels: int = 3
    dim: int = 128
    depth: int = 2
    heads: int = 4
    mlp_dim: int = 512
    classes: int = 10

    @property
    def tokens(self) -> int:
        return (self.image // self.patch) ** 2 + 1


class PatchEmbed(nn.Module):
    def __init__(self, a: ViTArgs):
        super().__init__()
        self.proj = nn.Conv2d(a.channels, a.dim, a.patch, stride=a.patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, a.dim))
        self.pos = nn.Parameter(torch.zeros(1, a.tokens, a.dim))

    def forward(self, images):
        x = self.proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + self.pos


class Attention(nn.Module):
    def __init__(self, a: ViTArgs):
        super().__init__()
        self.heads = a.heads
        self.qkv = nn.Linear(a.dim, 3 * a.dim)
        self.proj = nn.Linear(a.dim, a.dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, a: ViTArgs):
        super().__init__()
        self.fc1 = nn.Linear(a.dim, a.mlp_dim)
        self.fc2 = nn.Linear(a.mlp_dim, a.dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, a: ViTArgs):
        super().__init__()
        self.norm1 = nn.LayerNorm(a.dim)
        self.attn = Attention(a)
        self.norm2 = nn.LayerNorm(a.dim)
        self.mlp = MLP(a)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, a: ViTArgs = ViTArgs()):
        super().__init__()
        self.args = a
        self.patch_embed = PatchEmbed(a)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.depth))
        self.norm = nn.LayerNorm(a.dim)
        self.head = nn.Linear(a.dim, a.classes)

    def forward(self, images, labels=None):
        x = self.patch_embed(images)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, 0])
        if labels is None:
            return logits
        return F.cross_entropy(logits.float(), labels)


def batch(a: ViTArgs, micro_batch: int, generator: torch.Generator):
    """Random images and labels (inputs of forward)."""
    images = torch.randn(micro_batch, a.channels, a.image, a.image, generator=generator)
    labels = torch.randint(0, a.classes, (micro_batch,), generator=generator)
    return images, labels


def runnable():
    """The factory osdp_sim.runtime.factory runs on every rank (after seeding torch)."""
    from osdp_sim.runtime.factory import Runnable
    a = ViTArgs()
    model = ViT(a)
    for p in model.parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, std=0.02)
    return Runnable(model=model, layout=LAYOUT, batch=lambda mb, g: batch(a, mb, g))
