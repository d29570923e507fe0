//! `ctx tool|connector|agent install, update, remove, search` and `list --installed`: tool
//! packs. The three command groups share this file: a pack may provide any mix of tools,
//! connectors and agents.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::{CliError, Globals};
use crate::config::{self, ScriptKind};
use crate::packs::{self, Asks, Lock, Manifest, PackError, Source, Workspace};
use crate::types::{PackLockEntry, PackLockEntryKind};

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// A folder; a git URL (`URL//sub/dir` for a pack inside a repository); a local git
    /// repository with @REF; or a pack of the configured registry, by name or by its folder in
    /// the registry. @REF picks a branch, tag or commit.
    #[arg(value_name = "SOURCE[@REF]")]
    pub source: String,
    /// Append the config sections the pack needs to ctx.toml (a section that exists is left
    /// as it is). Without it they are printed.
    #[arg(long)]
    pub write: bool,
}

#[derive(Debug, clap::Args)]
pub struct UpdateArgs {
    /// The pack to update (default: every installed pack).
    pub name: Option<String>,
    /// Fetch this branch, tag or commit instead of the ref it was installed from.
    #[arg(long = "ref", value_name = "REF")]
    pub reference: Option<String>,
    /// Apply the update. Without it, the changes of files and of requested permissions are
    /// shown and nothing is changed.
    #[arg(long)]
    pub yes: bool,
    /// With --yes: append the sections of scripts the new version adds to ctx.toml.
    #[arg(long)]
    pub write: bool,
}

#[derive(Debug, clap::Args)]
pub struct RemoveArgs {
    /// The pack to remove.
    pub name: String,
}

#[derive(Debug, clap::Args)]
pub struct SearchArgs {
    /// Words to match in the packs' names, descriptions and keywords (all of them must match;
    /// none lists every pack).
    pub words: Vec<String>,
    /// Print {"registry": ..., "packs": [...]} as JSON.
    #[arg(long)]
    pub json: bool,
}

impl From<PackError> for CliError {
    fn from(e: PackError) -> Self {
        match e {
            PackError::Source { .. } | PackError::NotInstalled { .. } | PackError::Exists { .. } => {
                CliError::Usage(e.to_string())
            }
            other => CliError::Failed(anyhow::anyhow!(other.to_string())),
        }
    }
}

/// The config file and its folder, absolute, without loading the config (remove and list work
/// on a config that does not load).
fn located(globals: &Globals) -> (PathBuf, PathBuf) {
    let path = config::locate(globals.config.as_deref()).path;
    let file = std::path::absolute(&path).map(|p| packs::normalize(&p)).unwrap_or(path);
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    (file, base)
}

