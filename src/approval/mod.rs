//! Approval of tool calls: which calls wait for a person, and the one check the call path
//! makes before such a call runs.
//!
//! A call that needs approval and carries no token does not run: it records a pending approval
//! and fails with [`CallError::ApprovalRequired`], which holds an id (for the person) and a
//! token (for the caller). Once a person approves the id (`ctx approvals approve`, REST
//! `/approvals`, or an MCP client's elicitation), the caller sends the same call again with
//! the token, and it runs once. The token is bound to the tool, the parameters and the caller,
//! and expires. Anything else fails closed: no approval, nothing runs.

pub mod store;

use std::path::PathBuf;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use crate::config::Config;
pub use crate::contract::approval::{Pending, PARAM};
use crate::contract::{CallError, ToolSpec};
pub use store::Store;

/// Pending approvals one caller may hold at once: a client cannot fill the store.
const MAX_PENDING: i64 = 100;

/// The largest parameters (canonical JSON) a call that needs approval may have: a person reads
/// them whole before deciding.
pub const MAX_PARAMS_BYTES: usize = 16 * 1024;

/// Which tools need approval under one config.
pub struct Policy {
    globs: GlobSet,
    destructive: bool,
    /// Lua tools whose section says `approve = true`, by section name.
    sections: Vec<String>,
    /// Upstream servers with `approve`: the server, and its tool globs (`None`: every tool).
    servers: Vec<(String, Option<GlobSet>)>,
    /// Code mode's list of destructive tools, which `destructive = true` covers too.
    destructive_globs: GlobSet,
    pub ttl: std::time::Duration,
    /// An inner call of a script waits for the decision instead of failing.
    pub wait_in_scripts: bool,
    /// MCP clients that can ask their user (elicitation) are asked.
    pub ask_clients: bool,
    /// What a REST request must show (`Ctx-Approver`) to approve or deny; none: only the CLI.
    pub approver_token: Option<String>,
    pub store: Store,
    question_key: std::sync::Arc<[u8]>,
}

fn globs(patterns: impl IntoIterator<Item = String>) -> GlobSet {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        if let Ok(glob) = Glob::new(&pattern) {
            builder.add(glob);
        }
    }
    builder.build().unwrap_or_else(|_| GlobSet::empty())
}

impl Policy {
    /// `question_key` signs the questions this application asks clients (see
    /// [`Policy::question_state`]).
    pub fn from_config(
        config: &Config,
        question_key: std::sync::Arc<[u8]>,
        shared: Option<&crate::db::Shared>,
    ) -> Policy {
        let spec = &config.spec.approval;
        let sections = config
            .spec
            .tools
            .script
            .iter()
            .filter(|(_, s)| s.approve)
            .map(|(name, _)| name.as_str().to_string())
            .collect();
        let servers = config
            .spec
            .mcp
            .servers
            .iter()
            .filter_map(|(name, server)| {
                let approve = serde_json::to_value(&server.approve).ok()?;
                match approve {
                    Json::Bool(true) => Some((name.to_string(), None)),
                    Json::Array(items) => {
                        let patterns = items.into_iter().filter_map(|i| i.as_str().map(str::to_string));
                        Some((name.to_string(), Some(globs(patterns))))
                    }
                    _ => None,
                }
            })
            .collect();
        Policy {
            globs: globs(spec.tools.iter().map(|t| t.to_string())),
            destructive: spec.destructive,
            sections,
            servers,
            destructive_globs: config.code_mode.destructive_set(),
            ttl: std::time::Duration::from_secs(spec.ttl_secs),
            wait_in_scripts: spec.in_scripts == crate::types::ApprovalConfigInScripts::Wait,
            ask_clients: spec.ask_clients,
            approver_token: spec.approver_token.as_ref().map(|t| t.to_string()),
            store: store_for(config, shared),
            question_key,
        }
    }

