//! Rate limits per tool and per caller: `rate = "10/min"` with a `burst`, as token buckets.
//!
//! A rule names tools (one Lua tool's own `rate`, or `[[server.rate_limits]]` globs over any
//! tool: built-ins, upstream tools, scripted tools). Each (rule, tool, caller) has its own
//! bucket: the caller is the scoped token's name, and every unscoped call shares one bucket.
//! Inner calls (`context.call`, code mode) count against their caller like any other call, and an
//! agent's prompt counts under the agent's name. Rate limits are a [`Policy`] of the call
//! pipeline.
//!
//! [`Policy`]: super::policy::Policy
//!
//! The buckets live for the process, not for one registry snapshot, so a hot reload does not
//! hand every caller a fresh burst. A rule that changes gets new buckets (its text is part of
//! the key). On a shared database they live there, so a limit holds across every replica: each
//! take locks its buckets' rows and refills them by the database's clock, not the replica's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::db::migrate::{Component, Migration};
use crate::db::Pg;

use globset::{Glob, GlobSet, GlobSetBuilder};

// What a rate is, and its parsing, are config data (`ctx.toml` is checked with them).
pub use crate::config::rate::{config_problems, Rate};

/// Which tools one rule covers.
enum Covers {
    /// A Lua tool's own `rate`: that tool only.
    Tool(String),
    /// `[[server.rate_limits]]` globs.
    Globs(GlobSet),
}

/// One rule: its key (a bucket's first part), the tools it covers and its rate.
struct Rule {
    key: String,
    covers: Covers,
    rate: Rate,
}

/// Every rate rule of one config. Built once per registry snapshot; the buckets outlive it.
pub struct Rules {
    rules: Vec<Rule>,
    buckets: std::sync::Arc<Buckets>,
}

/// A call refused by a rule: the rule's rate and how long until the call may run.
#[derive(Debug)]
pub struct Refused {
    pub rate: String,
    pub retry_after: Duration,
}

impl Rules {
    /// The rules of `config`: `[[server.rate_limits]]` in order, then each Lua tool's own
    /// `rate` (`tools` gives a loaded tool's name for its section). The config layer has
    /// already checked every rate, so one that fails here is skipped with a log line.
    pub fn from_config(
        config: &crate::config::Config,
        tool_of_section: &dyn Fn(&str) -> Option<String>,
        buckets: &std::sync::Arc<Buckets>,
    ) -> Rules {
        let mut rules = Vec::new();
        for (i, limit) in config.spec.server.rate_limits.iter().enumerate() {
            let burst = limit.burst;
            let rate = match Rate::parse(limit.rate.as_str(), burst) {
                Ok(rate) => rate,
                Err(e) => {
                    tracing::warn!("server.rate_limits[{i}]: {e}");
                    continue;
                }
            };
            let mut builder = GlobSetBuilder::new();
            for glob in &limit.tools {
                if let Ok(glob) = Glob::new(glob) {
                    builder.add(glob);
                }
            }
            let Ok(globs) = builder.build() else { continue };
            let key = format!("server.rate_limits[{i}] {}/{:?}", rate.text, burst);
            rules.push(Rule { key, covers: Covers::Globs(globs), rate });
        }
        for (section, spec) in &config.spec.tools.script {
            let Some(text) = spec.rate.as_ref() else { continue };
            let Some(tool) = tool_of_section(section.as_str()) else { continue };
            let burst = spec.burst;
            match Rate::parse(text.as_str(), burst) {
                Ok(rate) => {
                    let key = format!("tools.script.{} {}/{:?}", section.as_str(), rate.text, burst);
                    rules.push(Rule { key, covers: Covers::Tool(tool), rate });
                }
                Err(e) => tracing::warn!("tools.script.{}.rate: {e}", section.as_str()),
            }
        }
        Rules { rules, buckets: std::sync::Arc::clone(buckets) }
    }

