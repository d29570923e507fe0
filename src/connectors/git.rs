//! Git connector: indexes the files of a repository at a branch tip, with authors and dates from
//! its history.
//!
//! A sync runs a fixed number of `git` processes whatever the size of the repository: at most one
//! to find the branch, one clone or fetch for a remote, then `log -1` (the tip), `ls-tree` (paths,
//! blob ids, sizes), one `log --name-only` over the history (authors and dates per path) and one
//! `cat-file --batch` that streams the contents. Only one of them runs at a time.
//!
//! The connector only reads objects: it never checks out, and never touches the working tree or
//! the index of a local repository. Remotes are cloned (without a checkout) into
//! `cache_dir/<name>` and fetched on later syncs.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::{Map, Value};

use super::extract::extract;
use super::{ConnectorError, Event, Item, Sink, SkipReason};
use crate::types::GitConnectorConfig;

/// One `[connectors.git.<name>]` source, ready to scan.
pub struct GitConnector<'a> {
    /// The `[connectors.git.<name>]` name; also names the clone folder of a remote.
    pub name: &'a str,
    pub config: &'a GitConnectorConfig,
    /// Folder of `ctx.toml`: relative local repository paths resolve against it.
    pub base_dir: &'a Path,
    /// Where remotes are cloned, as `cache_dir/<name>`.
    pub cache_dir: &'a Path,
}

/// What a scan read: the commit it indexed and the branch it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanInfo {
    pub commit: String,
    /// The configured branch, else the repository's current branch (`HEAD` when detached).
    pub branch: String,
}

/// True when `url` names a remote to clone, false for a local repository path.
///
/// Follows git's own rule: `scheme://` is a URL (except `file://`, read in place), and
/// `[user@]host:path` with no `/` before the first `:` is scp-like ssh. Anything else is a path.
pub fn is_remote(url: &str) -> bool {
    if url.len() >= 7 && url[..7].eq_ignore_ascii_case("file://") {
        return false;
    }
    if url.contains("://") {
        return true;
    }
    match url.find(':') {
        None | Some(0) => false,
        Some(colon) => {
            let before = &url[..colon];
            let drive_letter = colon == 1 && before.bytes().all(|b| b.is_ascii_alphabetic());
            !before.contains('/') && !before.contains('\\') && !drive_letter
        }
    }
}

