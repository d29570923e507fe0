//! File formats and the title fallback: HTML indexed as text, Markdown front matter kept as metadata, `.gz`
//! files read by their inner name, a UTF-8 BOM dropped, and untitled files titled by their path.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common::{Workspace, BIN};

const FS_CONFIG: &str = "[connectors.filesystem.docs]\nroot = \"docs\"\n";

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn write_bytes(ws: &Workspace, rel: &str, bytes: &[u8]) {
    let path = ws.path().join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// The summary line of `ctx sync --json`, and stderr with every skipped file listed (`-v`).
fn sync(ws: &Workspace) -> (Value, String) {
    let run = ws.ctx(&["sync", "--json", "-v"]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let summary = serde_json::from_str(run.stdout().lines().next().expect("a summary line")).unwrap();
    (summary, run.stderr())
}

fn hits(ws: &Workspace, query: &str) -> Vec<Value> {
    let response = ws.ctx(&["search", "--json", "--", query]).json();
    response["results"].as_array().expect("results").clone()
}

/// The one document a query finds, as `ctx get --json` shows it.
fn only_doc(ws: &Workspace, query: &str) -> Value {
    let found = hits(ws, query);
    assert_eq!(found.len(), 1, "{query}: {found:?}");
    ws.ctx(&["get", found[0]["id"].as_str().unwrap(), "--json"]).json()
}

const PAGE: &str = r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Widget  Handbook</title>
<style>.zebraclass { color: red } div > span { margin: 0 }</style>
<script>var quetzalword = "<div>"; if (a < b) { document.write("</p>"); }</script></head>
<body><nav class="menu"><a href="/index.html">Home navlinkword</a></nav>
<div class="wrapperattr" id="main"><span>Caf&eacute; &amp; tea &#x2014; brewing</span>
<h1>Brewing</h1><p>The kettle method needs fresh water and patience.</p>
<h2>Storage</h2><p>Keep the oolong leaves dry in a <b>sealed</b> tin.</p>
</div><noscript>enable javascript</noscript></body></html>
"#;

#[test]
fn html_drops_scripts_and_markup_keeps_title_and_headings() {
    // Small chunks, no overlap: each heading starts a chunk of its own.
    let ws = Workspace::new(&format!("{FS_CONFIG}[chunking]\nmax_tokens = 24\noverlap_tokens = 0\n"));
    ws.write("docs/guide/page.html", PAGE);
    ws.write("docs/plain.html", "not really html\n\nsecond paragraph about the capybara\n");
    let (summary, stderr) = sync(&ws);
    assert_eq!(summary["added"], 2, "{summary} {stderr}");

    for absent in ["quetzalword", "zebraclass", "navlinkword", "javascript", "div", "span", "wrapperattr", "href"] {
        assert!(hits(&ws, absent).is_empty(), "{absent} is indexed: {:?}", hits(&ws, absent));
    }
    let found = hits(&ws, "kettle");
    assert_eq!(found[0]["title"], "Widget Handbook");
    assert!(!found[0]["snippet"].as_str().unwrap().contains('<'), "{}", found[0]["snippet"]);

    let doc = only_doc(&ws, "oolong");
    assert_eq!(doc["title"], "Widget Handbook");
    assert_eq!(doc["content_type"], "text/html");
    let body = doc["body"].as_str().unwrap();
    assert!(body.contains("Café & tea — brewing"), "{body}");
    assert!(body.contains("# Brewing\n\nThe kettle method"), "{body}");
    assert!(!body.contains('<') && !body.contains("&amp;") && !body.contains("&eacute;"), "{body}");
    let chunks: Vec<&str> = doc["chunks"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert!(chunks.len() >= 2, "{chunks:?}");
    assert!(chunks.iter().any(|c| c.starts_with("## Storage\n\nKeep the oolong")), "{chunks:?}");

    // The terminal view shows the same text.
    let shown = ws.ctx(&["get", doc["id"].as_str().unwrap()]).ok();
    assert!(shown.contains("Café & tea — brewing") && !shown.contains("<h1>"), "{shown}");

    // A .html file with no tags keeps its lines and takes its path as title.
    let plain = only_doc(&ws, "capybara");
    assert_eq!(plain["body"], "not really html\n\nsecond paragraph about the capybara\n");
    assert_eq!(plain["title"], "plain.html");
}

#[test]
fn deeply_nested_html_is_indexed_without_crashing() {
    let ws = Workspace::new(FS_CONFIG);
    let depth = 10_000;
    ws.write("docs/deep.html", &format!("{}okapi{}", "<div>".repeat(depth), "</div>".repeat(depth)));
    // Never closed, as broken pages are.
    ws.write("docs/open.html", &format!("{}tapir", "<div><span><table><tr><td>".repeat(depth)));
    let (summary, stderr) = sync(&ws);
    assert_eq!(summary["added"], 2, "{summary} {stderr}");
    assert_eq!(only_doc(&ws, "okapi")["body"], "okapi\n");
    assert_eq!(only_doc(&ws, "tapir")["title"], "open.html");
}

#[test]
fn gz_is_read_by_its_inner_name() {
    let ws = Workspace::new(FS_CONFIG);
    write_bytes(&ws, "docs/pkg/README.md.gz", &gzip(b"# Packed Readme\n\nThe wombat burrows here.\n"));
    write_bytes(&ws, "docs/pkg/changelog.gz", &gzip(b"1.2: the pangolin release\n"));
    let (summary, stderr) = sync(&ws);
    assert_eq!((summary["added"].as_u64(), summary["skipped"].as_u64()), (Some(2), Some(0)), "{stderr}");

    let readme = only_doc(&ws, "wombat");
    assert_eq!(readme["title"], "Packed Readme");
    assert_eq!(readme["content_type"], "text/markdown");
    // The document is still the file on disk.
    assert_eq!(readme["source_id"], "pkg/README.md.gz");
    assert_eq!(readme["body"], "# Packed Readme\n\nThe wombat burrows here.\n");
    let changelog = only_doc(&ws, "pangolin");
    assert_eq!(changelog["title"], "pkg/changelog");
    assert_eq!(changelog["source_id"], "pkg/changelog.gz");
}

#[test]
fn gzip_bomb_and_corrupt_gz_are_skipped_with_reasons() {
    let limit = 1024 * 1024;
    let ws = Workspace::new(&format!("{FS_CONFIG}max_file_bytes = {limit}\n"));
    // 512 MiB of zeros in a 0.5 MiB file: 512 gzip members of 1 MiB each (a valid gzip file).
    let member = gzip(&vec![0u8; 1024 * 1024]);
    let bomb = member.repeat(512);
    assert!(bomb.len() < limit, "the bomb must pass the size check on disk: {}", bomb.len());
    write_bytes(&ws, "docs/bomb.txt.gz", &bomb);
    write_bytes(&ws, "docs/corrupt.txt.gz", b"this was never gzip");
    let mut truncated = gzip(b"the text of a download cut short, about a numbat");
    truncated.truncate(truncated.len() - 12);
    write_bytes(&ws, "docs/truncated.md.gz", &truncated);
    write_bytes(&ws, "docs/image.png.gz", &gzip(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"));
    ws.write("docs/ok.md", "# Fine\n\nthe quoll\n");

    let mut child = Command::new(BIN)
        .args(["--config", "ctx.toml", "sync", "--json", "-v"])
        .current_dir(ws.path())
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let readers = std::thread::spawn(move || {
        let (mut stdout, mut stderr) = (String::new(), String::new());
        let stderr_reader = std::thread::spawn(move || {
            err.read_to_string(&mut stderr).unwrap();
            stderr
        });
        out.read_to_string(&mut stdout).unwrap();
        (stdout, stderr_reader.join().unwrap())
    });
    let (exit, peak_kib) = wait_with_peak_rss(&mut child);
    let (stdout, stderr) = readers.join().unwrap();
    assert_eq!(exit, Some(0), "{stderr}");
    // Unpacking stopped at the limit: the sync never held the 512 MiB (a sync's peak is ~30 MiB).
    assert!(peak_kib > 1024 && peak_kib < 200 * 1024, "peak RSS {peak_kib} KiB");

    let summary: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!((summary["added"].as_u64(), summary["skipped"].as_u64()), (Some(1), Some(4)), "{summary} {stderr}");
    assert!(hits(&ws, "numbat").is_empty());
    assert_eq!(hits(&ws, "quoll").len(), 1);
    let line = |file: &str| stderr.lines().find(|l| l.contains(file)).unwrap_or_else(|| panic!("{file}: {stderr}"));
    assert!(line("bomb.txt.gz").contains("unpacks to over the 1048576-byte limit"), "{stderr}");
    assert!(line("corrupt.txt.gz").contains("not valid gzip"), "{stderr}");
    assert!(line("truncated.md.gz").contains("not valid gzip"), "{stderr}");
    assert!(line("image.png.gz").contains("binary"), "{stderr}");
}

/// Waits for `child`: its exit code, and the peak resident size of the program it runs, in KiB.
///
/// Read from `VmHWM` while it runs, not from `wait4`'s `ru_maxrss`: Linux carries the parent's
/// peak into a spawned child's `ru_maxrss` (the test binary, with every test running beside this
/// one, can be far over the bound). `VmHWM` only ever grows, so polling every 5 ms misses at most
/// the last 5 ms, far too short to unpack the bomb.
fn wait_with_peak_rss(child: &mut std::process::Child) -> (Option<i32>, u64) {
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        let hwm = std::fs::read_to_string(&status_path).ok().and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        });
        peak = peak.max(hwm.unwrap_or(0));
        if let Some(status) = child.try_wait().unwrap() {
            return (status.code(), peak);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn bom_is_dropped_before_titles_and_indexing() {
    let ws = Workspace::new(FS_CONFIG);
    write_bytes(&ws, "docs/front.md", b"\xEF\xBB\xBF---\ntitle: Front Matter Title\n---\nthe gharial page\n");
    write_bytes(&ws, "docs/heading.md", b"\xEF\xBB\xBF# Heading Title\n\nthe dugong page\n");
    write_bytes(&ws, "docs/notes/first.txt", b"\xEF\xBB\xBFzebu first word\n");
    let (summary, stderr) = sync(&ws);
    assert_eq!(summary["added"], 3, "{summary} {stderr}");
    assert_eq!(only_doc(&ws, "gharial")["title"], "Front Matter Title");
    assert_eq!(only_doc(&ws, "dugong")["title"], "Heading Title");
    // The first word is found: no BOM glued to it.
    let first = only_doc(&ws, "zebu");
    assert_eq!(first["body"], "zebu first word\n");
    assert_eq!(first["title"], "notes/first.txt");
}

#[test]
fn titles_fall_back_to_the_path_in_the_source() {
    let ws = Workspace::new(FS_CONFIG);
    ws.write("docs/guide/install/copyright", "Copyright the jerboa authors\n");
    ws.write("docs/guide/upgrade/copyright", "Copyright the jerboa maintainers\n");
    ws.write("docs/top.txt", "a jerboa at the root\n");
    ws.write("docs/guide/untitled.md", "no heading, a jerboa\n");
    sync(&ws);
    let mut titles: Vec<String> =
        hits(&ws, "jerboa").iter().map(|h| h["title"].as_str().unwrap().to_string()).collect();
    titles.sort();
    assert_eq!(titles, ["guide/install/copyright", "guide/untitled.md", "guide/upgrade/copyright", "top.txt"]);
}

fn git(dir: &std::path::Path, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=Ada", "-c", "user.email=ada@example.com"])
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

#[test]
fn git_sources_read_html_gz_and_bom_the_same_way() {
    let ws = Workspace::new("[connectors.git.site]\nurl = \"repo\"\nbranch = \"main\"\nmax_file_bytes = 4096\n");
    let repo = ws.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::create_dir_all(repo.join("site/docs")).unwrap();
    std::fs::write(repo.join("site/page.html"), PAGE).unwrap();
    std::fs::write(repo.join("site/docs/NEWS.md.gz"), gzip(b"\xEF\xBB\xBF# News\n\nthe axolotl shipped\n")).unwrap();
    std::fs::write(repo.join("site/docs/big.txt.gz"), gzip(&vec![b'a'; 100_000])).unwrap();
    std::fs::write(repo.join("site/docs/copyright"), "the git jerboa\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "site"]);
    let (summary, stderr) = sync(&ws);
    assert_eq!((summary["added"].as_u64(), summary["skipped"].as_u64()), (Some(3), Some(1)), "{summary} {stderr}");
    assert!(stderr.lines().any(|l| l.contains("big.txt.gz") && l.contains("unpacks to over")), "{stderr}");

    assert!(hits(&ws, "quetzalword").is_empty());
    let page = only_doc(&ws, "oolong");
    assert_eq!(page["title"], "Widget Handbook");
    assert!(page["body"].as_str().unwrap().contains("## Storage"), "{}", page["body"]);
    let news = only_doc(&ws, "axolotl");
    assert_eq!((news["title"].as_str(), news["source_id"].as_str()), (Some("News"), Some("site/docs/NEWS.md.gz")));
    assert_eq!(only_doc(&ws, "jerboa")["title"], "site/docs/copyright");
}

/// YAML front matter is metadata, not text: the snippet never shows it, its `title` is the
/// document's title, its other keys are in the document's metadata, and a word only the front
/// matter has finds nothing (docs/search.md says so).
#[test]
fn markdown_front_matter_is_metadata_out_of_the_text_and_snippets() {
    let ws = Workspace::new(FS_CONFIG);
    ws.write(
        "docs/deploy.md",
        "---\ntitle: Deploy runbook\nowner: platformteam\ntags: [kubernetes, rollout]\n---\n\n\
         Roll the release back with the pipeline's undo button, then page the owner.\n",
    );
    ws.write("docs/plain.md", "---\nA rule, then prose, then a rule.\n---\n\nThe zebrafish section.\n");
    sync(&ws);

    let found = hits(&ws, "release back");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["title"], "Deploy runbook", "{found:?}");
    let snippet = found[0]["snippet"].as_str().unwrap();
    assert!(snippet.contains("release") && !snippet.contains("owner:") && !snippet.contains("---"), "{snippet}");
    let doc = ws.ctx(&["get", found[0]["id"].as_str().unwrap(), "--json"]).json();
    assert!(doc["body"].as_str().unwrap().starts_with("Roll the release back"), "{doc}");
    assert_eq!(
        doc["metadata"]["front_matter"],
        serde_json::json!({"title": "Deploy runbook", "owner": "platformteam", "tags": ["kubernetes", "rollout"]})
    );
    // The title is searched, as every title is; the other keys are not.
    assert_eq!(hits(&ws, "runbook").len(), 1);
    assert!(hits(&ws, "kubernetes").is_empty());
    assert!(hits(&ws, "platformteam").is_empty());
    // A `---` rule with prose between is text, not front matter.
    let plain = only_doc(&ws, "zebrafish");
    assert!(plain["body"].as_str().unwrap().starts_with("---\nA rule, then prose"), "{plain}");
    assert!(plain["metadata"].is_null(), "{plain}");
}
