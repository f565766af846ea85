// llama.cpp's own top-k logprobs for given token sequences, in the JSON shape
// scripts/exact-reference.py writes, so scripts/compare-logprobs.py can set
// the two side by side.
//
// Each sequence is evaluated teacher-forced, in one batch with logits at every
// position, from a cleared memory. The context keeps an F32 KV cache and flash
// attention off (F16 K/V would round the attention inputs), and the weights
// are not repacked (no extra CPU buffer types), so on an F32 model llama.cpp's
// only departure from an exact pass is float32 arithmetic.
//
// Input: either the reference's output ({"sequences": [{"tokens": [...],
// "n_prompt": N}, ...]}, its tokens are replayed) or a plain list of token-id
// lists. Output: {"arch": ..., "sequences": [{"tokens", "n_prompt",
// "top": [[[id, logprob] x 20] per position]}]}.
//
// Build against the CPU build benches/peer.sh leaves in its cache
// (CACHE=${LAMINA_PEER_CACHE:-$HOME/.cache/lamina/llama.cpp-0.3.36}):
//
//   g++ -O2 -std=c++17 benches/llama-logprobs.cpp \
//     -I"$CACHE/src/include" -I"$CACHE/src/ggml/include" -I"$CACHE/src/vendor" \
//     -L"$CACHE/build-cpu/bin" -L"$CACHE/build-cpu/src" -L"$CACHE/build-cpu/ggml/src" \
//     -lllama -lggml -lggml-base \
//     -Wl,-rpath,"$CACHE/build-cpu/bin" -o "$CACHE/llama-logprobs"
//
//   "$CACHE/llama-logprobs" MODEL.gguf SEQS.json [-o OUT.json] [-t THREADS] [-k 20] [--load-mtp] [-v]
//
// --load-mtp also loads the MTP (nextn) block's tensors, which checks their
// names and shapes; the logits are the trunk's either way.

#include "llama.h"
#include "nlohmann/json.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

using json = nlohmann::json;

static bool g_verbose = false;

static void log_cb(ggml_log_level level, const char * text, void *) {
    // errors always; the rest (and the loader's progress dots, GGML_LOG_LEVEL_CONT) with -v
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

struct Seq {
    std::vector<llama_token> tokens;
    int n_prompt;
};

static std::vector<Seq> read_seqs(const std::string & path) {
    std::ifstream f(path);
    if (!f) {
        fprintf(stderr, "cannot read %s\n", path.c_str());
        exit(1);
    }
    json j = json::parse(f);
    std::vector<Seq> out;
    if (j.is_object()) {
        for (const auto & s : j.at("sequences")) {
            Seq q;
            q.tokens = s.at("tokens").get<std::vector<llama_token>>();
            q.n_prompt = s.value("n_prompt", (int) q.tokens.size());
            out.push_back(q);
        }
    } else {
        for (const auto & s : j) {
            Seq q;
            q.tokens = s.get<std::vector<llama_token>>();
            q.n_prompt = (int) q.tokens.size();
            out.push_back(q);
        }
    }
    return out;
}

int main(int argc, char ** argv) {
    std::string model_path, seqs_path, out_path;
    int n_threads = 2, top_k = 20;
    bool load_mtp = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-o" && i + 1 < argc) {
            out_path = argv[++i];
        } else if (a == "-t" && i + 1 < argc) {
            n_threads = atoi(argv[++i]);
        } else if (a == "-k" && i + 1 < argc) {
            top_k = atoi(argv[++i]);
        } else if (a == "--load-mtp") {
            load_mtp = true;
        } else if (a == "-v") {
            g_verbose = true;
        } else if (model_path.empty()) {
            model_path = a;
        } else if (seqs_path.empty()) {
            seqs_path = a;
        } else {
            fprintf(stderr, "unexpected argument %s\n", a.c_str());
            return 1;
        }
    }
    if (model_path.empty() || seqs_path.empty()) {
        fprintf(stderr, "usage: %s MODEL.gguf SEQS.json [-o OUT.json] [-t THREADS] [-k 20] [--load-mtp] [-v]\n", argv[0]);
        return 1;
    }

    const std::vector<Seq> seqs = read_seqs(seqs_path);
    size_t max_len = 1;
    for (const auto & s : seqs) {
        max_len = std::max(max_len, s.tokens.size());
    }

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = false;  // no weight repacking: the plain CPU kernels
    mp.load_mtp = load_mtp;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        fprintf(stderr, "llama.cpp could not load %s\n", model_path.c_str());
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) std::max<size_t>(256, max_len);
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;  // one ubatch per sequence
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama.cpp could not make a context\n");
        return 1;
    }

    char arch[128] = {0};
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));

    json out;
    out["arch"] = arch;
    out["sequences"] = json::array();

    llama_batch batch = llama_batch_init((int32_t) max_len, 0, 1);
    std::vector<double> lp(n_vocab);
    std::vector<int> idx(n_vocab);
    for (const auto & s : seqs) {
        for (llama_token t : s.tokens) {
            if (t < 0 || t >= n_vocab) {
                fprintf(stderr, "token %d outside the vocabulary (%d)\n", t, n_vocab);
                return 1;
            }
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        batch.n_tokens = (int32_t) s.tokens.size();
        for (int i = 0; i < batch.n_tokens; i++) {
            batch.token[i] = s.tokens[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama_decode failed\n");
            return 1;
        }
        json top = json::array();
        for (int i = 0; i < batch.n_tokens; i++) {
            const float * logits = llama_get_logits_ith(ctx, i);
            // log_softmax of llama.cpp's float logits, in double
            double mx = -INFINITY;
            for (int v = 0; v < n_vocab; v++) {
                mx = std::max(mx, (double) logits[v]);
            }
            double sum = 0.0;
            for (int v = 0; v < n_vocab; v++) {
                sum += std::exp((double) logits[v] - mx);
            }
            const double lse = mx + std::log(sum);
            for (int v = 0; v < n_vocab; v++) {
                lp[v] = (double) logits[v] - lse;
            }
            std::iota(idx.begin(), idx.end(), 0);
            const int k = std::min(top_k, n_vocab);
            std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
                return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
            });
            json row = json::array();
            for (int j = 0; j < k; j++) {
                row.push_back({idx[j], lp[idx[j]]});
            }
            top.push_back(row);
        }
        out["sequences"].push_back({{"tokens", s.tokens}, {"n_prompt", s.n_prompt}, {"top", top}});
    }

    const std::string text = out.dump();
    if (out_path.empty()) {
        puts(text.c_str());
    } else {
        std::ofstream(out_path) << text << "\n";
    }

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
