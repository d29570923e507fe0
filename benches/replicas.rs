//! Replicas benchmark: the knowledge base and the REST path on PostgreSQL against SQLite, at
//! 100k chunks, in one run. Plain `Instant` timing and wrk; every number is printed next to its
//! target with PASS or MISS.
//!
//! ```text
//! cargo bench --bench replicas                  # starts a throwaway PostgreSQL (scripts/pg up)
//! CTX_TEST_DATABASE_URL=postgres://... cargo bench --bench replicas   # a superuser's URL of yours
//! cargo bench --bench replicas -- --chunks 20000 --secs 3              # a quicker run
//! ```
//!
//! What is measured:
//! - writing the same 100k-chunk corpus through `Store::apply` into SQLite and into PostgreSQL
//!   (the replica's copy caught up as it goes), and how long a new replica takes to build its
//!   copy from nothing;
//! - keyword search p50/p99 per query class of the kb bench on both (target: PostgreSQL p50 at
//!   most 10 ms for every class), with every first page compared;
//! - keyword nDCG@10 on the Debian labelled set of the quality bench on both (target: within
//!   0.02), when the set is built (`bench/quality/debian-set`);
//! - REST search and echo throughput and p50 through 1, 2 and 3 release `ctx serve` replicas on
//!   PostgreSQL against one on SQLite (wrk, one per replica, at once);
//! - `ctx sync` of 10,000 files on each backend.
//!
//! The throwaway PostgreSQL runs with fsync off (scripts/pg); a production server's commits
//! cost more. What each number means: bench/README.md, "Replicas".

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "support/bin.rs"]
mod bin;
#[path = "support/corpus.rs"]
mod corpus;
#[path = "support/wrk.rs"]
#[allow(dead_code)] // wrk_run's fixed -t2 -c8: here one wrk per server runs at once
mod wrk;

use corpus::*;
use ctx::config::Config;
use ctx::kb::store::Change;
use ctx::kb::{document_id, Kb};
use ctx::types::SearchRequest;
use serde_json::json;

/// The issue's bar for keyword search on PostgreSQL at 100k chunks, per query class.
const P50_TARGET: Duration = Duration::from_millis(10);
/// ... and for keyword quality against SQLite.
const NDCG_TOLERANCE: f64 = 0.02;
const SYNC_FILES: usize = 10_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let chunks: usize = value("--chunks").and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let secs: u64 = value("--secs").and_then(|v| v.parse().ok()).unwrap_or(5);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    println!("ctx replicas benchmark ({threads} CPUs, load average {}; {chunks} chunks)", load_average());
    let server = Postgres::start();
    println!("PostgreSQL: {} (fsync off: a throwaway server)", server.version());
    let mut verdicts = Vec::new();

    let work = tempfile::tempdir().expect("temp dir");
    let db = server.database();
    let (sqlite, shared) = workspaces(work.path(), &db.url);
    grow(&sqlite, &shared, chunks, &mut verdicts);
    new_replica(&db.url, work.path());
    search_classes(&sqlite, &shared, chunks, &mut verdicts);
    quality(&server, work.path(), &mut verdicts);
    drop((sqlite, shared));
    rest(work.path(), &db.url, secs, &mut verdicts);
    sync_files(&server, work.path(), &mut verdicts);

    println!("\n== summary (load average now {}) ==", load_average());
    for line in &verdicts {
        println!("{line}");
    }
}

/// The PostgreSQL the bench runs on: the tests' one named by `CTX_TEST_DATABASE_URL`, else a
/// throwaway one started here and removed at the end.
struct Postgres {
    admin_url: String,
    admin: ctx::db::Pg,
    dir: Option<String>,
}

impl Postgres {
    fn start() -> Postgres {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let (admin_url, dir) = match std::env::var(ctx::db::testing::ADMIN_ENV) {
            Ok(url) => (url, None),
            Err(_) => {
                let out = Command::new(repo.join("scripts/pg")).arg("up").output().expect("run scripts/pg up");
                assert!(out.status.success(), "scripts/pg up: {}", String::from_utf8_lossy(&out.stderr));
                let text = String::from_utf8(out.stdout).expect("utf-8");
                let var = |name: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(&format!("export {name}='")))
                        .map(|v| v.trim_end_matches('\'').to_string())
                        .unwrap_or_else(|| panic!("no {name} in {text}"))
                };
                (var("CTX_TEST_DATABASE_URL"), Some(var("CTX_TEST_PG_DIR")))
            }
        };
        let admin = ctx::db::testing::pool(ctx::db::DbUrl::parse(&admin_url, None).expect("the admin URL parses"));
        Postgres { admin_url, admin, dir }
    }

    fn version(&self) -> String {
        self.admin
            .run(|c| async move { c.query_one("SELECT current_setting('server_version')", &[]).await })
            .map(|r| r.get::<_, String>(0))
            .unwrap_or_else(|e| e.to_string())
    }

    /// A fresh database and role.
    fn database(&self) -> ctx::db::testing::TestDb {
        ctx::db::testing::database_on(self.admin.clone(), &self.admin_url)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
            let _ = Command::new(repo.join("scripts/pg")).args(["down", dir]).status();
        }
    }
}