impl GitConnector<'_> {
    /// Streams every indexable file at the branch tip to `sink` as Event::Item / Event::Skipped.
    pub fn scan(&self, sink: &mut Sink<'_>) -> Result<ScanInfo, ConnectorError> {
        self.scan_as(is_remote(&self.config.url), sink)
    }

    /// `scan` with the local/remote decision made by the caller, so tests can drive the clone and
    /// fetch path with a `file://` URL (which `is_remote` reads in place).
    fn scan_as(&self, remote: bool, sink: &mut Sink<'_>) -> Result<ScanInfo, ConnectorError> {
        let filter = Filter::new(self.config, self.name)?;
        if let Some(branch) = &self.config.branch {
            if branch.starts_with('-') || branch.contains('\0') || branch.trim().is_empty() {
                return Err(self.fail(format!("`{}` is not a valid branch name; check `branch`", branch.as_str())));
            }
        }
        let repo = if remote { self.update_clone()? } else { self.open_local()? };
        self.read_tree(&repo, &filter, sink)
    }

    fn section(&self) -> String {
        format!("[connectors.git.{}]", self.name)
    }

    fn fail(&self, msg: String) -> ConnectorError {
        ConnectorError::Source(format!("{msg} in {}", self.section()))
    }

    /// A local repository, read in place: a work tree (with `.git`) or a bare repository.
    fn open_local(&self) -> Result<Repo, ConnectorError> {
        let raw = strip_file_scheme(&self.config.url);
        let path = if Path::new(raw).is_absolute() { PathBuf::from(raw) } else { self.base_dir.join(raw) };
        let shown = path.display().to_string();
        if !path.exists() {
            return Err(self.fail(format!(
                "git repository {shown} does not exist; check `url` (relative paths start at {})",
                self.base_dir.display()
            )));
        }
        // Checked here rather than left to git, because git would walk up and silently index an
        // enclosing repository.
        let loc = if path.join(".git").exists() {
            Location::WorkTree(path)
        } else if path.join("HEAD").is_file() && path.join("objects").is_dir() {
            Location::GitDir(path)
        } else {
            return Err(self.fail(format!(
                "{shown} is not a git repository (no .git inside, and not a bare repository); check `url`"
            )));
        };
        let (rev, branch) = match &self.config.branch {
            Some(b) => (b.to_string(), b.to_string()),
            None => ("HEAD".to_string(), self.head_branch(&loc, &shown)?),
        };
        Ok(Repo { loc, rev, branch, shown })
    }

    /// A remote: cloned into `cache_dir/<name>` the first time, fetched afterwards.
    fn update_clone(&self) -> Result<Repo, ConnectorError> {
        let url = self.config.url.as_str();
        let shown_url = redact(url);
        let dir = self.cache_dir.join(safe_name(self.name));
        let shown = format!("{shown_url} (cloned in {})", dir.display());
        if url.starts_with('-') {
            return Err(self.fail(format!("`{shown_url}` is not a valid clone URL; check `url`")));
        }
        if dir.join(".git").is_dir() {
            let loc = Location::WorkTree(dir.clone());
            let branch = match &self.config.branch {
                Some(b) => b.to_string(),
                None => self.head_branch(&loc, &shown)?,
            };
            // Fetch from the configured URL rather than `origin`, so an edited `url` takes effect;
            // the explicit destination keeps a ref on the objects for the next fetch to build on.
            let refspec =
                if branch == "HEAD" { "HEAD".to_string() } else { format!("+{branch}:refs/remotes/origin/{branch}") };
            let mut cmd = git(Some(&loc));
            cmd.args(["fetch", "--quiet", "--no-tags", "--", url, &refspec]);
            let out = run(&mut cmd)?;
            if !out.ok {
                return Err(self.fail(format!(
                    "could not fetch branch `{branch}` from {shown_url}: {}; check `url` and `branch`, the \
                     network and your git credentials (prompts are off); deleting {} forces a fresh clone",
                    scrub(&out.stderr_line, url),
                    dir.display()
                )));
            }
            return Ok(Repo { loc, rev: "FETCH_HEAD".to_string(), branch, shown });
        }
        let non_empty = std::fs::read_dir(&dir).map(|mut d| d.next().is_some()).unwrap_or(false);
        if non_empty {
            return Err(self.fail(format!(
                "the clone folder {} exists but is not a git clone; delete it and sync again",
                dir.display()
            )));
        }
        if let Err(e) = std::fs::create_dir_all(self.cache_dir) {
            return Err(self.fail(format!("cannot create the clone folder {}: {e}", self.cache_dir.display())));
        }
        let mut cmd = git(None);
        // --no-checkout: the files are read from objects, so a work tree would only cost disk.
        cmd.args(["clone", "--quiet", "--no-checkout", "--single-branch"]);
        if let Some(b) = &self.config.branch {
            cmd.args(["--branch", b.as_str()]);
        }
        cmd.arg("--").arg(url).arg(&dir);
        let out = run(&mut cmd)?;
        if !out.ok {
            return Err(self.fail(format!(
                "could not clone {shown_url}: {}; check `url` and `branch`, the network and your git \
                 credentials (prompts are off)",
                scrub(&out.stderr_line, url)
            )));
        }
        let loc = Location::WorkTree(dir);
        let branch = match &self.config.branch {
            Some(b) => b.to_string(),
            None => self.head_branch(&loc, &shown)?,
        };
        Ok(Repo { loc, rev: "HEAD".to_string(), branch, shown })
    }

    /// The branch HEAD points at, or `HEAD` when detached.
    fn head_branch(&self, loc: &Location, shown: &str) -> Result<String, ConnectorError> {
        let mut cmd = git(Some(loc));
        cmd.args(["symbolic-ref", "--quiet", "--short", "HEAD"]);
        let out = run(&mut cmd)?;
        if out.ok {
            let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !name.is_empty() {
                return Ok(name);
            }
        }
        // Exit status 1 with no message: a detached HEAD.
        if out.code == Some(1) && out.stderr_line.is_empty() {
            return Ok("HEAD".to_string());
        }
        Err(self.git_failure(&out.stderr_line, shown, None))
    }

    /// Explains a failed read of a repository.
    fn git_failure(&self, stderr: &str, shown: &str, rev: Option<&str>) -> ConnectorError {
        let lower = stderr.to_ascii_lowercase();
        let msg = if lower.contains("not a git repository") {
            format!("{shown} is not a git repository ({stderr}); check `url`")
        } else if lower.contains("dubious ownership") {
            format!(
                "git refuses to read {shown} ({stderr}); if you trust it, run `git config --global --add \
                 safe.directory <path>`"
            )
        } else if lower.contains("does not have any commits") || (rev == Some("HEAD") && is_bad_rev(&lower)) {
            format!("{shown} has no commits yet ({stderr}); commit something or set `branch`")
        } else if let (Some(rev), true) = (rev, is_bad_rev(&lower)) {
            format!("branch `{rev}` was not found in {shown} ({stderr}); check `branch`")
        } else if stderr.is_empty() {
            format!("git failed on {shown}")
        } else {
            format!("git failed on {shown}: {stderr}")
        };
        self.fail(msg)
    }

    fn read_tree(&self, repo: &Repo, filter: &Filter, sink: &mut Sink<'_>) -> Result<ScanInfo, ConnectorError> {
        let (commit, tip_time) = self.resolve(repo)?;
        let mut entries = self.list_files(repo, &commit, filter, sink)?;
        if !entries.is_empty() {
            self.read_history(repo, &commit, filter, &mut entries)?;
        }
        let info = ScanInfo { commit, branch: repo.branch.clone() };
        self.read_contents(repo, &info, tip_time, &entries, sink)?;
        Ok(info)
    }

    /// The commit id and commit time at the tip.
    fn resolve(&self, repo: &Repo) -> Result<(String, i64), ConnectorError> {
        let mut cmd = git(Some(&repo.loc));
        // The trailing `--` makes git read the branch as a revision, never as a path.
        cmd.args(["log", "-1", "--no-color", "--format=%H%x1f%ct", &repo.rev, "--"]);
        let out = run(&mut cmd)?;
        let rev_shown = if repo.rev == "FETCH_HEAD" { repo.branch.as_str() } else { repo.rev.as_str() };
        if !out.ok {
            return Err(self.git_failure(&out.stderr_line, &repo.shown, Some(rev_shown)));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut fields = text.trim().split('\x1f');
        let commit = fields.next().unwrap_or_default().to_string();
        let time = fields.next().and_then(|t| t.trim().parse::<i64>().ok());
        match time {
            Some(time) if !commit.is_empty() && commit.bytes().all(|b| b.is_ascii_hexdigit()) => Ok((commit, time)),
            _ => Err(self.fail(format!("git gave an unexpected answer for `{rev_shown}` in {}", repo.shown))),
        }
    }

    /// Lists the blobs at `commit` that pass the filters. Oversized files are reported as skipped
    /// here, in path order, and left out of the list.
    fn list_files(
        &self,
        repo: &Repo,
        commit: &str,
        filter: &Filter,
        sink: &mut Sink<'_>,
    ) -> Result<Vec<Entry>, ConnectorError> {
        let mut cmd = git(Some(&repo.loc));
        cmd.args(["ls-tree", "-r", "-z", "--long", "--full-tree", commit]);
        let mut proc = spawn(&mut cmd, false)?;
        let limit = self.config.max_file_bytes;
        let mut entries = Vec::new();
        let mut any_under_root = false;
        let mut rec = Vec::new();
        loop {
            rec.clear();
            let n = proc.stdout.read_until(0, &mut rec).map_err(|e| self.fail(format!("reading git ls-tree: {e}")))?;
            if n == 0 {
                break;
            }
            if rec.last() == Some(&0) {
                rec.pop();
            }
            // `<mode> <type> <oid> <padded size>\t<path>`
            let Some(tab) = rec.iter().position(|&b| b == b'\t') else {
                continue;
            };
            let meta = String::from_utf8_lossy(&rec[..tab]);
            let mut fields = meta.split_ascii_whitespace();
            let (Some(mode), Some(kind), Some(oid), size) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let (path, lossy_path) = match std::str::from_utf8(&rec[tab + 1..]) {
                Ok(p) => (p.to_string(), false),
                Err(_) => (String::from_utf8_lossy(&rec[tab + 1..]).into_owned(), true),
            };
            if !filter.under_root(&path) {
                continue;
            }
            any_under_root = true;
            // Submodules (type `commit`) and symlinks are not documents of this repository.
            if kind != "blob" || mode == "120000" || !filter.wants(&path) {
                continue;
            }
            if lossy_path {
                let reason = SkipReason::Invalid("the file name is not valid UTF-8".to_string());
                emit(sink, Event::Skipped { source_id: path, reason })?;
                continue;
            }
            let Some(size) = size.and_then(|s| s.parse::<u64>().ok()) else {
                let reason = SkipReason::Unreadable("git ls-tree gave no size".to_string());
                emit(sink, Event::Skipped { source_id: path, reason })?;
                continue;
            };
            if size > limit {
                emit(sink, Event::Skipped { source_id: path, reason: SkipReason::TooLarge { bytes: size, limit } })?;
                continue;
            }
            entries.push(Entry { path, oid: oid.to_string(), history: None });
        }
        if let Err(stderr) = proc.finish() {
            return Err(self.git_failure(&stderr, &repo.shown, None));
        }
        if !filter.root.is_empty() && !any_under_root {
            return Err(self.fail(format!(
                "there is no folder `{}` in {} at `{}`; check `root`",
                filter.root, repo.shown, repo.branch
            )));
        }
        Ok(entries)
    }

    /// One walk over the history fills in, per path, the author and time of the newest commit
    /// that touched it and the time of the oldest.
    fn read_history(
        &self,
        repo: &Repo,
        commit: &str,
        filter: &Filter,
        entries: &mut [Entry],
    ) -> Result<(), ConnectorError> {
        let index: HashMap<String, usize> = entries.iter().enumerate().map(|(i, e)| (e.path.clone(), i)).collect();
        let mut cmd = git(Some(&repo.loc));
        cmd.args(["log", "-z", "--no-color", "--no-renames", "--name-only", "--format=%x01%H%x1f%ct%x1f%aN", commit]);
        if filter.root.is_empty() {
            cmd.arg("--");
        } else {
            // --full-history: do not let merge simplification hide commits that touched the root.
            cmd.args(["--full-history", "--"]).arg(format!(":(top,literal){}", filter.root));
        }
        let mut proc = spawn(&mut cmd, false)?;
        let mut token = Vec::new();
        let mut current: Option<(i64, String)> = None;
        let mut after_header = false;
        loop {
            token.clear();
            let n = proc.stdout.read_until(0, &mut token).map_err(|e| self.fail(format!("reading git log: {e}")))?;
            if n == 0 {
                break;
            }
            if token.last() == Some(&0) {
                token.pop();
            }
            // Output: `\x01<hash>\x1f<time>\x1f<author>\0`, then `\n<path>\0<path>\0...` when the
            // commit changed files.
            if let Some(header) = token.strip_prefix(&[1u8]) {
                let header = String::from_utf8_lossy(header);
                let mut fields = header.splitn(3, '\x1f');
                let _hash = fields.next();
                let time = fields.next().and_then(|t| t.trim().parse::<i64>().ok());
                let author = fields.next().unwrap_or_default().trim().to_string();
                current = time.map(|t| (t, author));
                after_header = true;
                continue;
            }
            let mut path: &[u8] = &token;
            if after_header {
                path = path.strip_prefix(b"\n").unwrap_or(path);
                after_header = false;
            }
            let (Some((time, author)), Ok(path)) = (&current, std::str::from_utf8(path)) else {
                continue;
            };
            if let Some(&i) = index.get(path) {
                if let Some(entry) = entries.get_mut(i) {
                    entry.record(*time, author);
                }
            }
        }
        if let Err(stderr) = proc.finish() {
            return Err(self.git_failure(&stderr, &repo.shown, None));
        }
        Ok(())
    }

    /// Streams the blobs through one `git cat-file --batch` and emits the items.
    fn read_contents(
        &self,
        repo: &Repo,
        info: &ScanInfo,
        tip_time: i64,
        entries: &[Entry],
        sink: &mut Sink<'_>,
    ) -> Result<(), ConnectorError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut cmd = git(Some(&repo.loc));
        cmd.args(["cat-file", "--batch", "--buffer"]);
        let mut proc = spawn(&mut cmd, true)?;
        let Some(mut stdin) = proc.child.stdin.take() else {
            return Err(self.fail("could not write to git cat-file".to_string()));
        };
        // Written from a thread: with everything requested up front, git would block on a full
        // stdout pipe while we block on a full stdin pipe.
        let oids: Vec<String> = entries.iter().map(|e| e.oid.clone()).collect();
        let writer = std::thread::spawn(move || {
            let mut out = std::io::BufWriter::new(&mut stdin);
            for oid in &oids {
                if writeln!(out, "{oid}").is_err() {
                    return;
                }
            }
            let _ = out.flush();
            // stdin drops here, which tells git the list is complete.
        });
        let limit = self.config.max_file_bytes;
        for entry in entries {
            let blob = match read_blob(&mut proc.stdout, &entry.oid, limit) {
                Ok(blob) => blob,
                Err(why) => {
                    let stderr = proc.finish().err().unwrap_or_default();
                    let detail = if stderr.is_empty() { why } else { format!("{why} ({stderr})") };
                    return Err(self.fail(format!("git cat-file failed in {}: {detail}", repo.shown)));
                }
            };
            let event = match blob {
                Blob::Unreadable(why) => {
                    Event::Skipped { source_id: entry.path.clone(), reason: SkipReason::Unreadable(why) }
                }
                Blob::TooLarge(bytes) => {
                    Event::Skipped { source_id: entry.path.clone(), reason: SkipReason::TooLarge { bytes, limit } }
                }
                Blob::Data(bytes) => match self.item(entry, bytes, info, tip_time) {
                    Ok(item) => Event::Item(item),
                    Err(reason) => Event::Skipped { source_id: entry.path.clone(), reason },
                },
            };
            emit(sink, event)?;
        }
        let _ = writer.join();
        if let Err(stderr) = proc.finish() {
            return Err(self.git_failure(&stderr, &repo.shown, None));
        }
        Ok(())
    }

    fn item(&self, entry: &Entry, bytes: Vec<u8>, info: &ScanInfo, tip_time: i64) -> Result<Item, SkipReason> {
        let file = extract(&entry.path, bytes, self.config.max_file_bytes)?;
        let mut metadata = Map::new();
        // The blob id, not the tip commit: metadata is part of the content hash, and a new commit
        // elsewhere in the repository must not make this unchanged file look changed.
        metadata.insert("blob".to_string(), Value::String(entry.oid.clone()));
        metadata.insert("path".to_string(), Value::String(entry.path.clone()));
        if file.lossy {
            metadata.insert("lossy_utf8".to_string(), Value::Bool(true));
        }
        if let Some(front) = file.front_matter {
            metadata.insert("front_matter".to_string(), Value::Object(front));
        }
        // A path with no history entry can only come from an unusual history (a graft, a
        // replaced object); the tip's time is the honest fallback.
        let (updated, created, author) = match &entry.history {
            Some(h) => (h.updated, h.created, (!h.author.is_empty()).then(|| h.author.clone())),
            None => (tip_time, tip_time, None),
        };
        Ok(Item {
            source_id: entry.path.clone(),
            title: file.title,
            body: file.body,
            content_type: file.content_type.to_string(),
            source_url: self
                .config
                .source_url
                .as_deref()
                .map(|t| fill_template(t, &entry.path, &info.branch, &info.commit)),
            author,
            created_at: Some(rfc3339(created)),
            updated_at: rfc3339(updated),
            metadata: Value::Object(metadata),
        })
    }
}

