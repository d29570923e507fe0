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
    let model = crate::embed::default_model_dirs(&args.dir).into_iter().find(|d| d.join("model.safetensors").is_file());
    let config_text = config_text(&args.dir, model.as_deref());
    let mut files: Vec<(PathBuf, &str)> = vec![
        (args.dir.join("ctx.toml"), &config_text),
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
    match &model {
        Some(dir) => println!("semantic search: the local model in {}", dir.display()),
        None => {
            println!("semantic search: off until a model is set up (scripts/get-model, then [embedding] in ctx.toml)")
        }
    }
    println!();
    println!("next: ctx --config {} schema check", config.display());
    Ok(())
}

/// The template's `[embedding]` lines, which `ctx init` replaces when a model is installed.
const EMBEDDING_OFF: &str = "# Semantic and hybrid search need an embedding provider; \"disabled\" keeps ctx keyword-only.\n\
                             # scripts/get-model installs a local model; then: provider = \"local\" and path = \"<its folder>\".\n\
                             provider = \"disabled\"";

/// The config text: the template, with the local model in `[embedding]` when one is installed.
fn config_text(dir: &Path, model: Option<&Path>) -> String {
    let Some(model) = model else { return CONFIG_TEMPLATE.to_string() };
    // Relative to the workspace when inside it, so the folder can move as a whole; under the
    // home folder as ~/..., so the file works for the same user elsewhere.
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let shown = match (model.strip_prefix(dir), home.as_deref().and_then(|h| model.strip_prefix(h).ok())) {
        (Ok(inside), _) => inside.display().to_string(),
        (_, Some(rest)) => format!("~/{}", rest.display()),
        _ => model.display().to_string(),
    };
    let local = format!(
        "# Semantic and hybrid search with a local static model (no network): {}.\nprovider = \"local\"\npath = {:?}",
        crate::embed::DEFAULT_MODEL,
        shown
    );
    CONFIG_TEMPLATE.replacen(EMBEDDING_OFF, &local, 1)
}

fn create_dir(path: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(path).with_context(|| format!("cannot create folder {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_found_model_replaces_the_disabled_embedding_lines() {
        assert!(CONFIG_TEMPLATE.contains(EMBEDDING_OFF));
        let text = config_text(Path::new("/ws"), Some(Path::new("/ws/models/m")));
        assert!(text.contains("provider = \"local\"\npath = \"models/m\""), "{text}");
        assert!(!text.contains("provider = \"disabled\""));
        assert_eq!(config_text(Path::new("/ws"), None), CONFIG_TEMPLATE);
    }
}