    /// Whether every tool of upstream server `server` needs approval: the server says `approve =
    /// true`, or an `[approval] tools` glob matches all its names (`server__*`, `*`).
    pub fn covers_server(&self, server: &str) -> bool {
        self.servers.iter().any(|(name, tools)| name == server && tools.is_none())
            || (!self.globs.is_empty() && self.globs.is_match(format!("{server}__*")))
    }

    /// Whether calls of the tool `spec` need approval.
    pub fn needs(&self, spec: &ToolSpec) -> bool {
        // Every call asks this; with nothing configured it costs no glob match.
        if !self.globs.is_empty() && self.globs.is_match(&spec.name) {
            return true;
        }
        if spec.approve || spec.section.as_ref().is_some_and(|s| self.sections.contains(s)) {
            return true;
        }
        if let Some(origin) = &spec.upstream {
            let server = self.servers.iter().find(|(name, _)| *name == origin.server);
            if server.is_some_and(|(_, tools)| tools.as_ref().is_none_or(|g| g.is_match(&origin.tool))) {
                return true;
            }
        }
        let annotated = spec.annotations.as_ref().and_then(|a| a.destructive).unwrap_or(false);
        self.destructive && (annotated || self.destructive_globs.is_match(&spec.name))
    }

    /// The check before a call of `tool` with `params` (after defaults) for `caller` runs:
    /// `Ok` with the id of the approval its token holds when that is approved, fresh, unused
    /// and bound to exactly this call ([`Policy::consume`] uses it up when the call runs); else
    /// the call does not run.
    pub fn check(
        &self,
        tool: &str,
        params: &Json,
        caller: &str,
        via: &str,
        token: Option<&str>,
    ) -> Result<String, CallError> {
        let canonical = canonical(params);
        if canonical.len() > MAX_PARAMS_BYTES {
            return Err(CallError::ApprovalRefused(format!(
                "tool '{tool}' did not run: it needs approval, and its parameters are {} bytes, more than the {MAX_PARAMS_BYTES} a person can be asked to read; send less",
                canonical.len()
            )));
        }
        let unavailable = |e: String| {
            tracing::error!("approvals: {e}");
            CallError::Unavailable(format!(
                "tool '{tool}' needs approval, and the approvals store cannot be used right now (the server log has the details); nothing ran"
            ))
        };
        let Some(token) = token else {
            return Err(self.ask(tool, &canonical, caller, via).map_err(unavailable)?);
        };
        let refused = |why: String| CallError::ApprovalRefused(format!("tool '{tool}' did not run: {why}"));
        let Some(row) = self.store.by_token(&hash(token)).map_err(unavailable)? else {
            return Err(refused(
                "the approval token is not known (it was never issued, or 16 newer ones were issued for the same call since); call again without it to ask for approval".into(),
            ));
        };
        if row.tool != tool {
            return Err(refused(format!("the approval token was issued for tool '{}'", row.tool)));
        }
        if row.caller != caller {
            return Err(refused("the approval token was issued to another caller".into()));
        }
        if row.params != canonical {
            return Err(refused(format!(
                "the approval token was issued for other parameters ({}); an approval covers exactly the call that asked",
                cut(&row.params, 300)
            )));
        }
        if row.expires_ms <= store::now_ms() && matches!(row.state.as_str(), "pending" | "approved") {
            return Err(refused(format!(
                "approval {} expired ([approval] ttl_secs); call again without the token to ask anew",
                row.id
            )));
        }
        match row.state.as_str() {
            "approved" => Ok(row.id),
            "pending" => Err(CallError::ApprovalRequired(Box::new(Pending {
                approval: row.approval(),
                token: token.to_string(),
            }))),
            "denied" => {
                let reason = row.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
                let by = row.decided_by.as_deref().unwrap_or("a person");
                Err(refused(format!("approval {} was denied by {by}{reason}", row.id)))
            }
            "used" => Err(refused(format!("approval {} was used already; each approval runs one call", row.id))),
            _ => Err(refused(format!("approval {} expired; call again without the token to ask anew", row.id))),
        }
    }