/// The config, without the warnings about disabled sections that other commands log: a pack
/// command says what matters to it itself.
fn quiet_config(globals: &Globals) -> Result<crate::config::Config, CliError> {
    Ok(crate::config::Config::load_for(&config::locate(globals.config.as_deref()), config::Use::Local)?)
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

/// `ctx tool install SOURCE[@REF] [--write]`.
pub fn install(args: InstallArgs, kind: ScriptKind, globals: &Globals) -> Result<(), CliError> {
    let config = quiet_config(globals)?;
    let ws = Workspace::of(&config);
    let cwd = std::env::current_dir().unwrap_or_else(|_| ws.base_dir.clone());
    let source = Source::parse(&args.source, &cwd)?;
    let staged = packs::fetch(&ws, &args.source, source)?;
    let mut lock = Lock::load(&ws.base_dir)?;
    let manifest = staged.manifest.clone();
    let at = match (&staged.origin.reference, &staged.origin.commit) {
        (Some(r), Some(c)) => format!(" at {r} (commit {})", short(c)),
        (None, Some(c)) => format!(" at commit {}", short(c)),
        _ => String::new(),
    };
    let entry = staged.place(&ws, &mut lock, false)?;
    println!("Installed pack {} {} from {}{at}", manifest.name(), manifest.version(), args.source);
    println!("  {}", manifest.spec.description.as_str());
    println!("  into {}/ ({} files, pinned in {})", entry.folder.as_str(), entry.files.len(), packs::LOCK_FILE);
    println!();
    print_provides(&manifest);
    print_asks(&manifest);
    if !manifest.scripts().any(|(k, _)| k == kind) {
        println!();
        println!("note: this pack provides no {}s; its sections are the ones above", kind.as_str());
    }
    println!();
    sections(&manifest, &config.file, None, args.write, true)
}

fn print_provides(manifest: &Manifest) {
    let mut parts = Vec::new();
    for (kind, word) in
        [(ScriptKind::Tool, "tools"), (ScriptKind::Connector, "connectors"), (ScriptKind::Agent, "agents")]
    {
        let names = manifest.names_of(kind);
        if !names.is_empty() {
            parts.push(format!("{word} {}", names.join(", ")));
        }
    }
    println!("It provides: {}", if parts.is_empty() { "nothing".to_string() } else { parts.join("; ") });
}

/// The hosts, variables and config keys, each on its own line: what the user is trusting.
fn print_asks(manifest: &Manifest) {
    let spec = &manifest.spec;
    println!("It asks for:");
    let hosts: Vec<String> = spec.hosts.iter().map(|h| h.to_string()).collect();
    if hosts.is_empty() {
        println!("  network:    none (allow_hosts = [\"{}\"] keeps http.* from reaching anything)", packs::NO_HOSTS);
    } else {
        println!("  network:    {}  (allow_hosts: http.* reaches no other host)", hosts.join(", "));
    }
    let mut vars: Vec<String> = Vec::new();
    for (key, about) in &spec.config {
        if let Some(var) = &about.env {
            vars.push(format!("{} (config key {})", var.as_str(), key.as_str()));
        }
    }
    vars.extend(spec.env.iter().map(|v| format!("{} (read with env.get: allow_env)", v.as_str())));
    println!("  variables:  {}", if vars.is_empty() { "none".to_string() } else { vars.join(", ") });
    let keys: Vec<String> = spec
        .config
        .iter()
        .map(|(key, about)| format!("{}{}", key.as_str(), if about.required { " (required)" } else { "" }))
        .collect();
    println!("  config:     {}", if keys.is_empty() { "none".to_string() } else { keys.join(", ") });
}

/// Prints the sections `manifest` needs that ctx.toml lacks, or appends them with `write`.
fn sections(
    manifest: &Manifest,
    config_file: &Path,
    only: Option<&[String]>,
    write: bool,
    say_existing: bool,
) -> Result<(), CliError> {
    let text = std::fs::read_to_string(config_file).unwrap_or_default();
    let rendered = packs::render(manifest, &text, only);
    let shown = config_file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    if say_existing {
        for section in &rendered.skipped {
            println!("[{section}] is already in {shown}: left as it is");
        }
    }
    if rendered.added.is_empty() {
        return Ok(());
    }
    if write {
        packs::append(config_file, &rendered.text)?;
        let added: Vec<String> = rendered.added.iter().map(|s| format!("[{s}]")).collect();
        println!("Added to {shown}: {}", added.join(", "));
        println!();
        print!("{}", rendered.text);
        println!();
        println!("Fill in the keys marked \"fill in\", then `ctx schema check`.");
    } else {
        println!("Add this to {shown} (or run the install again with --write to append it):");
        println!();
        print!("{}", rendered.text);
    }
    Ok(())
}

/// `ctx tool update [NAME] [--ref REF] [--yes] [--write]`.
pub fn update(args: UpdateArgs, globals: &Globals) -> Result<(), CliError> {
    let config = quiet_config(globals)?;
    let ws = Workspace::of(&config);
    let mut lock = Lock::load(&ws.base_dir)?;
    let names = match &args.name {
        Some(name) => {
            if lock.get(name).is_none() {
                return Err(PackError::NotInstalled { name: name.clone(), installed: lock.names() }.into());
            }
            vec![name.clone()]
        }
        None if args.reference.is_some() => {
            return Err(CliError::Usage("--ref needs the NAME of the pack to update".into()));
        }
        None => lock.names(),
    };
    if names.is_empty() {
        println!("no packs installed; `ctx tool install SOURCE` installs one");
        return Ok(());
    }
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            println!();
        }
        let old = lock.get(name).cloned().expect("checked above");
        update_one(&old, &args, &ws, &mut lock, &config.file)?;
    }
    Ok(())
}