    /// Whether no rule exists (the common case costs one branch per call).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Takes one call of `tool` by `caller` from every rule that covers it, or none when any
    /// of them refuses: the longest wait among those that refuse. `Err` when the shared
    /// database cannot be asked: the call is refused rather than let through unmetered.
    pub fn take(&self, tool: &str, caller: &str) -> Result<Result<(), Refused>, crate::db::DbError> {
        let covering: Vec<&Rule> = self
            .rules
            .iter()
            .filter(|r| match &r.covers {
                Covers::Tool(name) => name == tool,
                Covers::Globs(globs) => globs.is_match(tool),
            })
            .collect();
        if covering.is_empty() {
            return Ok(Ok(()));
        }
        match &self.buckets.shared {
            Some(pg) => shared::take_all(pg, &self.buckets.takes, &covering, tool, caller),
            None => Ok(take_all(&self.buckets, &covering, tool, caller, Instant::now())),
        }
    }

    /// Whether `tool` is covered by a rule whose buckets are in the shared database (taking
    /// from them waits on it).
    fn waits_on_database(&self, tool: &str) -> bool {
        self.buckets.shared.is_some()
            && self.rules.iter().any(|r| match &r.covers {
                Covers::Tool(name) => name == tool,
                Covers::Globs(globs) => globs.is_match(tool),
            })
    }
}

/// The bucket a rule keeps for one tool and one caller.
type Key = (String, String, String);

/// Takes one call from each rule's bucket, all or none.
fn take_all(buckets: &Buckets, rules: &[&Rule], tool: &str, caller: &str, now: Instant) -> Result<(), Refused> {
    let mut all = buckets.local.lock().unwrap_or_else(|p| p.into_inner());
    if all.len() >= MAX_BUCKETS {
        // A full bucket is the same as an absent one.
        all.retain(|_, b| b.tokens < b.burst);
    }
    let mut refused: Option<Refused> = None;
    for rule in rules {
        let key: Key = (rule.key.clone(), tool.to_string(), caller.to_string());
        let bucket = all.entry(key).or_insert(Bucket { tokens: rule.rate.burst, burst: rule.rate.burst, at: now });
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64() * rule.rate.per_second;
        bucket.tokens = (bucket.tokens + refill).min(rule.rate.burst);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - bucket.tokens) / rule.rate.per_second);
            if refused.as_ref().is_none_or(|r| r.retry_after < wait) {
                refused = Some(Refused { rate: rule.rate.text.clone(), retry_after: wait });
            }
        }
    }
    if let Some(refused) = refused {
        return Err(refused);
    }
    for rule in rules {
        let key: Key = (rule.key.clone(), tool.to_string(), caller.to_string());
        if let Some(bucket) = all.get_mut(&key) {
            bucket.tokens -= 1.0;
        }
    }
    Ok(())
}

/// One bucket: how many calls it holds now, as of when.
struct Bucket {
    tokens: f64,
    burst: f64,
    at: Instant,
}

/// Buckets kept at most; past this, full buckets (the same as absent ones) are dropped.
const MAX_BUCKETS: usize = 100_000;

/// The buckets of one application (see `super::CallState`): they outlive registry snapshots,
/// so a hot reload does not hand every caller a fresh burst. In memory, or in the shared
/// database.
#[derive(Default)]
pub struct Buckets {
    local: Mutex<HashMap<Key, Bucket>>,
    shared: Option<Pg>,
    /// Takes from the shared buckets, to sweep full ones now and then.
    takes: AtomicU64,
}

impl Buckets {
    /// Buckets in the shared database (migrated with [`PG`]).
    pub fn shared(pg: Pg) -> Buckets {
        Buckets { shared: Some(pg), ..Default::default() }
    }
}

/// The shared database's buckets.
// Static: immutable, a store's migrations: SQL text compiled in, the same for every application.
pub static PG: Component = Component {
    name: "rates",
    migrations: &[Migration {
        version: 1,
        name: "rate-limit buckets",
        sql: "
CREATE TABLE rate_buckets (
    rule        TEXT NOT NULL,
    tool        TEXT NOT NULL,
    caller      TEXT NOT NULL,
    tokens      FLOAT8 NOT NULL,
    burst       FLOAT8 NOT NULL,
    per_second  FLOAT8 NOT NULL,
    at          TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (rule, tool, caller)
);
",
    }],
    tables: &["rate_buckets"],
};

/// Taking from the shared buckets: one transaction that locks every covering rule's row (in
/// key order, so two replicas never wait on each other in a cycle), refills each by the
/// database's clock, and takes one call from all of them or from none.
mod shared {
    use super::*;

    /// One take in this many sweeps the buckets that are full again (the same as absent).
    const SWEEP_EVERY: u64 = 1024;