/// Where git finds a repository.
enum Location {
    /// A work tree with `.git` (run as `git -C <dir>`).
    WorkTree(PathBuf),
    /// A bare repository (run as `git --git-dir <dir>`).
    GitDir(PathBuf),
}

/// A repository ready to read at `rev`.
struct Repo {
    loc: Location,
    rev: String,
    branch: String,
    /// How messages name the repository.
    shown: String,
}

struct Entry {
    path: String,
    oid: String,
    history: Option<History>,
}

struct History {
    author: String,
    updated: i64,
    created: i64,
}

impl Entry {
    fn record(&mut self, time: i64, author: &str) {
        match &mut self.history {
            None => self.history = Some(History { author: author.to_string(), updated: time, created: time }),
            Some(h) => {
                if time > h.updated {
                    h.updated = time;
                    h.author = author.to_string();
                }
                h.created = h.created.min(time);
            }
        }
    }
}

/// `root`, `include` and `exclude`, compiled once.
struct Filter {
    /// Without leading or trailing `/`; empty for the whole repository.
    root: String,
    /// `None` when `include` is empty: everything is included.
    include: Option<GlobSet>,
    exclude: GlobSet,
}

impl Filter {
    fn new(config: &GitConnectorConfig, name: &str) -> Result<Self, ConnectorError> {
        let mut root = config.root.trim().trim_matches('/');
        while let Some(rest) = root.strip_prefix("./") {
            root = rest.trim_start_matches('/');
        }
        let root = if root == "." { String::new() } else { root.to_string() };
        let build = |patterns: &[String], field: &str| -> Result<GlobSet, ConnectorError> {
            let mut set = GlobSetBuilder::new();
            for p in patterns {
                let glob = Glob::new(p).map_err(|e| {
                    ConnectorError::Source(format!(
                        "`{p}` in `{field}` is not a valid glob ({e}) in [connectors.git.{name}]"
                    ))
                })?;
                set.add(glob);
            }
            set.build().map_err(|e| ConnectorError::Source(format!("`{field}`: {e} in [connectors.git.{name}]")))
        };
        let include = if config.include.is_empty() { None } else { Some(build(&config.include, "include")?) };
        Ok(Filter { root, include, exclude: build(&config.exclude, "exclude")? })
    }