fn update_one(
    old: &PackLockEntry,
    args: &UpdateArgs,
    ws: &Workspace,
    lock: &mut Lock,
    config_file: &Path,
) -> Result<(), CliError> {
    let name = old.name.as_str();
    let staged = packs::fetch(ws, &old.source, Source::of_entry(old, args.reference.clone()))?;
    if staged.manifest.name() != name {
        return Err(CliError::Failed(anyhow::anyhow!(
            "{} now holds pack '{}', not '{name}'; `ctx tool remove {name}` and install it under its new name",
            old.source,
            staged.manifest.name()
        )));
    }
    let new = staged.entry()?;
    let describe = |e: &PackLockEntry| match &e.commit {
        Some(c) => format!("{} (commit {})", e.version, short(c)),
        None => e.version.clone(),
    };
    let local = packs::check(&ws.base_dir, old);
    let (mut added, mut removed, mut changed) = (Vec::new(), Vec::new(), Vec::new());
    for (file, hash) in &new.files {
        match old.files.get(file) {
            None => added.push(file.clone()),
            Some(before) if before.as_str() != hash.as_str() => changed.push(file.clone()),
            Some(_) => {}
        }
    }
    removed.extend(old.files.keys().filter(|f| !new.files.contains_key(*f)).cloned());
    let asks_old = Asks { hosts: old.hosts.clone(), env: old.env.clone(), config_keys: old.config_keys.clone() };
    let asks_new = staged.manifest.asks();
    let sections_of = |e: &PackLockEntry| -> BTreeSet<String> {
        let of = |kind: ScriptKind, names: &[String]| {
            names.iter().map(move |n| format!("{}.{n}", kind.section())).collect::<Vec<_>>()
        };
        of(ScriptKind::Tool, &e.tools)
            .into_iter()
            .chain(of(ScriptKind::Connector, &e.connectors))
            .chain(of(ScriptKind::Agent, &e.agents))
            .collect()
    };
    let new_sections: Vec<String> = sections_of(&new).difference(&sections_of(old)).cloned().collect();
    let gone_sections: Vec<String> = sections_of(old).difference(&sections_of(&new)).cloned().collect();
    let same_files = added.is_empty() && removed.is_empty() && changed.is_empty();
    if same_files && local.is_empty() && old.commit == new.commit && old.ref_ == new.ref_ {
        println!("pack {name} is up to date: {}", describe(old));
        return Ok(());
    }
    println!("Pack {name}: {} -> {}", describe(old), describe(&new));
    println!("Files: {} added, {} removed, {} changed", added.len(), removed.len(), changed.len());
    for (mark, files) in [("+", &added), ("-", &removed), ("~", &changed)] {
        for file in files {
            println!("  {mark} {file}");
        }
    }
    if !local.is_empty() {
        println!("The installed copy differs from {}: {local}; updating restores the fetched files.", packs::LOCK_FILE);
    }
    let diff = |what: &str, before: &[String], after: &[String]| {
        for item in after.iter().filter(|a| !before.contains(a)) {
            println!("  NEW {what}: {item}");
        }
        for item in before.iter().filter(|b| !after.contains(b)) {
            println!("  no longer asks for {what}: {item}");
        }
    };
    println!("Permissions:");
    if asks_old == asks_new && new_sections.is_empty() {
        println!(
            "  unchanged (hosts: {})",
            if asks_new.hosts.is_empty() { "none".into() } else { asks_new.hosts.join(", ") }
        );
    }
    diff("host", &asks_old.hosts, &asks_new.hosts);
    diff("environment variable", &asks_old.env, &asks_new.env);
    diff("config key", &asks_old.config_keys, &asks_new.config_keys);
    for section in &new_sections {
        println!("  NEW section: [{section}]");
    }
    for section in &gone_sections {
        println!("  no longer provides: [{section}]");
    }
    if !args.yes {
        println!();
        let with_ref = args.reference.as_deref().map(|r| format!(" --ref {r}")).unwrap_or_default();
        println!("Nothing was changed. Run `ctx tool update {name}{with_ref} --yes` to apply.");
        return Ok(());
    }
    let manifest = staged.manifest.clone();
    let entry = staged.place(ws, lock, true)?;
    println!();
    println!("Updated {}/ to {} and {}.", entry.folder.as_str(), describe(&entry), packs::LOCK_FILE);
    let new_hosts: Vec<&String> = asks_new.hosts.iter().filter(|h| !asks_old.hosts.contains(h)).collect();
    let new_vars: Vec<&String> = asks_new.env.iter().filter(|h| !asks_old.env.contains(h)).collect();
    let text = std::fs::read_to_string(config_file).unwrap_or_default();
    let using: Vec<String> = packs::sections_naming(&text, &ws.base_dir, entry.folder.as_str())
        .into_iter()
        .filter(|s| !new_sections.contains(s))
        .map(|s| format!("[{s}]"))
        .collect();
    if (!new_hosts.is_empty() || !new_vars.is_empty()) && !using.is_empty() {
        let hosts: Vec<&str> = new_hosts.iter().map(|s| s.as_str()).collect();
        let vars: Vec<&str> = new_vars.iter().map(|s| s.as_str()).collect();
        println!(
            "ctx.toml was not changed: the sandbox stays as it was. The new version asks for{}{}; add them to {} \
             yourself if you trust them.",
            if hosts.is_empty() { String::new() } else { format!(" host(s) {} (allow_hosts)", hosts.join(", ")) },
            if vars.is_empty() { String::new() } else { format!(" variable(s) {}", vars.join(", ")) },
            using.join(", ")
        );
    }
    if !gone_sections.is_empty() {
        let gone: Vec<String> = gone_sections.iter().map(|s| format!("[{s}]")).collect();
        println!("The new version no longer has {}: delete those sections from ctx.toml.", gone.join(", "));
    }
    if !new_sections.is_empty() {
        println!();
        sections(&manifest, config_file, Some(&new_sections), args.write, false)?;
    }
    Ok(())
}