/// The config of the bench's workspace: two filesystem sources (the corpus's) and `echo`;
/// `url` makes it a replica's.
fn config_text(url: Option<&str>) -> String {
    let db = match url {
        Some(url) => format!("[db]\npath = \"kb.sqlite\"\nurl = \"{url}\"\npool_size = 16\n"),
        None => "[db]\npath = \"kb.sqlite\"\n".to_string(),
    };
    format!(
        "{db}\n[connectors.filesystem.docs]\nroot = \"docs\"\n\n[connectors.filesystem.wiki]\nroot = \"wiki\"\n\n\
         [tools.script.echo]\npath = \"echo.lua\"\n"
    )
}

fn write_config(dir: &Path, name: &str, url: Option<&str>) -> PathBuf {
    let file = dir.join(name);
    std::fs::write(&file, config_text(url)).expect("write config");
    let echo = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/echo.lua");
    std::fs::copy(echo, dir.join("echo.lua")).expect("copy echo.lua");
    file
}

fn load(file: &Path) -> Arc<Config> {
    let text = std::fs::read_to_string(file).expect("read config");
    Arc::new(Config::from_text(&text, Path::new("ctx.toml"), file, &|_| None).expect("valid config"))
}

/// The SQLite knowledge base and the shared one, in one folder (`kb.sqlite` and the replica's
/// copy `replica-kb.sqlite`).
fn workspaces(dir: &Path, url: &str) -> (Kb, Kb) {
    let sqlite = Kb::open(load(&write_config(dir, "sqlite.toml", None))).expect("open the SQLite kb");
    let config = load(&write_config(dir, "shared.toml", Some(url)));
    let shared = ctx::app::database::open_kb(config, ctx::app::database::Role::Command).expect("open the shared kb");
    (sqlite, shared)
}

/// Writes the same corpus into both, timing each.
fn grow(sqlite: &Kb, shared: &Kb, target: usize, verdicts: &mut Vec<String>) {
    let spec = sqlite.chunk_spec();
    let mut gen = Generator::new(0x5EED_C0DE);
    let (mut docs, mut chunks) = (0usize, 0usize);
    let (mut on_sqlite, mut on_pg) = (Duration::ZERO, Duration::ZERO);
    let mut batch: Vec<Change> = Vec::with_capacity(BATCH);
    while chunks < target {
        let (change, count) = gen.change(docs, spec);
        chunks += count;
        batch.push(change);
        docs += 1;
        if batch.len() == BATCH || chunks >= target {
            let t = Instant::now();
            sqlite.store().apply(&batch).expect("apply to SQLite");
            on_sqlite += t.elapsed();
            let t = Instant::now();
            shared.store().apply(&batch).expect("apply to PostgreSQL");
            on_pg += t.elapsed();
            batch.clear();
        }
    }
    let rate = |d: Duration| chunks as f64 / d.as_secs_f64();
    println!("\ncorpus: {docs} documents, {chunks} chunks, written in batches of {BATCH} through Store::apply");
    println!("  SQLite:     {:>7.2} s  {:>8.0} chunks/s", on_sqlite.as_secs_f64(), rate(on_sqlite));
    println!(
        "  PostgreSQL: {:>7.2} s  {:>8.0} chunks/s  (each batch committed there, then the replica's copy caught up)",
        on_pg.as_secs_f64(),
        rate(on_pg)
    );
    verdicts.push(format!(
        "writing {chunks} chunks: SQLite {:.0}/s, PostgreSQL {:.0}/s (no target)",
        rate(on_sqlite),
        rate(on_pg)
    ));
}