    fn under_root(&self, path: &str) -> bool {
        self.root.is_empty()
            || path.strip_prefix(self.root.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// Globs match the repository-relative path; as in globset's default, `*` also crosses `/`.
    fn wants(&self, path: &str) -> bool {
        self.include.as_ref().is_none_or(|set| set.is_match(path)) && !self.exclude.is_match(path)
    }
}

fn emit(sink: &mut Sink<'_>, event: Event) -> Result<(), ConnectorError> {
    sink(event).map_err(ConnectorError::Sink)
}

enum Blob {
    Data(Vec<u8>),
    TooLarge(u64),
    Unreadable(String),
}

/// Reads one `git cat-file --batch` answer: `<oid> blob <size>\n<content>\n`, or
/// `<oid> missing\n`. An `Err` means the stream itself is broken.
fn read_blob(reader: &mut BufReader<ChildStdout>, oid: &str, limit: u64) -> Result<Blob, String> {
    let mut header = Vec::new();
    match reader.read_until(b'\n', &mut header) {
        Ok(0) => return Err("it stopped early".to_string()),
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    let header = String::from_utf8_lossy(&header);
    let fields: Vec<&str> = header.split_ascii_whitespace().collect();
    match fields.as_slice() {
        [got, kind, size] => {
            let size: u64 = size.parse().map_err(|_| format!("unexpected answer `{}`", header.trim()))?;
            let mut content = Vec::new();
            if size > limit {
                std::io::copy(&mut reader.by_ref().take(size), &mut std::io::sink()).map_err(|e| e.to_string())?;
            } else {
                reader.by_ref().take(size).read_to_end(&mut content).map_err(|e| e.to_string())?;
                if content.len() as u64 != size {
                    return Err("it stopped in the middle of a file".to_string());
                }
            }
            let mut newline = [0u8; 1];
            reader.read_exact(&mut newline).map_err(|e| e.to_string())?;
            if *got != oid {
                return Err(format!("asked for {oid}, got {got}"));
            }
            if *kind != "blob" {
                Ok(Blob::Unreadable(format!("object {oid} is a {kind}, not a file")))
            } else if size > limit {
                Ok(Blob::TooLarge(size))
            } else {
                Ok(Blob::Data(content))
            }
        }
        [_, status] => Ok(Blob::Unreadable(format!("object {oid} is {status} in the repository"))),
        _ => Err(format!("unexpected answer `{}`", header.trim())),
    }
}

/// A `git` command with settings that make its output predictable and keep it from prompting.
fn git(loc: Option<&Location>) -> Command {
    let mut cmd = Command::new("git");
    // Variables that would point git at another repository than the one we name.
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "LANGUAGE",
    ] {
        cmd.env_remove(var);
    }
    // English messages, because failures are classified by their text.
    cmd.env("LC_ALL", "C").env("GIT_TERMINAL_PROMPT", "0").env("GIT_OPTIONAL_LOCKS", "0");
    cmd.args([
        "-c",
        "core.quotepath=off",
        "-c",
        "log.showSignature=false",
        "-c",
        "log.showRoot=true",
        "-c",
        "diff.relative=false",
    ]);
    match loc {
        Some(Location::WorkTree(dir)) => {
            cmd.arg("-C").arg(dir);
        }
        Some(Location::GitDir(dir)) => {
            cmd.arg("--git-dir").arg(dir);
        }
        None => {}
    }
    cmd
}

#[cfg(test)]
// Static: test only: the git processes this thread spawned.
thread_local! {
    static SPAWNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn count_spawn() {
    #[cfg(test)]
    SPAWNS.with(|n| n.set(n.get() + 1));
}

fn spawn_error(e: std::io::Error) -> ConnectorError {
    if e.kind() == std::io::ErrorKind::NotFound {
        ConnectorError::Source(
            "git is not installed or not on PATH; the git connector runs the `git` command, so install git \
             and sync again"
                .to_string(),
        )
    } else {
        ConnectorError::Source(format!("could not run git: {e}"))
    }
}

/// A finished short command.
struct Output {
    ok: bool,
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr_line: String,
}

fn run(cmd: &mut Command) -> Result<Output, ConnectorError> {
    count_spawn();
    let out = cmd.stdin(Stdio::null()).output().map_err(spawn_error)?;
    Ok(Output {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: out.stdout,
        stderr_line: first_line(&out.stderr),
    })
}

/// A running command whose stdout is streamed. Dropping it kills the process if still running.
struct Running {
    child: Child,
    stdout: BufReader<ChildStdout>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

fn spawn(cmd: &mut Command, with_stdin: bool) -> Result<Running, ConnectorError> {
    count_spawn();
    cmd.stdin(if with_stdin { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(spawn_error)?;
    let (Some(stdout), stderr) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(ConnectorError::Source("could not read the output of git".to_string()));
    };
    // Drained on a thread so that a chatty stderr cannot fill its pipe and stall git.
    let stderr = stderr.map(|mut err| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let _ = err.by_ref().take(64 * 1024).read_to_end(&mut kept);
            let _ = std::io::copy(&mut err, &mut std::io::sink());
            kept
        })
    });
    Ok(Running { child, stdout: BufReader::with_capacity(64 * 1024, stdout), stderr })
}

impl Running {
    /// Waits for the exit; `Err` holds the first line of stderr (or the exit status).
    fn finish(&mut self) -> Result<(), String> {
        let status = self.child.wait();
        let stderr = self.stderr.take().and_then(|h| h.join().ok()).unwrap_or_default();
        match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => {
                let line = first_line(&stderr);
                Err(if line.is_empty() { format!("git exited with {s}") } else { line })
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn first_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_string()
}

fn is_bad_rev(lower_stderr: &str) -> bool {
    ["bad revision", "unknown revision", "ambiguous argument", "bad object", "invalid object name"]
        .iter()
        .any(|p| lower_stderr.contains(p))
}

/// `file:///abs/path` and `file://localhost/abs/path` as a path.
fn strip_file_scheme(url: &str) -> &str {
    if url.len() >= 7 && url[..7].eq_ignore_ascii_case("file://") {
        let rest = &url[7..];
        rest.strip_prefix("localhost/").map(|_| &rest[9..]).unwrap_or(rest)
    } else {
        url
    }
}

/// The URL with any `user:password@` replaced, for messages.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let authority_start = scheme_end + 3;
    let authority_end = url[authority_start..].find('/').map_or(url.len(), |i| authority_start + i);
    match url[authority_start..authority_end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..authority_start], &url[authority_start + at..]),
        None => url.to_string(),
    }
}

/// Removes credentials of `url` from a git message.
fn scrub(message: &str, url: &str) -> String {
    let redacted = redact(url);
    if redacted == url {
        message.to_string()
    } else {
        message.replace(url, &redacted)
    }
}

/// The clone folder name: the connector name, with anything that could leave `cache_dir`
/// replaced.
fn safe_name(name: &str) -> String {
    let cleaned: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    if cleaned.is_empty() || cleaned.chars().all(|c| c == '.') {
        format!("_{cleaned}")
    } else {
        cleaned
    }
}

/// Fills `{path}`, `{branch}` and `{commit}`. Path and branch are percent-encoded (keeping `/`),
/// which also keeps a `{` inside them from being read as a placeholder.
fn fill_template(template: &str, path: &str, branch: &str, commit: &str) -> String {
    template.replace("{path}", &encode_path(path)).replace("{branch}", &encode_path(branch)).replace("{commit}", commit)
}

fn encode_path(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Unix seconds as RFC 3339 UTC (`2024-01-31T12:00:00Z`).
fn rfc3339(secs: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::fs;

    const ALICE_DATE: &str = "2024-01-01T10:00:00+02:00";
    const BOB_DATE: &str = "2024-02-01T00:00:00+00:00";

    /// Runs git for fixtures, isolated from the user's configuration.
    fn sh(dir: &Path, args: &[&str], who: (&str, &str)) -> String {
        let out = Command::new("git")
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", who.0)
            .env("GIT_AUTHOR_EMAIL", "a@e")
            .env("GIT_COMMITTER_NAME", who.0)
            .env("GIT_COMMITTER_EMAIL", "a@e")
            .env("GIT_AUTHOR_DATE", who.1)
            .env("GIT_COMMITTER_DATE", who.1)
            .args(args)
            .output()
            .expect("git runs");
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn write(dir: &Path, path: &str, bytes: &[u8]) {
        let file = dir.join(path);
        fs::create_dir_all(file.parent().expect("has a parent")).expect("mkdir");
        fs::write(file, bytes).expect("write");
    }

    /// Two commits on `main` by different people, plus a branch `other`.
    fn fixture(dir: &Path) -> PathBuf {
        let repo = dir.join("repo");
        fs::create_dir_all(&repo).expect("mkdir");
        let alice = ("Alice", ALICE_DATE);
        let bob = ("Bob", BOB_DATE);
        sh(&repo, &["init", "-q", "-b", "main"], alice);
        write(&repo, "README.md", b"# Project\n\nHello.\n");
        write(&repo, "docs/guide.md", b"---\ntitle: The Guide\n---\nFirst.\n");
        write(&repo, "docs/notes.txt", b"notes\n");
        write(&repo, "src/main.rs", b"fn main() {}\n");
        write(&repo, "bin.dat", b"\x00\x01\x02binary");
        write(&repo, "big.txt", &[b'x'; 2000]);
        write(&repo, "latin1.txt", b"caf\xe9\n");
        std::os::unix::fs::symlink("README.md", repo.join("link.md")).expect("symlink");
        sh(&repo, &["add", "-A"], alice);
        sh(&repo, &["commit", "-q", "-m", "one"], alice);
        let first = sh(&repo, &["rev-parse", "HEAD"], alice);

        write(&repo, "docs/guide.md", b"---\ntitle: The Guide\n---\nSecond.\n");
        write(&repo, "docs/new.md", b"# New page\n");
        sh(&repo, &["add", "-A"], bob);
        // A submodule entry (gitlink) must be skipped silently.
        sh(&repo, &["update-index", "--add", "--cacheinfo", &format!("160000,{first},vendor/sub")], bob);
        sh(&repo, &["commit", "-q", "-m", "two"], bob);

        sh(&repo, &["checkout", "-q", "-b", "other", &first], ("Carol", BOB_DATE));
        write(&repo, "other.md", b"# Other\n");
        sh(&repo, &["add", "-A"], ("Carol", BOB_DATE));
        sh(&repo, &["commit", "-q", "-m", "other"], ("Carol", BOB_DATE));
        sh(&repo, &["checkout", "-q", "main"], alice);
        repo
    }

    fn config(value: Value) -> GitConnectorConfig {
        serde_json::from_value(value).expect("valid config")
    }

    struct Scan {
        info: Result<ScanInfo, ConnectorError>,
        items: Vec<Item>,
        skipped: Vec<(String, SkipReason)>,
        spawns: usize,
    }

    fn scan_with(cfg: &GitConnectorConfig, base: &Path, cache: &Path, remote: Option<bool>) -> Scan {
        let connector = GitConnector { name: "docs", config: cfg, base_dir: base, cache_dir: cache };
        let mut items = Vec::new();
        let mut skipped = Vec::new();
        let before = SPAWNS.with(|n| n.get());
        let mut sink = |event: Event| {
            match event {
                Event::Item(item) => items.push(item),
                Event::Skipped { source_id, reason } => skipped.push((source_id, reason)),
                Event::End(_) => {}
            }
            Ok(())
        };
        let info = match remote {
            None => connector.scan(&mut sink),
            Some(remote) => connector.scan_as(remote, &mut sink),
        };
        let spawns = SPAWNS.with(|n| n.get()) - before;
        Scan { info, items, skipped, spawns }
    }

    fn ids(items: &[Item]) -> Vec<&str> {
        items.iter().map(|i| i.source_id.as_str()).collect()
    }

    fn error_text(result: Result<ScanInfo, ConnectorError>) -> String {
        match result {
            Ok(info) => panic!("expected an error, got {info:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn scans_head_with_history_titles_and_skips() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = fixture(tmp.path());
        let cfg = config(json!({
            "url": repo.to_string_lossy(),
            "max_file_bytes": 1000,
            "source_url": "https://git.example/{branch}/{path}?at={commit}",
        }));
        let scan = scan_with(&cfg, tmp.path(), &tmp.path().join("cache"), None);
        let info = scan.info.expect("scan succeeds");
        let head = sh(&repo, &["rev-parse", "main"], ("T", ALICE_DATE));
        assert_eq!(info, ScanInfo { commit: head.clone(), branch: "main".to_string() });
        assert_eq!(
            ids(&scan.items),
            ["README.md", "docs/guide.md", "docs/new.md", "docs/notes.txt", "latin1.txt", "src/main.rs"]
        );
        assert_eq!(
            scan.skipped,
            [
                ("big.txt".to_string(), SkipReason::TooLarge { bytes: 2000, limit: 1000 }),
                ("bin.dat".to_string(), SkipReason::Binary),
            ]
        );
        // Bounded process count: symbolic-ref, log -1, ls-tree, log, cat-file.
        assert_eq!(scan.spawns, 5);

        let by_id = |id: &str| scan.items.iter().find(|i| i.source_id == id).expect("item present");
        let guide = by_id("docs/guide.md");
        assert_eq!(guide.title, "The Guide");
        // The front matter is metadata, beside the blob and path.
        assert_eq!(guide.body, "Second.\n");
        assert_eq!(guide.content_type, "text/markdown");
        assert_eq!(guide.author.as_deref(), Some("Bob"));
        assert_eq!(guide.created_at.as_deref(), Some("2024-01-01T08:00:00Z"));
        assert_eq!(guide.updated_at, "2024-02-01T00:00:00Z");
        assert_eq!(
            guide.source_url.as_deref(),
            Some(format!("https://git.example/main/docs/guide.md?at={head}").as_str())
        );
        let blob = sh(&repo, &["rev-parse", "main:docs/guide.md"], ("T", ALICE_DATE));
        assert_eq!(
            guide.metadata,
            json!({"blob": blob, "path": "docs/guide.md", "front_matter": {"title": "The Guide"}})
        );

        let readme = by_id("README.md");
        assert_eq!(readme.title, "Project");
        assert_eq!(readme.author.as_deref(), Some("Alice"));
        assert_eq!(readme.created_at.as_deref(), Some("2024-01-01T08:00:00Z"));
        assert_eq!(readme.updated_at, "2024-01-01T08:00:00Z");

        assert_eq!(by_id("docs/new.md").author.as_deref(), Some("Bob"));
        assert_eq!(by_id("docs/new.md").created_at.as_deref(), Some("2024-02-01T00:00:00Z"));
        assert_eq!(by_id("src/main.rs").content_type, "text/x-rust");
        // No heading to title it: the path in the repository, not the bare file name (issue 20).
        assert_eq!(by_id("src/main.rs").title, "src/main.rs");
        let latin1 = by_id("latin1.txt");
        assert_eq!(latin1.body, "caf\u{fffd}\n");
        assert_eq!(latin1.metadata["lossy_utf8"], json!(true));

        // The user's repository is untouched.
        assert_eq!(sh(&repo, &["status", "--porcelain"], ("T", ALICE_DATE)), "");
        assert_eq!(sh(&repo, &["symbolic-ref", "--short", "HEAD"], ("T", ALICE_DATE)), "main");
    }

    #[test]
    fn root_include_exclude_and_relative_url() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fixture(tmp.path());
        let cache = tmp.path().join("cache");
        let cfg = config(json!({"url": "repo", "root": "/docs/", "include": ["**/*.md"], "exclude": ["docs/new.md"]}));
        let scan = scan_with(&cfg, tmp.path(), &cache, None);
        scan.info.expect("scan succeeds");
        assert_eq!(ids(&scan.items), ["docs/guide.md"]);
        assert!(scan.skipped.is_empty());

        let cfg = config(json!({"url": "./repo", "exclude": ["*.txt", "*.dat", "src/**"]}));
        let scan = scan_with(&cfg, tmp.path(), &cache, None);
        scan.info.expect("scan succeeds");
        assert_eq!(ids(&scan.items), ["README.md", "docs/guide.md", "docs/new.md"]);

        let cfg = config(json!({"url": "repo", "root": "nowhere"}));
        let err = error_text(scan_with(&cfg, tmp.path(), &cache, None).info);
        assert!(err.contains("no folder `nowhere`") && err.contains("`root`"), "{err}");

        let cfg = config(json!({"url": "repo", "include": ["[oops"]}));
        let err = error_text(scan_with(&cfg, tmp.path(), &cache, None).info);
        assert!(err.contains("[oops") && err.contains("include"), "{err}");
    }

    #[test]
    fn reads_another_branch_without_checking_it_out() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = fixture(tmp.path());
        let cfg = config(json!({"url": repo.to_string_lossy(), "branch": "other", "include": ["*.md"]}));
        let scan = scan_with(&cfg, tmp.path(), &tmp.path().join("cache"), None);
        let info = scan.info.expect("scan succeeds");
        assert_eq!(info.branch, "other");
        assert_eq!(info.commit, sh(&repo, &["rev-parse", "other"], ("T", ALICE_DATE)));
        assert_eq!(ids(&scan.items), ["README.md", "docs/guide.md", "other.md"]);
        let other = scan.items.iter().find(|i| i.source_id == "other.md").expect("other.md");
        assert_eq!(other.author.as_deref(), Some("Carol"));
        assert_eq!(scan.items[1].body, "First.\n");
        // Four processes: the branch is configured, so no symbolic-ref.
        assert_eq!(scan.spawns, 4);
        assert_eq!(sh(&repo, &["symbolic-ref", "--short", "HEAD"], ("T", ALICE_DATE)), "main");
    }

    #[test]
    fn clear_errors_for_bad_sources() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fixture(tmp.path());
        let cache = tmp.path().join("cache");

        let cfg = config(json!({"url": "missing/repo"}));
        let err = error_text(scan_with(&cfg, tmp.path(), &cache, None).info);
        assert!(err.contains("does not exist") && err.contains("[connectors.git.docs]"), "{err}");

        let cfg = config(json!({"url": "repo/docs"}));
        let err = error_text(scan_with(&cfg, tmp.path(), &cache, None).info);
        assert!(err.contains("is not a git repository"), "{err}");

        let cfg = config(json!({"url": "repo", "branch": "nope"}));
        let err = error_text(scan_with(&cfg, tmp.path(), &cache, None).info);
        assert!(err.contains("branch `nope` was not found") && err.contains("bad revision"), "{err}");

        let cfg = config(json!({"url": "repo", "branch": "--upload-pack=x"}));
        let err = error_text(scan_with(&cfg, tmp.path(), &cache, None).info);
        assert!(err.contains("not a valid branch name"), "{err}");

        let empty = tmp.path().join("empty");
        fs::create_dir_all(&empty).expect("mkdir");
        sh(&empty, &["init", "-q", "-b", "main"], ("T", ALICE_DATE));
        let cfg = config(json!({"url": "empty"}));
        let err = error_text(scan_with(&cfg, tmp.path(), &cache, None).info);
        assert!(err.contains("has no commits yet"), "{err}");
    }

    #[test]
    fn sink_errors_stop_the_scan() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = fixture(tmp.path());
        let cfg = config(json!({"url": repo.to_string_lossy()}));
        let connector = GitConnector { name: "docs", config: &cfg, base_dir: tmp.path(), cache_dir: tmp.path() };
        let mut seen = 0;
        let mut sink = |_event: Event| {
            seen += 1;
            if seen == 2 {
                Err("disk full".to_string())
            } else {
                Ok(())
            }
        };
        match connector.scan(&mut sink) {
            Err(ConnectorError::Sink(msg)) => assert_eq!(msg, "disk full"),
            other => panic!("expected a sink error, got {other:?}"),
        }
        assert_eq!(seen, 2);
    }

    #[test]
    fn file_urls_and_bare_repositories_are_read_in_place() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = fixture(tmp.path());
        let cache = tmp.path().join("cache");
        let cfg = config(json!({"url": format!("file://{}", repo.display()), "include": ["*.md"]}));
        let scan = scan_with(&cfg, tmp.path(), &cache, None);
        scan.info.expect("scan succeeds");
        assert_eq!(ids(&scan.items), ["README.md", "docs/guide.md", "docs/new.md"]);
        assert!(!cache.exists(), "a local repository is never cloned");

        sh(tmp.path(), &["clone", "-q", "--bare", "repo", "bare.git"], ("T", ALICE_DATE));
        let cfg = config(json!({"url": "bare.git", "include": ["*.md"]}));
        let scan = scan_with(&cfg, tmp.path(), &cache, None);
        assert_eq!(scan.info.expect("scan succeeds").branch, "main");
        assert_eq!(ids(&scan.items), ["README.md", "docs/guide.md", "docs/new.md"]);
    }