    pub(super) fn take_all(
        pg: &Pg,
        takes: &AtomicU64,
        rules: &[&Rule],
        tool: &str,
        caller: &str,
    ) -> Result<Result<(), Refused>, crate::db::DbError> {
        let mut wanted: Vec<(String, f64, f64, String)> =
            rules.iter().map(|r| (r.key.clone(), r.rate.burst, r.rate.per_second, r.rate.text.clone())).collect();
        wanted.sort_by(|a, b| a.0.cmp(&b.0));
        let (tool, caller) = (tool.to_string(), caller.to_string());
        let sweep = takes.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1;
        let taken = pg.run(move |mut client| async move {
            let tx = client.transaction().await?;
            let mut refused: Option<(String, f64)> = None;
            let mut levels = Vec::with_capacity(wanted.len());
            for (rule, burst, per_second, text) in &wanted {
                // One statement that makes the bucket if it is new and locks it either way: a
                // sweep deleting it meanwhile cannot leave the take without a row.
                let row = tx
                    .query_one(
                        "INSERT INTO rate_buckets AS b (rule, tool, caller, tokens, burst, per_second, at)
                         VALUES ($1::text, $2::text, $3::text, $4::float8, $4::float8, $5::float8, clock_timestamp())
                         ON CONFLICT (rule, tool, caller) DO UPDATE SET burst = excluded.burst
                         RETURNING least($4::float8, b.tokens + greatest(0, extract(epoch FROM clock_timestamp() - b.at)::float8) * $5::float8)",
                        &[rule, &tool, &caller, burst, per_second],
                    )
                    .await?;
                let tokens: f64 = row.get(0);
                if tokens < 1.0 {
                    let wait = (1.0 - tokens) / per_second;
                    if refused.as_ref().is_none_or(|(_, w)| *w < wait) {
                        refused = Some((text.clone(), wait));
                    }
                }
                levels.push(tokens);
            }
            if let Some(refused) = refused {
                tx.rollback().await?;
                return Ok(Err(refused));
            }
            for ((rule, ..), tokens) in wanted.iter().zip(levels) {
                tx.execute(
                    "UPDATE rate_buckets SET tokens = $4::float8, at = clock_timestamp()
                     WHERE rule = $1::text AND tool = $2::text AND caller = $3::text",
                    &[rule, &tool, &caller, &(tokens - 1.0)],
                )
                .await?;
            }
            tx.commit().await?;
            if sweep {
                client
                    .execute(
                        "DELETE FROM rate_buckets
                         WHERE tokens + extract(epoch FROM clock_timestamp() - at)::float8 * per_second >= burst",
                        &[],
                    )
                    .await?;
            }
            Ok(Ok(()))
        });
        match taken {
            Ok(Ok(())) => Ok(Ok(())),
            Ok(Err((rate, wait))) => Ok(Err(Refused { rate, retry_after: Duration::from_secs_f64(wait.max(0.0)) })),
            Err(e) => Err(e),
        }
    }
}

/// Rate limits are a policy of the call pipeline: a call over its rate is refused with how long
/// to wait. Agents' prompts are counted under the agent's name like tools under theirs.
impl super::policy::Policy for Rules {
    fn check(
        &self,
        call: &super::Admitted,
        options: &super::CallOptions,
    ) -> Result<Option<super::policy::Hold>, super::CallError> {
        if self.is_empty() {
            return Ok(None);
        }
        let caller = options.principal.as_deref().map(super::Principal::name).unwrap_or("");
        self.take(&call.name, caller)
            .map_err(|e| {
                super::CallError::Unavailable(format!(
                    "tool '{}' has a rate limit, which cannot be checked without the shared database: {e}",
                    call.name
                ))
            })?
            .map_err(|refused| super::CallError::RateLimited {
                tool: call.name.clone(),
                rate: refused.rate,
                retry_after: refused.retry_after,
            })?;
        Ok(None)
    }