/// `ctx tool remove NAME`: the folder and the lock entry go; ctx.toml is left to its owner.
pub fn remove(args: RemoveArgs, globals: &Globals) -> Result<(), CliError> {
    let (file, base) = located(globals);
    let mut lock = Lock::load(&base)?;
    let Some(entry) = lock.remove(&args.name) else {
        return Err(PackError::NotInstalled { name: args.name, installed: lock.names() }.into());
    };
    let folder = base.join(entry.folder.as_str());
    match std::fs::symlink_metadata(&folder) {
        Ok(meta) if meta.file_type().is_symlink() => std::fs::remove_file(&folder),
        Ok(_) => std::fs::remove_dir_all(&folder),
        Err(_) => Ok(()),
    }
    .map_err(|e| CliError::Failed(anyhow::anyhow!("cannot remove {}: {e}", folder.display())))?;
    lock.write(&base)?;
    // packs/ goes too when this was its last pack (remove_dir leaves a folder that is not empty).
    let _ = std::fs::remove_dir(base.join(packs::PACKS_DIR));
    println!("Removed pack {} ({}/ and its entry in {}).", args.name, entry.folder.as_str(), packs::LOCK_FILE);
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let left = packs::sections_naming(&text, &base, entry.folder.as_str());
    if !left.is_empty() {
        let shown = file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        println!("{shown} still has sections that name its files; delete them (ctx does not edit {shown} on remove):");
        for section in left {
            println!("  [{section}]");
        }
    }
    Ok(())
}