    #[test]
    fn remotes_are_cloned_then_fetched() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = fixture(tmp.path());
        let cache = tmp.path().join("cache");
        let url = format!("file://{}", repo.display());
        let cfg = config(json!({"url": url, "include": ["*.md"]}));

        // `file://` is local for `scan`; `scan_as(true, ..)` drives the remote path with it.
        let scan = scan_with(&cfg, tmp.path(), &cache, Some(true));
        let info = scan.info.expect("clone succeeds");
        assert_eq!(info.branch, "main");
        assert!(cache.join("docs/.git").is_dir());
        assert_eq!(ids(&scan.items), ["README.md", "docs/guide.md", "docs/new.md"]);
        assert_eq!(scan.items[0].author.as_deref(), Some("Alice"));
        // clone, symbolic-ref, log -1, ls-tree, log, cat-file.
        assert_eq!(scan.spawns, 6);

        write(&repo, "later.md", b"# Later\n");
        sh(&repo, &["add", "-A"], ("Dan", BOB_DATE));
        sh(&repo, &["commit", "-q", "-m", "later"], ("Dan", BOB_DATE));
        let scan = scan_with(&cfg, tmp.path(), &cache, Some(true));
        let info = scan.info.expect("fetch succeeds");
        assert_eq!(info.commit, sh(&repo, &["rev-parse", "main"], ("T", ALICE_DATE)));
        assert_eq!(ids(&scan.items), ["README.md", "docs/guide.md", "docs/new.md", "later.md"]);
        // symbolic-ref, fetch, log -1, ls-tree, log, cat-file.
        assert_eq!(scan.spawns, 6);