    fn blocks(&self, call: &super::Admitted) -> bool {
        self.waits_on_database(&call.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_with_their_errors() {
        assert_eq!(Rate::parse("10/min", None).unwrap().per_second, 10.0 / 60.0);
        assert_eq!(Rate::parse("2/s", Some(5)).unwrap().burst, 5.0);
        assert!(Rate::parse("10 per minute", None).unwrap_err().contains("for example \"10/min\""));
        assert!(Rate::parse("0/min", None).unwrap_err().contains("allows no call"));
        assert!(Rate::parse("3/week", None).is_err());
        assert!(Rate::parse("3/min", Some(0)).unwrap_err().contains("burst 0"));
    }

    fn rule(key: &str, text: &str, burst: Option<u64>) -> Rule {
        Rule { key: key.into(), covers: Covers::Tool("t".into()), rate: Rate::parse(text, burst).unwrap() }
    }

    #[test]
    fn a_bucket_allows_its_burst_then_refills_at_the_rate() {
        let b = Buckets::default();
        let r = rule("burst-test", "60/min", Some(2));
        let t0 = Instant::now();
        assert!(take_all(&b, &[&r], "t", "a", t0).is_ok());
        assert!(take_all(&b, &[&r], "t", "a", t0).is_ok());
        let wait = take_all(&b, &[&r], "t", "a", t0).unwrap_err().retry_after;
        assert!((wait.as_secs_f64() - 1.0).abs() < 0.01, "{wait:?}");
        // Another caller has its own bucket.
        assert!(take_all(&b, &[&r], "t", "b", t0).is_ok());
        // One second later, one call is back.
        assert!(take_all(&b, &[&r], "t", "a", t0 + Duration::from_millis(1000)).is_ok());
        assert!(take_all(&b, &[&r], "t", "a", t0 + Duration::from_millis(1000)).is_err());
    }

    fn shared_rules(pg: &Pg, rules: Vec<Rule>) -> Rules {
        Rules { rules, buckets: std::sync::Arc::new(Buckets::shared(pg.clone())) }
    }

    #[test]
    fn a_limit_in_the_shared_database_holds_across_replicas() {
        let Some(db) = crate::db::testing::database() else { return };
        let pg = db.pg();
        let migrating = pg.clone();
        crate::db::block(async move { crate::db::migrate::pg(&migrating, &[&PG]).await }).unwrap();
        // Three replicas, each with buckets of its own in memory but one table: twenty calls
        // at once against a burst of five let exactly five through.
        let replicas: Vec<Rules> =
            (0..3).map(|_| shared_rules(&db.pg(), vec![rule("shared-burst", "1/hour", Some(5))])).collect();
        let through: usize = std::thread::scope(|s| {
            let calls: Vec<_> = (0..20)
                .map(|i| {
                    let rules = &replicas[i % 3];
                    s.spawn(move || rules.take("t", "ci").unwrap().is_ok())
                })
                .collect();
            calls.into_iter().map(|c| c.join().unwrap()).filter(|ok| *ok).count()
        });
        assert_eq!(through, 5);
        let refused = replicas[0].take("t", "ci").unwrap().unwrap_err();
        assert_eq!(refused.rate, "1/hour");
        assert!(refused.retry_after > Duration::from_secs(3000), "{:?}", refused.retry_after);
        // Another caller has buckets of its own; a refusing rule takes nothing from the others.
        let both = shared_rules(&pg, vec![rule("shared-burst", "1/hour", Some(5)), rule("wide", "100/min", None)]);
        assert!(both.take("t", "ci").unwrap().is_err());
        let wide = shared_rules(&pg, vec![rule("wide", "100/min", None)]);
        for _ in 0..100 {
            assert!(wide.take("t", "ci").unwrap().is_ok());
        }
        assert!(wide.take("t", "ci").unwrap().is_err(), "the refused call took none of wide's hundred");
        assert!(replicas[1].take("t", "someone-else").unwrap().is_ok());
    }

    #[test]
    fn a_refusing_rule_takes_nothing_from_the_others() {
        let b = Buckets::default();
        let wide = rule("all-or-none-wide", "100/min", None);
        let narrow = rule("all-or-none-narrow", "1/hour", None);
        let t0 = Instant::now();
        assert!(take_all(&b, &[&wide, &narrow], "t", "a", t0).is_ok());
        for _ in 0..5 {
            let refused = take_all(&b, &[&wide, &narrow], "t", "a", t0).unwrap_err();
            assert_eq!(refused.rate, "1/hour");
        }
        // Only the first call came out of the wide rule's 100.
        for _ in 0..99 {
            assert!(take_all(&b, &[&wide], "t", "a", t0).is_ok());
        }
        assert!(take_all(&b, &[&wide], "t", "a", t0).is_err());
    }
}
