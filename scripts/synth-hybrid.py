#!/usr/bin/env python3
"""Write a small synthetic GGUF of one of the Qwen hybrid architectures
(Gated DeltaNet blocks interleaved with gated full-attention blocks):

    qwen35      Qwen3.5 / Qwen3.6 dense
    qwen35moe   Qwen3.5 / Qwen3.6 mixture of experts
    qwen3next   Qwen3-Next (mixture of experts)

The file has the real structure (key names, tensor names, shapes, the layouts
llama.cpp's converter writes) and random weights, scaled so activations stay
O(1) through all blocks. It must load and run in llama.cpp; the float64
reference over it is scripts/exact-reference.py.

Usage (from the repository root):
    python3 scripts/synth-hybrid.py --arch qwen35 --type F32 -o q35.gguf
    python3 scripts/synth-hybrid.py --arch qwen35 --mtp --type Q8_0 -o q35-mtp.gguf
    python3 scripts/synth-hybrid.py --arch qwen3next --seed 7 -o q3n.gguf
Needs: pip install gguf numpy   (written against gguf 0.19)

Default shape (every row length a multiple of 32, so Q8_0 applies):
  n_embd 64, 8 blocks, full_attention_interval 4 (blocks 3 and 7 attend, the
  others are Gated DeltaNet); attention: 4 heads, 2 KV heads, head_dim 32,
  rope.dimension_count 16 (qwen35*: IMROPE with rope.dimension_sections
  [3,3,2,0]; qwen3next: NeoX); GDN: head_k_dim = head_v_dim 16 (ssm.state_size),
  2 K heads (ssm.group_count), 4 V heads (ssm.time_step_rank), ssm.inner_size 64,
  ssm.conv_kernel 4; dense FFN 96; MoE: 8 experts, 2 used, expert width 32,
  one shared expert of width 64 with a sigmoid gate. The output head is tied
  to token_embd (no output.weight).

Layouts, as llama.cpp's converter leaves them:
  * V heads (and the z gate, beta, alpha, ssm_a, ssm_dt, ssm_out's columns,
    the V channels of attn_qkv and ssm_conv1d): qwen35/qwen35moe store them
    tiled over the K heads, V head h reads K head h % n_k_heads; qwen3next
    keeps them grouped, V head h reads K head h // (n_v_heads / n_k_heads).
    Random weights need no reordering, only the reader must know which.
  * qwen3next fuses beta and alpha into ssm_ba {n_embd, 2*n_v_heads}, grouped
    per K head as [beta x r, alpha x r] (r = n_v_heads / n_k_heads);
    qwen35* have separate ssm_beta and ssm_alpha.
  * --ssm-in (qwen3next only) writes the legacy fused ssm_in
    {n_embd, 2*key_dim + 2*value_dim}, grouped per K head as
    [q (hk), k (hk), v (r*hv), z (r*hv)], instead of attn_qkv + attn_gate.
  * attn_q holds query and output gate interleaved per head: rows
    [h*2*hd, h*2*hd + hd) are head h's query, the next hd rows its gate.
  * Q8_0 (--type Q8_0) quantizes every 2-D/3-D `.weight` whose row length is
    a multiple of 32, except ffn_gate_inp and ssm_conv1d; norms, ssm_a,
    ssm_dt.bias and every 1-D tensor stay F32, as the converter keeps them.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

ARCHS = ("qwen35", "qwen35moe", "qwen3next")


def default_vocab():
    models = os.environ.get("LAMINA_MODELS", os.path.expanduser("~/.cache/lamina/models"))
    return os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=ARCHS, required=True)
    p.add_argument("--type", choices=("F32", "Q8_0"), default="F32")
    p.add_argument("--mtp", action="store_true",
                   help="one extra MTP (nextn) block after the trunk, nextn_predict_layers = 1")
    p.add_argument("--ssm-in", action="store_true",
                   help="qwen3next only: the legacy fused ssm_in instead of attn_qkv + attn_gate")
    p.add_argument("--recurrent-layers", action="store_true",
                   help="also write {arch}.attention.recurrent_layers (bool per block), as the "
                        "converter does when config.json lists layer_types")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-from", default=default_vocab(),
                   help="GGUF whose tokenizer.* keys are copied (default: SmolLM2-135M-Instruct)")
    p.add_argument("--chat-template", help="file whose text replaces tokenizer.chat_template")
    # shape
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=8, help="trunk blocks (the MTP block is extra)")
    p.add_argument("--full-attention-interval", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-head-kv", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--n-rot", type=int, default=16, help="rope.dimension_count")
    p.add_argument("--rope-sections", default="3,3,2,0",
                   help="rope.dimension_sections (qwen35, qwen35moe)")
    p.add_argument("--rope-base", type=float, default=10000000.0)
    p.add_argument("--rms-eps", type=float, default=1e-6)
    p.add_argument("--ssm-state", type=int, default=16, help="head_k_dim = head_v_dim")
    p.add_argument("--ssm-groups", type=int, default=2, help="K heads")
    p.add_argument("--ssm-v-heads", type=int, default=4, help="V heads (ssm.time_step_rank)")
    p.add_argument("--conv-kernel", type=int, default=4)
    p.add_argument("--n-ff", type=int, default=96, help="dense FFN width")
    p.add_argument("--n-expert", type=int, default=8)
    p.add_argument("--n-expert-used", type=int, default=2)
    p.add_argument("--n-ff-exp", type=int, default=32)
    p.add_argument("--n-ff-shexp", type=int, default=64)
    p.add_argument("--ctx", type=int, default=4096, help="context_length")
    # Larger gains make a file more sensitive to rounding (Q8_0 activations), smaller
    # ones let the tied embedding dominate, and greedy decoding repeats the input token.
    p.add_argument("--embd-scale", type=float, default=0.25, help="std of token_embd's entries")
    p.add_argument("--out-scale", type=float, default=0.4,
                   help="gain of the projections that write to the residual stream")
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args()
    if a.mtp and a.arch != "qwen35":
        # llama.cpp loads an MTP block for all three, but only the dense one is exercised here
        p.error("--mtp is for --arch qwen35")
    if a.ssm_in and a.arch != "qwen3next":
        p.error("--ssm-in is for --arch qwen3next")
    if a.ssm_v_heads % a.ssm_groups:
        p.error("--ssm-v-heads must be a multiple of --ssm-groups")
    return a


class Synth:
    def __init__(self, a, writer):
        self.a = a
        self.w = writer
        self.rng = np.random.default_rng(a.seed)
        self.qtype = QT.Q8_0 if a.type == "Q8_0" else QT.F32

    # --- random draws (numpy shapes are ggml shapes reversed) ---

    def linear(self, n_in, n_out, scale=1.0):
        """A weight of ggml shape {n_in, n_out}: y = W x keeps rms(y) ~ scale * rms(x)."""
        return self.rng.standard_normal((n_out, n_in)) * (scale / np.sqrt(n_in))

    def experts(self, n_in, n_out, n_expert, scale=1.0):
        return self.rng.standard_normal((n_expert, n_out, n_in)) * (scale / np.sqrt(n_in))

    def norm(self, n):
        return 1.0 + 0.1 * self.rng.standard_normal(n)

    # --- writing ---

    def put(self, name, data, quantize=True):
        data = np.ascontiguousarray(data, dtype=np.float32)
        is_weight = name.endswith(".weight")
        keep_f32 = (
            data.ndim < 2
            or not is_weight
            or name.endswith("_norm.weight")
            or ".ffn_gate_inp." in name
            or ".ssm_conv1d." in name
            or data.shape[-1] % 32 != 0
        )
        if self.qtype == QT.F32 or keep_f32 or not quantize:
            self.w.add_tensor(name, data)
        else:
            q = gguf.quants.quantize(data, self.qtype)
            self.w.add_tensor(name, q, raw_dtype=self.qtype)


def copy_tokenizer(w, path, chat_template):
    r = gguf.GGUFReader(path)
    n_vocab = None
    for f in r.fields.values():
        if not f.name.startswith("tokenizer."):
            continue
        if f.name == "tokenizer.chat_template" and chat_template is not None:
            continue
        t = f.types[0]
        val = f.contents()
        if t == VT.ARRAY:
            w.add_key_value(f.name, val, VT.ARRAY, sub_type=f.types[-1])
            if f.name == "tokenizer.ggml.tokens":
                n_vocab = len(val)
        else:
            w.add_key_value(f.name, val, t)
    if chat_template is not None:
        w.add_string("tokenizer.chat_template", chat_template)
    if n_vocab is None:
        sys.exit(f"{path}: no tokenizer.ggml.tokens")
    return n_vocab


def main():
    a = parse_args()
    arch = a.arch
    is_moe = arch in ("qwen35moe", "qwen3next")
    n_embd, hd = a.n_embd, a.head_dim
    hk = hv = a.ssm_state
    nk, nv = a.ssm_groups, a.ssm_v_heads
    r = nv // nk
    key_dim, value_dim = hk * nk, hv * nv
    conv_dim = 2 * key_dim + value_dim
    n_layer_all = a.n_layer + (1 if a.mtp else 0)

    def is_recurrent(il):
        return il < a.n_layer and (il + 1) % a.full_attention_interval != 0

    w = gguf.GGUFWriter(a.output, arch)
    w.add_name(f"synthetic {arch}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if a.type == "Q8_0" else gguf.LlamaFileType.ALL_F32)

    chat_template = None
    if a.chat_template:
        with open(a.chat_template, encoding="utf-8") as f:
            chat_template = f.read()

    # hyperparameters, by the key names llama.cpp reads (gguf-py's constants.py)
    w.add_uint32(f"{arch}.context_length", a.ctx)
    w.add_uint32(f"{arch}.embedding_length", n_embd)
    w.add_uint32(f"{arch}.block_count", n_layer_all)
    w.add_uint32(f"{arch}.feed_forward_length", a.n_ff_shexp if is_moe else a.n_ff)
    w.add_uint32(f"{arch}.attention.head_count", a.n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", a.n_head_kv)
    w.add_uint32(f"{arch}.attention.key_length", hd)
    w.add_uint32(f"{arch}.attention.value_length", hd)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", a.rms_eps)
    w.add_float32(f"{arch}.rope.freq_base", a.rope_base)
    w.add_uint32(f"{arch}.rope.dimension_count", a.n_rot)
    if arch != "qwen3next":
        sections = [int(s) for s in a.rope_sections.split(",")]
        if len(sections) != 4:
            sys.exit("--rope-sections takes 4 numbers")
        w.add_array(f"{arch}.rope.dimension_sections", sections)
    w.add_uint32(f"{arch}.ssm.conv_kernel", a.conv_kernel)
    w.add_uint32(f"{arch}.ssm.state_size", hk)
    w.add_uint32(f"{arch}.ssm.group_count", nk)
    w.add_uint32(f"{arch}.ssm.time_step_rank", nv)
    w.add_uint32(f"{arch}.ssm.inner_size", value_dim)
    w.add_uint32(f"{arch}.full_attention_interval", a.full_attention_interval)
    if a.recurrent_layers:
        w.add_array(f"{arch}.attention.recurrent_layers", [is_recurrent(il) for il in range(n_layer_all)])
    if is_moe:
        w.add_uint32(f"{arch}.expert_count", a.n_expert)
        w.add_uint32(f"{arch}.expert_used_count", a.n_expert_used)
        w.add_uint32(f"{arch}.expert_feed_forward_length", a.n_ff_exp)
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", a.n_ff_shexp)
    if a.mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", 1)

    n_vocab = copy_tokenizer(w, a.vocab_from, chat_template)

    s = Synth(a, w)
    # logits = norm(h) . E: entries of std e give logits of std ~ e * sqrt(n_embd)
    s.put("token_embd.weight", a.embd_scale * s.rng.standard_normal((n_vocab, n_embd)))
    s.put("output_norm.weight", s.norm(n_embd))

    def attention(il):
        s.put(f"blk.{il}.attn_q.weight", s.linear(n_embd, 2 * hd * a.n_head))
        s.put(f"blk.{il}.attn_k.weight", s.linear(n_embd, hd * a.n_head_kv))
        s.put(f"blk.{il}.attn_v.weight", s.linear(n_embd, hd * a.n_head_kv))
        s.put(f"blk.{il}.attn_output.weight", s.linear(hd * a.n_head, n_embd, a.out_scale))
        s.put(f"blk.{il}.attn_q_norm.weight", s.norm(hd))
        s.put(f"blk.{il}.attn_k_norm.weight", s.norm(hd))

    def delta_net(il):
        w_qkv = s.linear(n_embd, conv_dim)
        # keys drawn partly from the queries' weights (here and in the conv below), so a
        # head's q.k is mostly positive as in a trained model: with independent q and k,
        # q.k is often near 0, the per-head RMS norm of the output then rescales a
        # near-zero vector, and small roundings upstream grow into large logprob changes
        w_qkv[key_dim:2 * key_dim] = 0.8 * w_qkv[:key_dim] + 0.6 * w_qkv[key_dim:2 * key_dim]
        w_z = s.linear(n_embd, value_dim)
        if a.ssm_in:
            # per K head: q (hk), k (hk), v (r*hv), z (r*hv)
            q, k, v = w_qkv[:key_dim], w_qkv[key_dim:2 * key_dim], w_qkv[2 * key_dim:]
            parts = []
            for g in range(nk):
                parts += [q[g * hk:(g + 1) * hk], k[g * hk:(g + 1) * hk],
                          v[g * r * hv:(g + 1) * r * hv], w_z[g * r * hv:(g + 1) * r * hv]]
            s.put(f"blk.{il}.ssm_in.weight", np.concatenate(parts, axis=0))
        else:
            s.put(f"blk.{il}.attn_qkv.weight", w_qkv)
            s.put(f"blk.{il}.attn_gate.weight", w_z)
        # depthwise causal conv over the qkv channels, {conv_kernel, conv_dim}
        conv = s.rng.standard_normal((conv_dim, a.conv_kernel)) * (1.0 / np.sqrt(a.conv_kernel))
        conv[key_dim:2 * key_dim] = 0.8 * conv[:key_dim] + 0.6 * conv[key_dim:2 * key_dim]
        s.put(f"blk.{il}.ssm_conv1d.weight", conv)
        # dt bias small; ssm_a = -exp(A_log) < 0, so each step decays the state by exp(softplus(.) * a)
        s.put(f"blk.{il}.ssm_dt.bias", 0.1 * s.rng.standard_normal(nv))
        s.put(f"blk.{il}.ssm_a", -np.exp(s.rng.uniform(np.log(0.05), np.log(1.0), nv)))
        w_beta = s.linear(n_embd, nv)
        w_alpha = s.linear(n_embd, nv, 0.5)
        if arch == "qwen3next":
            rows = []
            for g in range(nk):
                rows += [w_beta[g * r:(g + 1) * r], w_alpha[g * r:(g + 1) * r]]
            s.put(f"blk.{il}.ssm_ba.weight", np.concatenate(rows, axis=0))
        else:
            s.put(f"blk.{il}.ssm_beta.weight", w_beta)
            s.put(f"blk.{il}.ssm_alpha.weight", w_alpha)
        s.put(f"blk.{il}.ssm_norm.weight", s.norm(hv))
        s.put(f"blk.{il}.ssm_out.weight", s.linear(value_dim, n_embd, a.out_scale))

    def ffn(il):
        if not is_moe:
            s.put(f"blk.{il}.ffn_gate.weight", s.linear(n_embd, a.n_ff))
            s.put(f"blk.{il}.ffn_up.weight", s.linear(n_embd, a.n_ff))
            s.put(f"blk.{il}.ffn_down.weight", s.linear(a.n_ff, n_embd, a.out_scale))
            return
        # router logits of std ~2 keep the top-k choice away from near-ties
        s.put(f"blk.{il}.ffn_gate_inp.weight", s.linear(n_embd, a.n_expert, 2.0))
        s.put(f"blk.{il}.ffn_gate_exps.weight", s.experts(n_embd, a.n_ff_exp, a.n_expert))
        s.put(f"blk.{il}.ffn_up_exps.weight", s.experts(n_embd, a.n_ff_exp, a.n_expert))
        s.put(f"blk.{il}.ffn_down_exps.weight", s.experts(a.n_ff_exp, n_embd, a.n_expert, a.out_scale))
        s.put(f"blk.{il}.ffn_gate_inp_shexp.weight", s.rng.standard_normal(n_embd) / np.sqrt(n_embd))
        s.put(f"blk.{il}.ffn_gate_shexp.weight", s.linear(n_embd, a.n_ff_shexp))
        s.put(f"blk.{il}.ffn_up_shexp.weight", s.linear(n_embd, a.n_ff_shexp))
        s.put(f"blk.{il}.ffn_down_shexp.weight", s.linear(a.n_ff_shexp, n_embd, a.out_scale))

    for il in range(n_layer_all):
        s.put(f"blk.{il}.attn_norm.weight", s.norm(n_embd))
        s.put(f"blk.{il}.post_attention_norm.weight", s.norm(n_embd))
        if is_recurrent(il):
            delta_net(il)
        else:
            attention(il)
        ffn(il)
        if il >= a.n_layer:
            # the MTP head: concat(enorm(embedding), hnorm(hidden)) -> eh_proj, then a
            # full-attention block, then shared_head_norm and the (tied) output head
            s.put(f"blk.{il}.nextn.eh_proj.weight", s.linear(2 * n_embd, n_embd))
            s.put(f"blk.{il}.nextn.enorm.weight", s.norm(n_embd))
            s.put(f"blk.{il}.nextn.hnorm.weight", s.norm(n_embd))
            s.put(f"blk.{il}.nextn.shared_head_norm.weight", s.norm(n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