/// How long a replica started on an empty folder takes to build its copy.
fn new_replica(url: &str, dir: &Path) {
    let fresh = dir.join("fresh");
    std::fs::create_dir_all(&fresh).expect("mkdir");
    let config = load(&write_config(&fresh, "ctx.toml", Some(url)));
    let t = Instant::now();
    let kb = ctx::app::database::open_kb(config, ctx::app::database::Role::Command).expect("open");
    let took = t.elapsed();
    let chunks = kb.stats().expect("stats").chunks;
    println!(
        "  a new replica's copy from nothing: {chunks} chunks in {:.2} s (once per machine; then it catches up)",
        took.as_secs_f64()
    );
}

fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Times `f` over `queries` in rounds until `budget` is spent (at least 5 rounds).
fn time<T>(queries: usize, budget: Duration, mut f: impl FnMut(usize) -> T) -> Vec<Duration> {
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut rounds = 0;
    while rounds < 5 || (started.elapsed() < budget && rounds < 200) {
        for q in 0..queries {
            let t = Instant::now();
            std::hint::black_box(f(q));
            samples.push(t.elapsed());
        }
        rounds += 1;
    }
    sorted(samples)
}

fn search_classes(sqlite: &Kb, shared: &Kb, chunks: usize, verdicts: &mut Vec<String>) {
    let frequent = frequent_mix();
    // (name, queries, source filter, since filter)
    type Class<'a> = (String, Vec<&'a str>, Option<&'a str>, Option<&'a str>);
    let mut classes: Vec<Class> =
        SCALE_CLASSES.iter().map(|(name, queries)| (name.to_string(), queries.to_vec(), None, None)).collect();
    classes.push(("frequent, source = wiki".into(), frequent.clone(), Some("wiki"), None));
    classes.push((format!("frequent, since {}", &SINCE[..10]), frequent.clone(), None, Some(SINCE)));
    println!(
        "\nkeyword search per query class at {chunks} chunks (Kb::search, limit {LIMIT}, warm; target: PostgreSQL p50 <= {}):",
        ms(P50_TARGET)
    );
    println!(
        "  {:<28} {:>11} {:>11} {:>11} {:>11}  same pages  verdict",
        "class", "SQLite p50", "PG p50", "PG p99", "PG/SQLite"
    );
    let mut all_ok = true;
    let mut summary = Vec::new();
    for (name, queries, source, since) in &classes {
        let requests: Vec<SearchRequest> = queries
            .iter()
            .map(|q| {
                let mut value = json!({ "query": q, "limit": LIMIT });
                if let Some(source) = source {
                    value["source"] = json!(source);
                }
                if let Some(since) = since {
                    value["since"] = json!(since);
                }
                serde_json::from_value(value).expect("valid SearchRequest")
            })
            .collect();
        let same = requests.iter().all(|r| {
            let ids = |kb: &Kb| kb.search(r).expect("search").results.iter().map(|h| h.id.clone()).collect::<Vec<_>>();
            ids(sqlite) == ids(shared)
        });
        let on_sqlite = time(requests.len(), Duration::from_secs(2), |q| sqlite.search(&requests[q]).expect("search"));
        let on_pg = time(requests.len(), Duration::from_secs(2), |q| shared.search(&requests[q]).expect("search"));
        let (s50, p50, p99) = (pct(&on_sqlite, 50.0), pct(&on_pg, 50.0), pct(&on_pg, 99.0));
        let ok = p50 <= P50_TARGET && same;
        all_ok &= ok;
        println!(
            "  {:<28} {:>11} {:>11} {:>11} {:>10.2}x  {:<10}  {}",
            name,
            ms(s50),
            ms(p50),
            ms(p99),
            p50.as_secs_f64() / s50.as_secs_f64().max(1e-9),
            if same { "yes" } else { "NO" },
            verdict(ok)
        );
        summary.push(format!("{name} {}", ms(p50)));
    }
    println!(
        "  (a PostgreSQL search checks the database's generation at most every 50 ms, one short query, then reads \
         the local copy)"
    );
    verdicts.push(format!(
        "keyword p50 on PostgreSQL at {chunks} chunks (target <= {} per class, same pages as SQLite): {} {}",
        ms(P50_TARGET),
        summary.join(", "),
        verdict(all_ok)
    ));
}