    /// Uses up approval `id` as its call runs: once only, also against a call running at the
    /// same moment with the same token.
    pub fn consume(&self, tool: &str, id: &str) -> Result<(), CallError> {
        match self.store.consume(id) {
            Ok(true) => Ok(()),
            Ok(false) => Err(CallError::ApprovalRefused(format!(
                "tool '{tool}' did not run: approval {id} was used already (or expired); each approval runs one call"
            ))),
            Err(e) => {
                tracing::error!("approvals: {e}");
                Err(CallError::Unavailable(format!(
                    "tool '{tool}' needs approval, and the approvals store cannot be used right now; nothing ran"
                )))
            }
        }
    }

    /// The request state of the 2026-era question about `pending`: its token and a MAC that
    /// only this process can make, so an answer is accepted only from a client that was asked
    /// (holding the token is not enough: a REST caller has it too).
    pub fn question_state(&self, pending: &Pending) -> String {
        format!("{}.{}", pending.token, self.mac(&pending.token))
    }

    /// The token of a question's request state, when this process asked it.
    pub fn asked(&self, state: &str) -> Option<String> {
        let (token, mac) = state.rsplit_once('.')?;
        let expected = self.mac(token);
        let same = mac.len() == expected.len()
            && mac.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        same.then(|| token.to_string())
    }

    fn mac(&self, token: &str) -> String {
        use hmac::{KeyInit, Mac};
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.question_key).expect("any key length");
        mac.update(b"ctx approval question\0");
        mac.update(token.as_bytes());
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Records the answer of the user whom a call's own client asked (MCP elicitation) for
    /// the approval of `token`; only that approval's caller can answer for it. Returns the
    /// approval. A decision made meanwhile elsewhere stands: the token check of the call that
    /// follows says what holds.
    pub fn decide_for(&self, token: &str, caller: &str, approve: bool, by: &str) -> Result<Pending, CallError> {
        let unavailable = |e: String| {
            tracing::error!("approvals: {e}");
            CallError::Unavailable("the approvals store cannot be used right now; nothing ran".into())
        };
        let refused = |why: &str| CallError::ApprovalRefused(format!("the call did not run: {why}"));
        let Some(row) = self.store.by_token(&hash(token)).map_err(unavailable)? else {
            return Err(refused("the approval it answers is not known (it was never issued, or it was removed)"));
        };
        if row.caller != caller {
            return Err(refused("the approval it answers belongs to another caller"));
        }
        let reason = (!approve).then_some("declined when asked");
        if let Err(state) = self.store.decide(&row.id, approve, by, reason).map_err(unavailable)? {
            tracing::info!("approval {}: the answer over MCP came when it was {state:?}; that stands", row.id);
        }
        Ok(Pending { approval: row.approval(), token: token.to_string() })
    }

    /// Records a pending approval of this call: the error that says so.
    fn ask(&self, tool: &str, canonical: &str, caller: &str, via: &str) -> Result<CallError, String> {
        let token = random_hex(32);
        let now = store::now_ms();
        let row = store::Row {
            id: format!("ap-{}", random_hex(6)),
            token_hash: hash(&token),
            tool: tool.to_string(),
            params: canonical.to_string(),
            caller: caller.to_string(),
            via: via.to_string(),
            state: "pending".into(),
            created_ms: now,
            expires_ms: now + self.ttl.as_millis() as i64,
            decided_ms: None,
            decided_by: None,
            reason: None,
        };
        match self.store.ask(&row, MAX_PENDING)? {
            Ok(id) => {
                let row = self.store.by_id(&id)?.ok_or("the approval vanished")?;
                Ok(CallError::ApprovalRequired(Box::new(Pending { approval: row.approval(), token })))
            }
            Err(pending) => Ok(CallError::ApprovalRefused(format!(
                "tool '{tool}' did not run: this caller already has {pending} calls waiting for approval; wait until a person decides some"
            ))),
        }
    }
}

/// The approvals of `config`: the shared database's when there is one, else the file's.
pub fn store_for(config: &Config, shared: Option<&crate::db::Shared>) -> Store {
    match shared {
        Some(shared) => Store::shared(shared.pg.clone()),
        None => Store::new(store_path(config)),
    }
}

