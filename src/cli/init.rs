//! `ctx init`: a new workspace with a commented config, a data folder, docs and an example tool.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::CliError;

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Folder to initialise (created if missing).
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// Overwrite files that already exist.
    #[arg(long)]
    pub force: bool,
    /// Also copy the sample corpus (a small team handbook) into docs/.
    #[arg(long)]
    pub sample: bool,
}

const CONFIG_TEMPLATE: &str = include_str!("templates/ctx.toml");
const ECHO_TOOL: &str = include_str!("../../tools/echo.lua");
const GUIDE_AGENT: &str = include_str!("../../agents/runbook-guide.lua");
const WELCOME: &str =
    "# Welcome to ctx\n\nPut the documents you want agents to find in this folder, then run `ctx sync`.\n";
const SAMPLE: &[(&str, &str)] = &[
    ("deploy-runbook.md", include_str!("../../examples/corpus/deploy-runbook.md")),
    ("incident-response.md", include_str!("../../examples/corpus/incident-response.md")),
    ("oncall.md", include_str!("../../examples/corpus/oncall.md")),
    ("architecture.md", include_str!("../../examples/corpus/architecture.md")),
    ("api-auth.md", include_str!("../../examples/corpus/api-auth.md")),
    ("onboarding.md", include_str!("../../examples/corpus/onboarding.md")),
];

pub fn run(args: InitArgs) -> Result<(), CliError> {
    let mut files: Vec<(PathBuf, &str)> = vec![
        (args.dir.join("ctx.toml"), CONFIG_TEMPLATE),
        (args.dir.join("tools/echo.lua"), ECHO_TOOL),
        (args.dir.join("agents/runbook-guide.lua"), GUIDE_AGENT),
    ];
    if args.sample {
        files.extend(SAMPLE.iter().map(|(name, text)| (args.dir.join("docs").join(name), *text)));
    } else {
        files.push((args.dir.join("docs/welcome.md"), WELCOME));
    }
    // Check everything before writing anything, so a refusal leaves the folder untouched.
    let existing: Vec<String> =
        files.iter().filter(|(path, _)| path.exists()).map(|(path, _)| path.display().to_string()).collect();
    if !existing.is_empty() && !args.force {
        return Err(CliError::Usage(format!(
            "not overwriting existing file(s): {}; pass --force to replace them",
            existing.join(", ")
        )));
    }
    create_dir(&args.dir.join("data"))?;
    for (path, text) in &files {
        if let Some(parent) = path.parent() {
            create_dir(parent)?;
        }
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let config = args.dir.join("ctx.toml");
    println!("created {}", config.display());
    println!("created {} (the database goes here)", args.dir.join("data").display());
    println!("created {}", args.dir.join("tools/echo.lua").display());
    println!("created {}", args.dir.join("agents/runbook-guide.lua").display());
    println!("created {} ({} document(s))", args.dir.join("docs").display(), files.len() - 3);
    println!();
    println!("next: ctx --config {} schema check", config.display());
    Ok(())
}

fn create_dir(path: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(path).with_context(|| format!("cannot create folder {}", path.display()))?;
    Ok(())
}