/// Keyword nDCG@10 of the quality bench's labelled set on both backends.
fn quality(server: &Postgres, dir: &Path, verdicts: &mut Vec<String>) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let set = std::env::var_os("CTX_QUALITY_SET")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/quality/debian/set"));
    let Ok(tsv) = std::fs::read_to_string(set.join("queries.tsv")) else {
        println!(
            "\nkeyword quality: skipped (no labelled set at {}; build it with bench/quality/debian-set)",
            set.display()
        );
        verdicts.push("keyword nDCG@10 PostgreSQL vs SQLite: not measured (no labelled set)".into());
        return;
    };
    let queries: Vec<(String, String)> = tsv
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once('\t'))
        .map(|(package, text)| (document_id("filesystem:docs", &format!("{package}.md")), text.to_string()))
        .collect();
    let db = server.database();
    let root = dir.join("quality");
    std::fs::create_dir_all(&root).expect("mkdir");
    let text = |url: Option<&str>| {
        let db = url.map(|u| format!("url = \"{u}\"\n")).unwrap_or_default();
        format!(
            "[db]\npath = \"kb.sqlite\"\n{db}\n[connectors.filesystem.docs]\nroot = {:?}\n",
            set.join("docs").display().to_string()
        )
    };
    let open = |name: &str, url: Option<&str>| {
        let file = root.join(name);
        std::fs::write(&file, text(url)).expect("write config");
        let config = load(&file);
        let kb = match url {
            Some(_) => ctx::app::database::open_kb(config, ctx::app::database::Role::Command).expect("open"),
            None => Kb::open(config).expect("open"),
        };
        ctx::kb::sync::sync_target(&kb, "all", ctx::kb::sync::SyncOptions::default(), &mut |_| {}).expect("sync");
        kb
    };
    let sqlite = open("sqlite.toml", None);
    let shared = open("shared.toml", Some(&db.url));
    let ndcg = |kb: &Kb| -> (f64, Vec<Vec<String>>) {
        let mut pages = Vec::new();
        let mut sum = 0.0;
        for (relevant, text) in &queries {
            let request: SearchRequest = serde_json::from_value(json!({"query": text, "limit": 10})).expect("request");
            let ids: Vec<String> =
                kb.search(&request).map(|r| r.results.into_iter().map(|h| h.id).collect()).unwrap_or_default();
            if let Some(at) = ids.iter().position(|id| id == relevant) {
                sum += 1.0 / ((at + 2) as f64).log2();
            }
            pages.push(ids);
        }
        (sum / queries.len().max(1) as f64, pages)
    };
    let (on_sqlite, pages_sqlite) = ndcg(&sqlite);
    let (on_pg, pages_pg) = ndcg(&shared);
    let same = pages_sqlite.iter().zip(&pages_pg).filter(|(a, b)| a == b).count();
    let ok = (on_sqlite - on_pg).abs() <= NDCG_TOLERANCE;
    println!(
        "\nkeyword quality on the labelled set ({} queries, one relevant document each): nDCG@10 SQLite {on_sqlite:.4}, \
         PostgreSQL {on_pg:.4} (difference {:.4}; target <= {NDCG_TOLERANCE}); identical first pages {same} of {}  {}",
        queries.len(),
        (on_sqlite - on_pg).abs(),
        queries.len(),
        verdict(ok)
    );
    verdicts.push(format!(
        "keyword nDCG@10 PostgreSQL {on_pg:.4} vs SQLite {on_sqlite:.4} (within {NDCG_TOLERANCE}): {}",
        verdict(ok)
    ));
}

/// wrk against several servers at once, one wrk each: the summed rate and each one's p50.
fn load_all(bases: &[String], path: &str, script: &Path, secs: u64) -> (f64, Vec<Duration>, u64) {
    let wrk = wrk::find_wrk();
    let children: Vec<Child> = bases
        .iter()
        .map(|base| {
            Command::new(&wrk)
                .args(["-t1", "-c8", "--latency", &format!("-d{secs}s"), "-s"])
                .arg(script)
                .arg(format!("{base}{path}"))
                .stdout(Stdio::piped())
                .spawn()
                .expect("run wrk")
        })
        .collect();
    let (mut rate, mut p50s, mut errors) = (0.0, Vec::new(), 0);
    for child in children {
        let out = child.wait_with_output().expect("wrk ends");
        let text = String::from_utf8_lossy(&out.stdout);
        let load = wrk::parse_wrk(&text).unwrap_or_else(|| panic!("cannot read wrk's output:\n{text}"));
        rate += load.rate;
        p50s.push(load.p50);
        errors += load.errors;
    }
    (rate, p50s, errors)
}

