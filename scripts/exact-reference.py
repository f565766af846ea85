#!/usr/bin/env python3
"""An exact float64 forward pass of the Qwen hybrid architectures (qwen35,
qwen35moe, qwen3next) over a GGUF file, following llama.cpp's graph
(src/models/qwen35.cpp, qwen35moe.cpp, qwen3next.cpp, delta-net-base.cpp and
ggml-cpu's ops) step by step, for the tests that judge an implementation
against it. Every tensor is dequantized by llama.cpp's own `gguf` package
(`gguf.quants.dequantize`) and everything after that is float64.

For each prompt (a list of token ids) it extends the sequence greedily by
--gen tokens (argmax of the float64 logits) and writes, for every position of
prompt + continuation, the top-20 [token_id, logprob] of the next token
(log_softmax in float64, best first):

    {"arch": ..., "sequences": [{"tokens": [...prompt and greedy ids...],
                                 "n_prompt": N,
                                 "top": [[[id, logprob] x 20] per position]}]}

Usage (from the repository root):
    python3 scripts/exact-reference.py MODEL.gguf --prompts prompts.json --gen 32 -o ref.json
    (prompts.json: [[1,2,3],[100,2000,30000]] - a list of token-id lists)
Needs: pip install gguf numpy   (written against gguf 0.19)

The model runs one token at a time with its caches (the Gated DeltaNet
state and conv window, the attention KV), which is the same causal function
llama.cpp computes for a whole batch. Semantics worth knowing, all read off
llama.cpp:
  * Gated DeltaNet: V head h reads K head h % n_k_heads in qwen35/qwen35moe
    (V heads stored tiled) and h // (n_v_heads / n_k_heads) in qwen3next
    (grouped); q and k are L2-normalised as x / sqrt(sum(x^2) + eps) with eps
    the RMS-norm eps, q is scaled by 1/sqrt(head_k_dim); per step
    S *= exp(g); delta = (v - S^T k) * beta; S += k delta^T; o = S^T q.
  * attention: attn_q's output interleaves per head [query (hd), gate (hd)];
    per-head RMS norms on q and k, RoPE over the first rope.dimension_count
    dims in NeoX pairs (i, i + n_rot/2); qwen35* use IMROPE, whose text
    positions are (p, p, p, 0) over the 4 sections (pairs falling in the
    4th section do not rotate); output times sigmoid(gate).
  * MoE: softmax over all experts, top-k, the k weights renormalised to sum
    1, plus a shared expert scaled by sigmoid(ffn_gate_inp_shexp . x).

--q8-activations (off by default; the exact pass is the bar) rounds the input
of every product with a Q8_0 weight to Q8_0 blocks first, as ggml-cpu does
(Q8_0's vec_dot_type is Q8_0), which reproduces llama.cpp's own numbers on a
Q8_0 file: that rounding is the whole of their difference from the exact pass.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import gguf

ARCHS = ("qwen35", "qwen35moe", "qwen3next")
TOP = 20


# ---------------------------------------------------------------- loading

class Q8Input:
    """A Q8_0 weight whose products first round the activation vector to
    Q8_0 (gguf's quantizer is bit-exact with ggml's reference one)."""

    def __init__(self, a):
        self.a = a

    def __matmul__(self, x):
        x32 = np.asarray(x, dtype=np.float32)
        q = gguf.quants.quantize(x32, gguf.GGMLQuantizationType.Q8_0)
        return self.a @ gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).astype(np.float64)

    def __getitem__(self, i):  # one expert of a 3-D weight
        return Q8Input(self.a[i])


class Model:
    def __init__(self, path, q8_activations=False):
        r = gguf.GGUFReader(path)
        self.fields = {f.name: f for f in r.fields.values()}
        self.arch = self.get("general.architecture")
        if self.arch not in ARCHS:
            sys.exit(f"{path}: architecture {self.arch!r} is not one of {', '.join(ARCHS)}")
        # numpy arrays in row-major order: ggml shape {n_in, n_out} is (n_out, n_in) here
        self.t = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            self.t[t.name] = np.asarray(a, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)])

        A = self.arch
        self.n_embd = self.get(f"{A}.embedding_length")
        self.n_layer_all = self.get(f"{A}.block_count")
        # MTP (nextn) blocks follow the trunk and are not run in the main pass
        self.n_layer = self.n_layer_all - self.get(f"{A}.nextn_predict_layers", 0)
        self.n_head = self.get(f"{A}.attention.head_count")
        self.n_head_kv = self.get(f"{A}.attention.head_count_kv", self.n_head)
        self.head_dim = self.get(f"{A}.attention.key_length", self.n_embd // self.n_head)
        assert self.get(f"{A}.attention.value_length", self.head_dim) == self.head_dim
        self.eps = float(self.get(f"{A}.attention.layer_norm_rms_epsilon"))
        self.n_rot = self.get(f"{A}.rope.dimension_count", self.head_dim)
        self.rope_base = float(self.get(f"{A}.rope.freq_base", 10000.0))
        scale = float(self.get(f"{A}.attention.scale", 0.0))
        self.kq_scale = scale if scale != 0.0 else 1.0 / np.sqrt(self.head_dim)
        # IMROPE for qwen35*, NeoX for qwen3next (llama_model_rope_type)
        self.sections = list(self.get(f"{A}.rope.dimension_sections", [])) if A != "qwen3next" else None
        if self.sections is not None:
            self.sections = (self.sections + [0, 0, 0, 0])[:4]

        self.conv_kernel = self.get(f"{A}.ssm.conv_kernel")
        self.d_inner = self.get(f"{A}.ssm.inner_size")
        self.head_k_dim = self.get(f"{A}.ssm.state_size")
        self.n_k_heads = self.get(f"{A}.ssm.group_count")
        self.n_v_heads = self.get(f"{A}.ssm.time_step_rank")
        self.head_v_dim = self.d_inner // self.n_v_heads
        assert self.head_v_dim == self.head_k_dim, "llama.cpp's GDN needs head_k_dim == head_v_dim"

        recurrent = self.get(f"{A}.attention.recurrent_layers", None)
        if recurrent is None:
            interval = self.get(f"{A}.full_attention_interval", 4)
            recurrent = [(il + 1) % interval != 0 for il in range(self.n_layer)]
        self.recurrent = [bool(x) for x in recurrent[:self.n_layer]]

        self.n_expert = self.get(f"{A}.expert_count", 0)
        self.n_expert_used = self.get(f"{A}.expert_used_count", 0)
        self.output = self.t.get("output.weight", self.t["token_embd.weight"])

        if q8_activations:
            q8 = {t.name for t in r.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q8_0}
            head = "output.weight" if "output.weight" in self.t else "token_embd.weight"
            if head in q8:
                self.output = Q8Input(self.output)
            for name in q8:
                if name.startswith("blk."):  # token_embd itself is read by rows, exactly
                    self.t[name] = Q8Input(self.t[name])

    def get(self, key, default=KeyError):
        f = self.fields.get(key)
        if f is None:
            if default is KeyError:
                raise KeyError(key)
            return default
        return f.contents()

    def w(self, il, name):
        return self.t[f"blk.{il}.{name}"]

    def has(self, il, name):
        return f"blk.{il}.{name}" in self.t


# ---------------------------------------------------------------- pieces

def rms_norm(x, weight, eps):
    """ggml_rms_norm over the last axis, then times weight."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def l2_norm(x, eps):
    """build_gdn_l2_norm: x / sqrt(sum(x^2) + eps) over the last axis."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    # ggml_softplus: log(1 + exp(x)), written stably
    return np.logaddexp(0.0, x)


def rope_angles(m, pos):
    """Angles of the n_rot/2 rotation pairs at position pos (NeoX pairing).

    ggml_rope (NeoX) and ggml_rope_multi (IMROPE) both rotate pair i = (i, i + n_rot/2)
    by theta_i = p_i * base^(-2i/n_rot). Under IMROPE, for text tokens
    llama.cpp feeds the four position streams (p, p, p, 0); pair i lies in
    sector i % sum(sections), and ggml_mrope_cache_init picks its stream:
    sector % 3 == 1 and sector < 3*s[1] -> h, == 2 and < 3*s[2] -> w,
    == 0 and < 3*s[0] -> t, otherwise e (position 0, no rotation)."""
    half = m.n_rot // 2
    i = np.arange(half)
    inv_freq = m.rope_base ** (-2.0 * i / m.n_rot)
    p = np.full(half, float(pos))
    if m.sections is not None:
        s = m.sections
        n_sect = sum(s)
        for k in range(half):
            sector = k % n_sect
            if sector % 3 == 1 and sector < 3 * s[1]:
                continue  # h stream: p
            if sector % 3 == 2 and sector < 3 * s[2]:
                continue  # w stream: p
            if sector % 3 == 0 and sector < 3 * s[0]:
                continue  # t stream: p
            p[k] = 0.0  # e stream: 0 for text
    return p * inv_freq


def apply_rope(x, angles, n_rot):
    """x: (..., head_dim); rotates the first n_rot dims in NeoX pairs."""
    half = n_rot // 2
    cos, sin = np.cos(angles), np.sin(angles)
    out = x.copy()
    x0, x1 = x[..., :half], x[..., half:n_rot]
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:n_rot] = x0 * sin + x1 * cos
    return out


# ---------------------------------------------------------------- blocks

class AttentionCache:
    def __init__(self):
        self.k = []  # per position: (n_head_kv, head_dim)
        self.v = []


def gated_attention(m, il, x, pos, cache):
    """build_layer_attn: joint query+gate projection, q/k RMS norms, RoPE,
    causal softmax attention with GQA, output gated by sigmoid(gate)."""
    hd, nh, nkv = m.head_dim, m.n_head, m.n_head_kv
    qg = (m.w(il, "attn_q.weight") @ x).reshape(nh, 2 * hd)
    q, gate = qg[:, :hd], qg[:, hd:]
    k = (m.w(il, "attn_k.weight") @ x).reshape(nkv, hd)
    v = (m.w(il, "attn_v.weight") @ x).reshape(nkv, hd)

    q = rms_norm(q, m.w(il, "attn_q_norm.weight"), m.eps)
    k = rms_norm(k, m.w(il, "attn_k_norm.weight"), m.eps)
    ang = rope_angles(m, pos)
    q = apply_rope(q, ang, m.n_rot)
    k = apply_rope(k, ang, m.n_rot)

    cache.k.append(k)
    cache.v.append(v)
    K = np.stack(cache.k, axis=1)  # (nkv, T, hd)
    V = np.stack(cache.v, axis=1)
    group = nh // nkv  # query head h reads KV head h // group (ggml_mul_mat broadcast)
    out = np.empty((nh, hd))
    for h in range(nh):
        s = K[h // group] @ q[h] * m.kq_scale
        p = np.exp(s - s.max())
        p /= p.sum()
        out[h] = p @ V[h // group]
    out = out.reshape(-1) * sigmoid(gate.reshape(-1))
    return m.w(il, "attn_output.weight") @ out


class DeltaNetState:
    def __init__(self, m):
        conv_dim = 2 * m.head_k_dim * m.n_k_heads + m.d_inner
        self.conv = np.zeros((m.conv_kernel - 1, conv_dim))  # the last K-1 inputs, oldest first
        self.S = np.zeros((m.n_v_heads, m.head_k_dim, m.head_v_dim))  # S[h][i][j], i over k, j over v


def delta_net_projections(m, il, x):
    """qkv (conv input), z, beta logits, alpha for one token, in the order
    llama.cpp's graph sees them: V heads in the file's order."""
    hk, hv, nk, nv = m.head_k_dim, m.head_v_dim, m.n_k_heads, m.n_v_heads
    r = nv // nk
    if m.has(il, "attn_qkv.weight"):
        qkv = m.w(il, "attn_qkv.weight") @ x
        z = m.w(il, "attn_gate.weight") @ x
    else:
        # qwen3next's legacy ssm_in: per K head [q (hk), k (hk), v (r*hv), z (r*hv)]
        mixed = (m.w(il, "ssm_in.weight") @ x).reshape(nk, 2 * hk + 2 * r * hv)
        q = mixed[:, :hk].reshape(-1)
        k = mixed[:, hk:2 * hk].reshape(-1)
        v = mixed[:, 2 * hk:2 * hk + r * hv].reshape(-1)
        z = mixed[:, 2 * hk + r * hv:].reshape(-1)
        qkv = np.concatenate([q, k, v])
    if m.has(il, "ssm_ba.weight"):
        # qwen3next: per K head [beta x r, alpha x r]
        ba = (m.w(il, "ssm_ba.weight") @ x).reshape(nk, 2 * r)
        b = ba[:, :r].reshape(-1)
        alpha = ba[:, r:].reshape(-1)
    else:
        b = m.w(il, "ssm_beta.weight") @ x
        alpha = m.w(il, "ssm_alpha.weight") @ x
    return qkv, z, b, alpha


def gated_delta_net(m, il, x, st):
    """build_layer_attn_linear for one token."""
    hk, hv, nk, nv = m.head_k_dim, m.head_v_dim, m.n_k_heads, m.n_v_heads
    qkv, z, b, alpha = delta_net_projections(m, il, x)

    beta = sigmoid(b)
    g = softplus(alpha + m.w(il, "ssm_dt.bias")) * m.w(il, "ssm_a")  # log of the decay, <= 0

    # ggml_ssm_conv: out[c] = sum_i window[i][c] * w[c][i], the newest input last
    window = np.concatenate([st.conv, qkv[None, :]], axis=0)  # (K, conv_dim)
    conv = np.sum(window.T * m.w(il, "ssm_conv1d.weight"), axis=1)
    st.conv = window[1:]
    conv = silu(conv)

    key_dim = hk * nk
    q = l2_norm(conv[:key_dim].reshape(nk, hk), m.eps)
    k = l2_norm(conv[key_dim:2 * key_dim].reshape(nk, hk), m.eps)
    v = conv[2 * key_dim:].reshape(nv, hv)
    q = q / np.sqrt(hk)

    r = nv // nk
    out = np.empty((nv, hv))
    for h in range(nv):
        kh = h // r if m.arch == "qwen3next" else h % nk
        S = st.S[h]
        S *= np.exp(g[h])
        delta = (v[h] - S.T @ k[kh]) * beta[h]
        S += np.outer(k[kh], delta)
        out[h] = S.T @ q[kh]

    # gated RMS norm per V head: norm(o) * ssm_norm * silu(z)
    out = rms_norm(out, m.w(il, "ssm_norm.weight"), m.eps) * silu(z.reshape(nv, hv))
    return m.w(il, "ssm_out.weight") @ out.reshape(-1)


def dense_ffn(m, il, x, prefix=""):
    """build_ffn with LLM_FFN_SILU, LLM_FFN_PAR: down(silu(gate x) * up x)."""
    gate = m.w(il, f"ffn_gate{prefix}.weight") @ x
    up = m.w(il, f"ffn_up{prefix}.weight") @ x
    return m.w(il, f"ffn_down{prefix}.weight") @ (silu(gate) * up)


def moe_ffn(m, il, x):
    """build_moe_ffn (softmax gating, norm_w = true, no scale) plus the
    sigmoid-gated shared expert."""
    logits = m.w(il, "ffn_gate_inp.weight") @ x
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    sel = np.argsort(-probs, kind="stable")[:m.n_expert_used]
    weights = probs[sel]
    weights = weights / max(weights.sum(), 6.103515625e-5)
    gate_e, up_e, down_e = (m.w(il, n) for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"))
    out = np.zeros(m.n_embd)
    for e, wgt in zip(sel, weights):
        out += wgt * (down_e[e] @ (silu(gate_e[e] @ x) * (up_e[e] @ x)))
    if m.has(il, "ffn_up_shexp.weight"):
        shared = dense_ffn(m, il, x, "_shexp")
        out += shared * sigmoid(m.w(il, "ffn_gate_inp_shexp.weight") @ x)
    return out


def block(m, il, x, pos, state):
    """x += mixer(rms_norm(x) * attn_norm); x += ffn(rms_norm(x) * post_attention_norm)."""
    h = rms_norm(x, m.w(il, "attn_norm.weight"), m.eps)
    if m.recurrent[il]:
        h = gated_delta_net(m, il, h, state)
    else:
        h = gated_attention(m, il, h, pos, state)
    x = x + h
    h = rms_norm(x, m.w(il, "post_attention_norm.weight"), m.eps)
    h = moe_ffn(m, il, h) if m.has(il, "ffn_gate_inp.weight") else dense_ffn(m, il, h)
    return x + h


# ---------------------------------------------------------------- driver

class Sequence:
    def __init__(self, m):
        self.m = m
        self.pos = 0
        self.states = [DeltaNetState(m) if m.recurrent[il] else AttentionCache() for il in range(m.n_layer)]

    def step(self, token):
        """Feed one token; return the float64 log-probabilities of the next one."""
        m = self.m
        x = m.t["token_embd.weight"][token].copy()
        for il in range(m.n_layer):
            x = block(m, il, x, self.pos, self.states[il])
        self.pos += 1
        x = rms_norm(x, m.t["output_norm.weight"], m.eps)
        logits = m.output @ x
        mx = logits.max()
        return logits - (mx + np.log(np.sum(np.exp(logits - mx))))


def top_k(lp, k=TOP):
    """The k best [id, logprob], best first (ties: lower id first)."""
    ids = np.argpartition(-lp, k)[:k]
    ids = ids[np.lexsort((ids, -lp[ids]))]
    return [[int(i), float(lp[i])] for i in ids]


def run(m, prompt, n_gen):
    seq = Sequence(m)
    tokens = list(prompt)
    top = []
    i = 0
    while i < len(tokens):
        lp = seq.step(tokens[i])
        top.append(top_k(lp))
        if i == len(tokens) - 1 and len(tokens) < len(prompt) + n_gen:
            tokens.append(int(np.argmax(lp)))
        i += 1
    return {"tokens": tokens, "n_prompt": len(prompt), "top": top}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--prompts", required=True, help="JSON file: a list of token-id lists")
    p.add_argument("--gen", type=int, default=32, help="greedy tokens appended to each prompt")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--q8-activations", action="store_true",
                   help="round the inputs of products with Q8_0 weights to Q8_0, as llama.cpp does")
    a = p.parse_args()

    m = Model(a.model, a.q8_activations)
    with open(a.prompts) as f:
        prompts = json.load(f)
    n_vocab = m.t["token_embd.weight"].shape[0]
    for pr in prompts:
        if not pr or any(not (0 <= t < n_vocab) for t in pr):
            sys.exit(f"prompt {pr}: token ids must lie in [0, {n_vocab})")
    out = {"arch": m.arch, "sequences": [run(m, pr, a.gen) for pr in prompts]}
    with open(a.output, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
