//! What the rest of the server needs to know about the loaded model: the
//! tokenizer, the compiled chat template, the context split into slots, and
//! the facts `/v1/models` and `/props` report. Built once on the engine
//! thread, then shared read-only.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lamina_chat::{builtin_for, ChatTemplate, Prompt};
use lamina_gguf::Model;
use lamina_grammar::{GrammarError, Vocab};
use lamina_model::Config;
use lamina_tokenizer::Tokenizer;

use crate::error::EngineError;

/// Where the chat template came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// The file's `tokenizer.chat_template`.
    File,
    /// A built-in format, by name (the file has none, or it did not compile).
    Builtin(&'static str),
    /// `--chat-template-file`.
    Override,
}

/// The loaded model, as handlers see it.
#[derive(Debug)]
pub struct ModelInfo {
    pub path: PathBuf,
    /// The id clients send as `model`: the file name.
    pub id: String,
    pub config: Config,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub template_origin: TemplateOrigin,
    /// Elements over all tensors.
    pub n_params: u64,
    /// Bytes of tensor data.
    pub size_bytes: u64,
    /// `general.file_type` (llama.cpp's `llama_ftype`), when present.
    pub file_type: Option<u64>,
    /// Total context over all slots.
    pub n_ctx: usize,
    /// Context of one slot: `n_ctx / n_parallel`, as llama-server splits it.
    pub n_ctx_slot: usize,
    pub n_parallel: usize,
    /// One line describing where each layer runs.
    pub placement: String,
    /// The file's `{arch}.pooling_type`, where it names one Lamina computes.
    pub pooling: Option<crate::pooling::Pooling>,
    /// The file's ranking head (`cls`, `cls.output`), for `/rerank`.
    pub rank_head: Option<crate::rank::RankHead>,
    /// The file's `tokenizer.chat_template.rerank`: a reranking prompt
    /// with `{query}` and `{document}` in it, as llama.cpp reads it.
    pub rerank_template: Option<String>,
    /// The vocabulary as the grammar engine sees it: built by the first
    /// request with a constraint (a walk over every token, a noticeable
    /// wait: docs/perf/server.md, 2026-12-05, "structured output's costs"),
    /// so a server that never sees one never pays for it.
    grammar: OnceLock<Result<Vocab, GrammarError>>,
}

impl ModelInfo {
    /// True when a rendered prompt already starts with the BOS text, so the
    /// tokenizer must not add another.
    pub fn starts_with_bos(&self, text: &str) -> bool {
        self.tokenizer
            .bos()
            .and_then(|b| self.tokenizer.token_text(b))
            .is_some_and(|b| !b.is_empty() && text.starts_with(b))
    }

    /// The vocabulary for compiling constraints, built once.
    pub fn grammar_vocab(&self) -> Result<&Vocab, GrammarError> {
        self.grammar
            .get_or_init(|| Vocab::new(&self.tokenizer, self.config.n_vocab))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// A rendered chat prompt to ids: control tokens parsed in the
    /// template's text, not in what the request wrote, and BOS added only
    /// when the template did not write it.
    pub fn encode_prompt(&self, prompt: &Prompt) -> Vec<u32> {
        let add_bos = !self.starts_with_bos(&prompt.text);
        self.tokenizer
            .encode_literal(&prompt.text, add_bos, &prompt.literal)
    }
}

pub(crate) struct InfoParams<'a> {
    pub path: &'a Path,
    pub n_ctx: Option<usize>,
    pub n_parallel: usize,
    pub template_override: Option<&'a str>,
    pub parse_special_in_content: bool,
}

/// The context a slot gets when `-c` is not given: llama-server's usual 4096,
/// or less where the model was trained on less.
const DEFAULT_SLOT_CTX: usize = 4096;

/// `(tokens per slot, slots)` for a total context `n_ctx` (or the default)
/// split over `n_parallel` slots, capped by the training context.
pub(crate) fn slot_context(
    config: &Config,
    n_ctx: Option<usize>,
    n_parallel: usize,
) -> (usize, usize) {
    let n_parallel = n_parallel.max(1);
    let train = config.context_length.max(1);
    let n_ctx = n_ctx
        .filter(|&c| c > 0)
        .unwrap_or(n_parallel.saturating_mul(DEFAULT_SLOT_CTX.min(train)));
    ((n_ctx / n_parallel).min(train), n_parallel)
}