fn rest(dir: &Path, url: &str, secs: u64, verdicts: &mut Vec<String>) {
    let scripts = dir.join("wrk");
    std::fs::create_dir_all(&scripts).expect("mkdir");
    let post = |body: &str, need: &str| {
        wrk::checked(
            need,
            &format!(
                "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = '{body}'\n"
            ),
        )
    };
    let echo = scripts.join("echo.lua");
    std::fs::write(&echo, post(r#"{"message": "hello"}"#, "\"message\":\"hello\"")).expect("write");
    let search = scripts.join("search.lua");
    std::fs::write(&search, post(r#"{"query": "deploy kafka", "limit": 10}"#, "\"results\"")).expect("write");
    println!(
        "\nREST through release `ctx serve` at the corpus above ({secs} s per run; wrk -t1 -c8 per server, all at once; \
         the servers, PostgreSQL and wrk share this machine's CPUs):"
    );
    println!("  {:<22} {:>14} {:>14} {:>14} {:>14}", "servers", "search req/s", "search p50", "echo req/s", "echo p50");
    let mut rows = Vec::new();
    let setups: [(&str, Option<&str>, usize); 4] = [
        ("1 on SQLite", None, 1),
        ("1 on PostgreSQL", Some(url), 1),
        ("2 on PostgreSQL", Some(url), 2),
        ("3 on PostgreSQL", Some(url), 3),
    ];
    for (label, url, n) in setups {
        let config = write_config(dir, if url.is_some() { "shared.toml" } else { "sqlite.toml" }, url);
        let servers: Vec<(Child, String)> = (0..n)
            .map(|_| {
                bin::serve(&config, |c| {
                    c.current_dir(dir);
                })
            })
            .collect();
        let bases: Vec<String> = servers.iter().map(|(_, base)| base.clone()).collect();
        // Warm: every server's first search reads the posting lists.
        let _ = load_all(&bases, "/tools/search", &search, 1);
        let (search_rate, search_p50, search_errors) = load_all(&bases, "/tools/search", &search, secs);
        let (echo_rate, echo_p50, echo_errors) = load_all(&bases, "/tools/echo", &echo, secs);
        for (mut child, _) in servers {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert_eq!(search_errors + echo_errors, 0, "{label}: failed requests");
        let worst = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
        println!(
            "  {:<22} {:>14.0} {:>14} {:>14.0} {:>14}",
            label,
            search_rate,
            ms(worst(&search_p50)),
            echo_rate,
            ms(worst(&echo_p50))
        );
        rows.push(format!("{label}: search {search_rate:.0}/s, echo {echo_rate:.0}/s"));
    }
    println!(
        "  (p50 is the slowest server's. With {} CPUs, more replicas divide the same cores: the rate cannot rise; \
         each replica's cost is the difference. On machines of their own, replicas add what one server does alone.)",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    verdicts.push(format!("REST throughput (no target): {}", rows.join("; ")));
}

fn sync_files(server: &Postgres, dir: &Path, verdicts: &mut Vec<String>) {
    let root = dir.join("sync");
    std::fs::create_dir_all(&root).expect("mkdir");
    let bytes = write_notes(&root, SYNC_FILES);
    let db = server.database();
    let mut rates = Vec::new();
    for (label, url) in [("SQLite", None), ("PostgreSQL", Some(db.url.as_str()))] {
        let file = root.join(format!("{label}.toml"));
        let url_line = url.map(|u| format!("url = \"{u}\"\n")).unwrap_or_default();
        let kb = if url.is_some() { "pg.sqlite" } else { "kb.sqlite" };
        std::fs::write(
            &file,
            format!("[db]\npath = \"{kb}\"\n{url_line}\n[connectors.filesystem.docs]\nroot = \"docs\"\n"),
        )
        .expect("write config");
        let t = Instant::now();
        let out = Command::new(bin::ctx_bin())
            .arg("--config")
            .arg(&file)
            .args(["-q", "sync"])
            .current_dir(&root)
            .output()
            .expect("run ctx sync");
        let took = t.elapsed();
        assert!(out.status.success(), "ctx sync on {label}: {}", String::from_utf8_lossy(&out.stderr));
        let rate = SYNC_FILES as f64 / took.as_secs_f64();
        rates.push(format!("{label} {rate:.0} files/s"));
        println!(
            "\nctx sync of {SYNC_FILES} files ({:.1} MB) on {label}: {:.2} s, {rate:.0} files/s",
            bytes as f64 / 1e6,
            took.as_secs_f64()
        );
    }
    verdicts.push(format!("sync of {SYNC_FILES} files (no target): {}", rates.join(", ")));
}