/// Where the approvals of `config` are kept without a shared database.
pub fn store_path(config: &Config) -> PathBuf {
    config.db_path().with_file_name("approvals.sqlite")
}

/// Parameters as one canonical text: keys sorted at every depth, so the same call matches
/// whatever order its keys came in.
pub fn canonical(value: &Json) -> String {
    fn sorted(value: &Json) -> Json {
        match value {
            Json::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Json::Object(keys.into_iter().map(|k| (k.clone(), sorted(&map[k]))).collect())
            }
            Json::Array(items) => Json::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

fn hash(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `n` random bytes as hex, from the operating system's generator.
pub fn random_hex(n: usize) -> String {
    let mut bytes = Vec::with_capacity(n);
    while bytes.len() < n {
        bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    }
    bytes[..n].iter().map(|b| format!("{b:02x}")).collect()
}

fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_parameters_ignore_key_order() {
        assert_eq!(
            canonical(&json!({"b": 1, "a": {"d": 2, "c": [3]}})),
            canonical(&json!({"a": {"c": [3], "d": 2}, "b": 1}))
        );
        assert_ne!(canonical(&json!({"a": 1})), canonical(&json!({"a": 2})));
    }

    fn policy(store: Store) -> Policy {
        Policy {
            globs: globs(["deploy".to_string()]),
            destructive: false,
            sections: Vec::new(),
            servers: Vec::new(),
            destructive_globs: GlobSet::empty(),
            ttl: std::time::Duration::from_secs(600),
            wait_in_scripts: true,
            ask_clients: false,
            approver_token: None,
            store,
            question_key: random_hex(32).into_bytes().into(),
        }
    }

    fn pending(result: Result<String, CallError>) -> Pending {
        match result {
            Err(CallError::ApprovalRequired(pending)) => *pending,
            other => panic!("expected a pending approval, got {other:?}"),
        }
    }

    #[test]
    fn the_same_call_asked_twice_shares_one_approval_and_both_tokens_work_once() {
        store::each_backend(|store, _| {
            let policy = policy(store);
            let params = json!({"env": "prod"});
            // Two identical calls (two inner calls of scripts waiting for the decision) ask.
            let first = pending(policy.check("deploy", &params, "ci", "code", None));
            let second = pending(policy.check("deploy", &params, "ci", "code", None));
            assert_eq!(first.approval.id, second.approval.id, "one approval for one call");
            assert_ne!(first.token, second.token);
            // Still pending: each token says so.
            pending(policy.check("deploy", &params, "ci", "code", Some(&first.token)));
            assert!(policy.store.decide(&first.approval.id, true, "a person", None).unwrap().is_ok());
            // The earlier token was not replaced: it runs the call, once.
            let id = policy.check("deploy", &params, "ci", "code", Some(&first.token)).unwrap();
            policy.consume("deploy", &id).unwrap();
            let again = policy.check("deploy", &params, "ci", "code", Some(&second.token)).unwrap_err();
            assert!(again.to_string().contains("was used already"), "{again}");
        });
    }

    #[test]
    fn a_call_asked_again_and_again_keeps_only_its_newest_tokens() {
        store::each_backend(|store, _| {
            let policy = policy(store);
            let params = json!({"env": "prod"});
            let tokens: Vec<String> = (0..=store::TOKENS_PER_APPROVAL)
                .map(|_| pending(policy.check("deploy", &params, "ci", "rest", None)).token)
                .collect();
            let oldest = policy.check("deploy", &params, "ci", "rest", Some(&tokens[0])).unwrap_err();
            assert!(oldest.to_string().contains("is not known"), "{oldest}");
            pending(policy.check("deploy", &params, "ci", "rest", Some(&tokens[1])));
            pending(policy.check("deploy", &params, "ci", "rest", Some(tokens.last().unwrap())));
        });
    }

    #[test]
    fn tokens_are_long_random_hex() {
        let (a, b) = (random_hex(32), random_hex(32));
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
