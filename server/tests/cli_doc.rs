//! `docs/cli.md` is what clap renders for every subcommand: a flag that
//! changes without the page fails here.
//!
//! Regenerate with `LAMINA_BLESS=1 cargo test -p lamina --test cli_doc`.

use std::path::Path;
use std::process::Command;

#[test]
fn docs_cli_md_is_what_clap_renders() {
    let out = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .arg("cli-doc")
        .output()
        .expect("running lamina cli-doc");
    assert!(
        out.status.success(),
        "lamina cli-doc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).expect("cli-doc prints UTF-8");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    if std::env::var_os("LAMINA_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &rendered).expect("writing docs/cli.md");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != rendered {
        let line = on_disk
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || on_disk.lines().count().min(rendered.lines().count()) + 1,
                |i| i + 1,
            );
        panic!(
            "docs/cli.md differs from the command line's --help (first at line {line}).\n\
             Regenerate it with: LAMINA_BLESS=1 cargo test -p lamina --test cli_doc"
        );
    }
}