/// `ctx tool list --installed`: the lock's packs, each checked against its files.
pub fn list_installed(json: bool, globals: &Globals) -> Result<(), CliError> {
    let (_, base) = located(globals);
    let lock = Lock::load(&base)?;
    let checked: Vec<(&PackLockEntry, packs::Mismatch)> =
        lock.packs.iter().map(|e| (e, packs::check(&base, e))).collect();
    if json {
        let list: Vec<_> = checked
            .iter()
            .map(|(e, m)| {
                json!({
                    "name": e.name.as_str(), "version": e.version, "source": e.source,
                    "kind": match e.kind { PackLockEntryKind::Git => "git", PackLockEntryKind::Path => "path" },
                    "ref": e.ref_, "commit": e.commit.as_ref().map(|c| c.as_str()), "folder": e.folder.as_str(),
                    "tools": e.tools, "connectors": e.connectors, "agents": e.agents,
                    "hosts": e.hosts, "env": e.env, "files": e.files.len(),
                    "intact": m.is_empty(), "problem": (!m.is_empty()).then(|| m.to_string()),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({ "packs": list })).unwrap_or_default());
        return Ok(());
    }
    if checked.is_empty() {
        println!("no packs installed; `ctx tool install SOURCE` installs one, `ctx tool search WORDS` finds one");
        return Ok(());
    }
    for (e, mismatch) in checked {
        let from = match (&e.kind, &e.ref_, &e.commit) {
            (PackLockEntryKind::Git, r, Some(c)) => {
                format!(
                    "git {}{} commit {}",
                    e.source,
                    r.as_deref().map(|r| format!(" @{r}")).unwrap_or_default(),
                    short(c)
                )
            }
            _ => format!("folder {}", e.url.as_deref().unwrap_or(&e.source)),
        };
        println!("{} {}  ({from})", e.name.as_str(), e.version);
        let mut provides = Vec::new();
        for (word, names) in [("tools", &e.tools), ("connectors", &e.connectors), ("agents", &e.agents)] {
            if !names.is_empty() {
                provides.push(format!("{word} {}", names.join(", ")));
            }
        }
        println!("    provides: {}", provides.join("; "));
        println!(
            "    asks for: hosts {}; variables {}",
            if e.hosts.is_empty() { "none".into() } else { e.hosts.join(", ") },
            if e.env.is_empty() { "none".into() } else { e.env.join(", ") }
        );
        if mismatch.is_empty() {
            println!("    {} files, as pinned", e.files.len());
        } else {
            println!("    MODIFIED: {mismatch}; `ctx tool update {} --yes` restores it", e.name.as_str());
        }
    }
    Ok(())
}

/// `ctx tool search WORDS`: the registry's packs that match.
pub fn search(args: SearchArgs, globals: &Globals) -> Result<(), CliError> {
    let config = quiet_config(globals)?;
    let ws = Workspace::of(&config);
    let temp = ws.temp()?;
    let index = packs::open_registry(&ws, temp.path(), None)?;
    let found = packs::search(&index.entries, &args.words);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "registry": index.url, "packs": found })).unwrap_or_default()
        );
        return Ok(());
    }
    if found.is_empty() {
        println!(
            "no pack of {} matches {:?}; `ctx tool search` without words lists them all",
            index.url,
            args.words.join(" ")
        );
        return Ok(());
    }
    for entry in found {
        let kinds: Vec<String> = entry.kind.iter().map(|k| k.to_string()).collect();
        let version = entry.version.as_deref().map(|v| format!(" {v}")).unwrap_or_default();
        let kinds = if kinds.is_empty() { String::new() } else { format!("  [{}]", kinds.join(", ")) };
        println!("{}{version}{kinds}", entry.name.as_str());
        println!("    {}", entry.description);
        println!("    ctx tool install {}", entry.name.as_str());
    }
    Ok(())
}
