//! llama.cpp's command line as its users type it.
//!
//! Two things clap cannot do alone. llama.cpp has single-dash long flags
//! (`-ngl 99`, `-np 4`, `-fa on`), which clap reads as a one-letter flag and
//! a value (`-n gl`): [`rewrite`] turns each into its double-dash spelling
//! before parsing. And a llama-server flag that Lamina does not implement
//! must fail naming that flag, never be dropped: clap already refuses any
//! flag it does not know, and [`explain`] words that refusal as "llama-server's
//! --embedding is not implemented" with what Lamina offers instead.

use std::ffi::OsString;

/// llama.cpp's single-dash long flags and their double-dash spellings.
/// Those Lamina implements are parsed as such; the others reach clap as
/// the long name, which [`NOT_IMPLEMENTED`] then names in the error.
const SINGLE_DASH: &[(&str, &str)] = &[
    ("-ngl", "--n-gpu-layers"),
    ("-np", "--parallel"),
    ("-fa", "--flash-attn"),
    ("-rea", "--reasoning"),
    ("-ub", "--ubatch-size"),
    ("-cb", "--cont-batching"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-nkvo", "--no-kv-offload"),
    ("-kvu", "--kv-unified"),
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-mu", "--model-url"),
    ("-md", "--model-draft"),
    ("-sm", "--split-mode"),
    ("-ts", "--tensor-split"),
    ("-mg", "--main-gpu"),
    ("-ot", "--override-tensor"),
    ("-dev", "--device"),
    ("-tb", "--threads-batch"),
    ("-cram", "--cache-ram"),
    ("-lv", "--verbosity"),
    ("-sps", "--slot-prompt-similarity"),
    ("-cmoe", "--cpu-moe"),
    ("-ncmoe", "--n-cpu-moe"),
];

/// llama-server flags Lamina does not implement, and what to know instead.
const NOT_IMPLEMENTED: &[(&str, &str)] = &[
    (
        "--no-kv-offload",
        "the KV cache follows its layer's placement",
    ),
    ("--kv-unified", "each slot has its own KV cache"),
    ("--context-shift", "a sequence ends when its slot is full"),
    ("--grp-attn-n", "self-extend is not implemented"),
    ("--grp-attn-w", "self-extend is not implemented"),
    (
        "--model-url",
        "fetch from the Hugging Face hub with -hf ORG/REPO[:QUANT], or pass a local file with -m",
    ),
    (
        "--models-dir",
        "Lamina serves one model (-m); router mode is not implemented",
    ),
    (
        "--models-max",
        "Lamina serves one model (-m); router mode is not implemented",
    ),
    (
        "--models-preset",
        "Lamina serves one model (-m); router mode is not implemented",
    ),
    (
        "--no-models-autoload",
        "Lamina serves one model (-m); router mode is not implemented",
    ),
    (
        "--model-draft",
        "draft models are not implemented; --spec-type ngram-simple drafts without one",
    ),
    ("--lora", "LoRA adapters are not implemented"),
    ("--mmproj", "multimodal models are not implemented"),
    ("--mmproj-url", "multimodal models are not implemented"),
    ("--no-mmproj", "multimodal models are not implemented"),
    ("--media-path", "multimodal models are not implemented"),
    ("--split-mode", "Lamina places layers on one GPU (-ngl)"),
    ("--tensor-split", "Lamina places layers on one GPU (-ngl)"),
    ("--main-gpu", "Lamina uses the first GPU adapter"),
    ("--device", "Lamina uses the first GPU adapter"),
    (
        "--threads-batch",
        "one -t sets the threads of prompt and generation",
    ),
    ("--api-prefix", "routes are served at the root"),
    (
        "--ssl-key-file",
        "TLS is not implemented; put a proxy in front",
    ),
    (
        "--ssl-cert-file",
        "TLS is not implemented; put a proxy in front",
    ),
    ("--webui", "Lamina has no web UI"),
    ("--ui", "Lamina has no web UI"),
    (
        "--mlock",
        "the weights are mapped (or read with --no-mmap), never locked",
    ),
    ("--verbosity", "set RUST_LOG=debug for a verbose log"),
    ("--log-file", "the log goes to stderr"),
];

/// `args` with llama.cpp's single-dash long flags in their double-dash
/// spellings (`-ngl 99` → `--n-gpu-layers 99`, `-np=8` → `--parallel=8`).
/// Only whole arguments are rewritten: `-nglx` and `-ngl99` are left for
/// clap to refuse.
pub fn rewrite(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    args.map(|a| {
        let Some(s) = a.to_str() else { return a };
        for &(short, long) in SINGLE_DASH {
            if s == short {
                return long.into();
            }
            if let Some(v) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                return format!("{long}={v}").into();
            }
        }
        a
    })
    .collect()
}

