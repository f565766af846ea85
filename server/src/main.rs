//! The `lamina` binary: the command line over the library crates.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use lamina_gguf::{LoadMode, Model};

mod inspect;

#[derive(Parser)]
#[command(
    name = "lamina",
    version,
    about = "An OpenAI-compatible inference server for GGUF models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a GGUF file holds: header, metadata, tensor table, and whether its layout is sound.
    Inspect {
        /// The .gguf file (for a split model, its first shard).
        file: PathBuf,
        /// Print the facts as one JSON object.
        #[arg(long)]
        json: bool,
        /// Dump arrays in full instead of summarising them.
        #[arg(long)]
        full: bool,
        /// Read the file into memory instead of mapping it.
        #[arg(long)]
        no_mmap: bool,
    },
    /// List the GPU adapters wgpu sees, with the limits that matter for inference.
    Devices {
        #[arg(long)]
        json: bool,
    },
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Inspect {
            file,
            json,
            full,
            no_mmap,
        } => {
            let mode = if no_mmap {
                LoadMode::Read
            } else {
                LoadMode::Mmap
            };
            let model = Model::open(&file, mode)?;
            if json {
                println!("{}", inspect::to_json(&model, full));
            } else {
                print!("{}", inspect::to_text(&model, full));
            }
        }
        Command::Devices { json } => devices(json).context("listing GPU adapters")?,
    }
    Ok(())
}

fn devices(_json: bool) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, no backtrace: the message names the problem and the byte offset.
            eprintln!("lamina: {e:#}");
            ExitCode::FAILURE
        }
    }
}