pub(crate) fn build(
    file: &Model,
    config: &Config,
    p: &InfoParams<'_>,
) -> Result<ModelInfo, EngineError> {
    let tokenizer =
        Tokenizer::from_gguf(file).map_err(|e| EngineError::Load(format!("tokenizer: {e}")))?;
    let (mut template, template_origin) = template(file, &tokenizer, p.template_override)?;
    if !p.parse_special_in_content {
        // Only the template's own text may write control tokens; what a
        // request sends stays text (see `ModelInfo::encode_prompt`).
        template.guard_tokens(tokenizer.gated_texts());
    }

    let (n_ctx_slot, n_parallel) = slot_context(config, p.n_ctx, p.n_parallel);
    let n_ctx = p.n_ctx.unwrap_or(n_ctx_slot * n_parallel);
    if n_ctx / n_parallel > n_ctx_slot {
        tracing::warn!(
            "-c {n_ctx} over {n_parallel} slots is {} tokens a slot, past the training \
             context of {}; each slot gets {n_ctx_slot}",
            n_ctx / n_parallel,
            config.context_length
        );
    }
    if n_ctx_slot < 2 {
        return Err(EngineError::Load(format!(
            "a context of {n_ctx} split over {n_parallel} slots leaves {n_ctx_slot} tokens per slot"
        )));
    }

    let n_params = file.tensors().map(|t| t.info.n_elements).sum();
    let size_bytes = file.tensors().map(|t| t.info.n_bytes).sum();
    Ok(ModelInfo {
        path: p.path.to_path_buf(),
        id: p
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.path.display().to_string()),
        config: config.clone(),
        tokenizer,
        template,
        template_origin,
        n_params,
        size_bytes,
        file_type: file.get("general.file_type").and_then(|v| v.as_u64()),
        n_ctx: n_ctx_slot * n_parallel,
        n_ctx_slot,
        n_parallel,
        // Filled in by the loader, which knows where the layers went.
        placement: String::new(),
        pooling: file
            .get("general.architecture")
            .and_then(|a| a.as_str())
            .and_then(|a| file.get(&format!("{a}.pooling_type")))
            .and_then(|v| v.as_u64())
            .and_then(crate::pooling::Pooling::from_gguf),
        rank_head: crate::rank::RankHead::from_gguf(
            file,
            file.get("general.architecture")
                .and_then(|a| a.as_str())
                .unwrap_or_default(),
            config.n_embd,
        )?,
        rerank_template: file
            .get("tokenizer.chat_template.rerank")
            .and_then(|v| v.as_str())
            .map(str::to_owned),
        grammar: OnceLock::new(),
    })
}

/// The override, else the file's template, else the built-in one the
/// architecture and vocabulary call for (as `lamina run --chat` chooses).
fn template(
    file: &Model,
    tok: &Tokenizer,
    override_source: Option<&str>,
) -> Result<(ChatTemplate, TemplateOrigin), EngineError> {
    let piece = |id: Option<u32>| {
        id.and_then(|i| tok.token_text(i))
            .unwrap_or_default()
            .to_owned()
    };
    let (bos, eos) = (piece(tok.bos()), piece(tok.eos()));
    if let Some(src) = override_source {
        // A template the operator chose that does not compile is fatal: a
        // silent fallback would serve prompts in the wrong format.
        let t = ChatTemplate::new(src, &bos, &eos)
            .map_err(|e| EngineError::Load(format!("--chat-template-file: {e}")))?;
        return Ok((t, TemplateOrigin::Override));
    }
    if let Some(src) = file.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
        match ChatTemplate::new(src, &bos, &eos) {
            Ok(t) => return Ok((t, TemplateOrigin::File)),
            Err(e) => tracing::warn!(
                "the file's chat template does not compile ({e}); using a built-in one"
            ),
        }
    }
    let arch = file
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let builtin = builtin_for(arch, |t| tok.token_id(t).is_some());
    let t = ChatTemplate::new(builtin.source(), &bos, &eos).map_err(|e| {
        EngineError::Load(format!("built-in chat template {}: {e}", builtin.name()))
    })?;
    Ok((t, TemplateOrigin::Builtin(builtin.name())))
}
