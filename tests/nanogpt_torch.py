"""nanoGPT's GPT (docs/course_sources.md §6g) for torch 1.13: its non-flash attention path, bias=True,
dropout 0. The reference of tests/gpt_torch.py and bench/torch_step.py."""
import math

import torch

F = torch.nn.functional


class LayerNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.bias = torch.nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, C, H, T):
        super().__init__()
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)
        self.n_head, self.n_embd = H, C
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(torch.nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = torch.nn.Linear(C, 4 * C)
        self.gelu = torch.nn.GELU()
        self.c_proj = torch.nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class MoE(torch.nn.Module):
    """Megatron-core's MoE layer as dtlab's --moe follows it (docs/course_sources.md §6i): a router
    without bias, the top-k logits (ties to the lower expert index), softmax over them in float32,
    capacity ceil(N K / E x F) per expert with the pairs past it dropped in token order (drop policy
    "position"), each expert nanoGPT's MLP, outputs weighted by the kept probabilities and summed,
    and switch_load_balancing_loss_func's E coeff / (K N^2) sum_e P_e f_e (f_e counted before capacity)."""

    def __init__(self, C, E, K, capacity=0.0, aux=0.01):
        super().__init__()
        self.router = torch.nn.Linear(C, E, bias=False)
        self.experts = torch.nn.ModuleList([MLP(C) for _ in range(E)])
        self.E, self.K, self.capacity, self.aux = E, K, capacity, aux

    def forward(self, x):
        B, T, C = x.size()
        x2 = x.reshape(-1, C)
        N, E, K = x2.size(0), self.E, self.K
        logits = self.router(x2)
        order = torch.sort(logits, dim=1, descending=True, stable=True).indices  # equal logits: the lower index first
        idx = order[:, :K]
        probs = torch.softmax(logits.gather(1, idx), dim=-1, dtype=torch.float32).type_as(logits)
        onehot = F.one_hot(idx.reshape(-1), E)  # (N K, E), token-major: the order capacity counts in
        kept = torch.ones(N, K, dtype=torch.bool)
        if self.capacity > 0:
            cap = math.ceil(N * K / E * self.capacity)
            pos = (torch.cumsum(onehot, 0) * onehot).sum(1)
            kept = (pos <= cap).view(N, K)
        final = probs * kept
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
        aux = (scores.sum(0) * onehot.sum(0)).sum() * (E * self.aux / (K * N * N))
        out = torch.zeros_like(x2)
        for e in range(E):
            tok, k = ((idx == e) & kept).nonzero(as_tuple=True)
            if len(tok):
                out = out.index_add(0, tok, self.experts[e](x2[tok]) * final[tok, k].unsqueeze(1))
        return out.view(B, T, C), aux


class Block(torch.nn.Module):
    def __init__(self, C, H, T, moe=None):
        super().__init__()
        self.ln_1 = LayerNorm(C)
        self.attn = CausalSelfAttention(C, H, T)
        self.ln_2 = LayerNorm(C)
        self.mlp = MoE(C, **moe) if moe else MLP(C)
        self.aux = None  # an MoE block's load-balancing loss of the last forward

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        if isinstance(self.mlp, MoE):
            m, self.aux = self.mlp(self.ln_2(x))
            return x + m
        return x + self.mlp(self.ln_2(x))


class GPT(torch.nn.Module):
    def __init__(self, L, H, C, T, V, moe=None, moe_every=1):
        """moe: MoE's arguments (E, K, capacity, aux) for blocks l with l % moe_every == 0."""
        super().__init__()
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(V, C), wpe=torch.nn.Embedding(T, C), drop=torch.nn.Dropout(0.0),
            h=torch.nn.ModuleList([Block(C, H, T, moe if moe and l % moe_every == 0 else None) for l in range(L)]),
            ln_f=LayerNorm(C)))
        self.lm_head = torch.nn.Linear(C, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * L))

    def _init_weights(self, m):
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)
        elif isinstance(m, torch.nn.Embedding):
            torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T, device=idx.device))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def aux_loss(self):  # the MoE blocks' load-balancing losses of the last forward (0 without MoE)
        return sum(b.aux for b in self.transformer.h if b.aux is not None) if any(b.aux is not None for b in self.transformer.h) else 0.0