/// The one line to print for a refused llama-server flag, or `None` when
/// clap's own message says it best.
pub fn explain(err: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    let name = arg.split('=').next().unwrap_or(arg);
    let (flag, why) = NOT_IMPLEMENTED.iter().find(|(f, _)| *f == name)?;
    let spelled = SINGLE_DASH
        .iter()
        .filter(|(_, long)| long == flag)
        .map(|(short, _)| *short)
        .collect::<Vec<_>>();
    let also = if spelled.is_empty() {
        String::new()
    } else {
        format!(" ({})", spelled.join(", "))
    };
    Some(format!(
        "llama-server's {flag}{also} is not implemented by Lamina: {why}"
    ))
}

#[cfg(test)]
mod tests {
    use super::{explain, rewrite};
    use crate::Cli;
    use clap::Parser as _;

    fn args(v: &[&str]) -> Vec<String> {
        rewrite(v.iter().map(|s| s.into()))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    fn parse(v: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(rewrite(v.iter().map(|s| s.into())))
    }

    #[test]
    fn single_dash_long_flags_get_their_double_dash_spelling() {
        assert_eq!(
            args(&["lamina", "serve", "-ngl", "99", "-np=8", "-n", "16", "-fa", "on"]),
            [
                "lamina",
                "serve",
                "--n-gpu-layers",
                "99",
                "--parallel=8",
                "-n",
                "16",
                "--flash-attn",
                "on"
            ]
        );
        // A value that merely starts like a flag is left alone.
        assert_eq!(args(&["-p", "-nglx"]), ["-p", "-nglx"]);
    }

    #[test]
    fn llama_server_command_lines_parse() {
        let cli = parse(&[
            "lamina",
            "serve",
            "-m",
            "f.gguf",
            "-ngl",
            "99",
            "-cmoe",
            "-ncmoe",
            "3",
            "-np",
            "2",
            "-c",
            "512",
            "-n",
            "64",
            "-a",
            "tiny",
            "--temp",
            "0.8",
            "--seed",
            "42",
            "--top-k",
            "20",
            "--top-p",
            "0.9",
            "--min-p",
            "0.1",
            "--jinja",
            "--metrics",
            "-b",
            "32",
            "-ub",
            "16",
            "-fa",
            "auto",
            "--offline",
            "--no-webui",
            "--no-slots",
            "--cors-origins",
            "*",
            "--host",
            "0.0.0.0",
            "-rea",
            "off",
            "--reasoning-format",
            "deepseek-legacy",
            "--reasoning-budget",
            "-1",
        ])
        .unwrap();
        let crate::Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(
            s.placement.ngl,
            "99".parse::<lamina_model::placement::Ngl>().unwrap()
        );
        assert!(s.placement.moe.cpu_moe);
        assert_eq!(s.placement.moe.n_cpu_moe, Some(3));
        assert_eq!(s.parallel, 2);
        assert_eq!(s.ctx, Some(512));
        assert_eq!(s.sampling.n_predict(), Some(64));
        assert_eq!(s.llama.alias.as_deref(), Some("tiny"));
        assert_eq!(s.llama.prefill_chunk().unwrap(), Some(16));
        let sampler = s.sampling.sampler().unwrap();
        assert_eq!(sampler.seed, Some(42));
        assert_eq!(sampler.top_k, 20);
        assert_eq!((sampler.top_p, sampler.min_p), (0.9, 0.1));
        let (mode, format) = s.llama.reasoning().unwrap();
        assert_eq!(mode, crate::http::reasoning::ReasoningMode::Off);
        assert_eq!(format, lamina_chat::ReasoningFormat::DeepseekLegacy);

        // llama.cpp's -1: "random seed", "no limit".
        let cli = parse(&["lamina", "serve", "-m", "f", "--seed", "-1", "-n", "-1"]).unwrap();
        let crate::Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(s.sampling.sampler().unwrap().seed, None);
        assert_eq!(s.sampling.n_predict(), None);

        // The prompt cache: -cram as llama.cpp spells it, -1 for no limit,
        // nothing below; unset leaves the engine's default.
        let serve = |args: &[&str]| {
            let mut all = vec!["lamina", "serve", "-m", "f"];
            all.extend_from_slice(args);
            match parse(&all).map(|c| c.command) {
                Ok(crate::Command::Serve(s)) => Ok(s.cache_ram_mib),
                Ok(_) => panic!("not serve"),
                Err(e) => Err(e),
            }
        };
        assert_eq!(serve(&["-cram", "512"]).unwrap(), Some(512));
        assert_eq!(serve(&["--cache-ram", "-1"]).unwrap(), Some(-1));
        assert_eq!(serve(&["--cache-ram", "0"]).unwrap(), Some(0));
        assert_eq!(serve(&[]).unwrap(), None);
        assert!(serve(&["--cache-ram", "-2"]).is_err());

        let cli = parse(&[
            "lamina", "run", "-m", "f", "-p", "hi", "-ngl", "99", "-n", "8",
        ]);
        assert!(cli.is_ok(), "{:?}", cli.err());
    }

    #[test]
    fn an_unimplemented_llama_server_flag_is_refused_by_name() {
        let e = parse(&["lamina", "serve", "-m", "f", "-nkvo"])
            .err()
            .unwrap();
        let line = explain(&e).unwrap();
        assert!(
            line.contains("--no-kv-offload (-nkvo) is not implemented"),
            "{line}"
        );
        let e = parse(&["lamina", "serve", "-m", "f", "--kv-unified"])
            .err()
            .unwrap();
        assert!(explain(&e).unwrap().contains("--kv-unified"));
        // A typo is clap's business: no llama-server flag to name.
        let e = parse(&["lamina", "serve", "-m", "f", "--rernking"])
            .err()
            .unwrap();
        assert_eq!(explain(&e), None);
        // A bad value for an accepted flag is refused too, not ignored.
        assert!(parse(&["lamina", "serve", "-m", "f", "-fa", "maybe"]).is_err());
        assert!(parse(&["lamina", "serve", "-m", "f", "--reasoning", "maybe"]).is_err());
        assert!(parse(&["lamina", "serve", "-m", "f", "--reasoning-format", "x"]).is_err());
        assert!(parse(&["lamina", "serve", "-m", "f", "--reasoning-budget", "-2"]).is_err());
        // Budgets: 0 is thinking off, a positive one is refused by name.
        let budget = |n: &str| {
            let cli = parse(&["lamina", "serve", "-m", "f", "--reasoning-budget", n]).unwrap();
            let crate::Command::Serve(s) = cli.command else {
                panic!("not serve")
            };
            s.llama.reasoning()
        };
        assert_eq!(
            budget("0").unwrap().0,
            crate::http::reasoning::ReasoningMode::Off
        );
        assert_eq!(
            budget("-1").unwrap().0,
            crate::http::reasoning::ReasoningMode::Auto
        );
        let e = budget("512").unwrap_err().to_string();
        assert!(e.contains("--reasoning-budget 512"), "{e}");
    }
}