        // Another branch of the same clone, by fetch.
        let cfg = config(json!({"url": url, "branch": "other", "include": ["*.md"]}));
        let scan = scan_with(&cfg, tmp.path(), &cache, Some(true));
        assert_eq!(scan.info.expect("fetch succeeds").branch, "other");
        assert_eq!(ids(&scan.items), ["README.md", "docs/guide.md", "other.md"]);

        let cfg = config(json!({"url": url, "branch": "nope"}));
        let err = error_text(scan_with(&cfg, tmp.path(), &cache, Some(true)).info);
        assert!(err.contains("could not fetch branch `nope`"), "{err}");

        let cfg = config(json!({"url": format!("file://{}/none", tmp.path().display())}));
        let err = error_text(scan_with(&cfg, tmp.path(), &tmp.path().join("cache2"), Some(true)).info);
        assert!(err.contains("could not clone") && err.contains("check `url`"), "{err}");
    }

    #[test]
    fn many_files_stream_through_one_cat_file() {
        // Far more than a pipe buffer in both directions, to catch a stdin/stdout deadlock.
        let tmp = tempfile::tempdir().expect("tempdir");
        let repo = tmp.path().join("many");
        fs::create_dir_all(&repo).expect("mkdir");
        sh(&repo, &["init", "-q", "-b", "main"], ("T", ALICE_DATE));
        let line = "x".repeat(300);
        for i in 0..2000 {
            write(&repo, &format!("d{}/f{i:04}.txt", i % 10), format!("{i}\n{line}\n").as_bytes());
        }
        sh(&repo, &["add", "-A"], ("T", ALICE_DATE));
        sh(&repo, &["commit", "-q", "-m", "many"], ("T", ALICE_DATE));
        let cfg = config(json!({"url": "many"}));
        let scan = scan_with(&cfg, tmp.path(), &tmp.path().join("cache"), None);
        scan.info.expect("scan succeeds");
        assert_eq!(scan.items.len(), 2000);
        assert_eq!(scan.spawns, 5);
        let f = scan.items.iter().find(|i| i.source_id == "d7/f1237.txt").expect("present");
        assert!(f.body.starts_with("1237\n"));
    }

    #[test]
    fn classifies_urls() {
        for remote in [
            "https://github.com/acme/docs.git",
            "ssh://git@host/acme/docs",
            "git@github.com:acme/docs.git",
            "host:repo",
            "git://host/x",
        ] {
            assert!(is_remote(remote), "{remote}");
        }
        for local in ["/srv/repo", "repo", "../repo", "./a:b", "file:///srv/repo", "FILE://repo", "C:\\repo", ":x"] {
            assert!(!is_remote(local), "{local}");
        }
        assert_eq!(strip_file_scheme("file:///srv/repo"), "/srv/repo");
        assert_eq!(strip_file_scheme("file://localhost/srv/repo"), "/srv/repo");
    }

    #[test]
    fn small_helpers() {
        assert_eq!(redact("https://user:tok@host/x.git"), "https://***@host/x.git");
        assert_eq!(redact("git@host:x.git"), "git@host:x.git");
        assert_eq!(
            fill_template("https://h/{branch}/{path}#{commit}", "a b/{commit}.md", "feat/x", "abc"),
            "https://h/feat/x/a%20b/%7Bcommit%7D.md#abc"
        );
        assert_eq!(safe_name("../evil"), ".._evil");
        assert_eq!(safe_name(".."), "_..");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    }
}
