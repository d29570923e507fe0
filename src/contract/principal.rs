//! Who a call is made for: the named token a client authenticated with, and the tools it may
//! see and call.
//!
//! A call without a principal is unscoped: the CLI, a server without tokens, or the single
//! `server.auth_token`. Inner calls (`context.call`, code mode) carry their parent's principal,
//! so a script never reaches a tool its caller could not.

use globset::{Glob, GlobSet, GlobSetBuilder};

/// A named caller and the globs of the tools it may use.
#[derive(Debug)]
pub struct Principal {
    name: String,
    patterns: Vec<String>,
    tools: GlobSet,
    /// Its MCP client may approve its own calls when asked (`approve_own_calls`).
    approves_own_calls: bool,
}

impl Principal {
    /// A principal allowed the tools matching any of `patterns` (`*`, `jira_*`, `search`).
    pub fn new(name: &str, patterns: &[String]) -> Result<Principal, String> {
        let mut builder = GlobSetBuilder::new();
        for pattern in patterns {
            let glob = Glob::new(pattern).map_err(|e| format!("tool pattern {pattern:?} is not a valid glob: {e}"))?;
            builder.add(glob);
        }
        let tools = builder.build().map_err(|e| format!("tool patterns: {e}"))?;
        Ok(Principal { name: name.to_string(), patterns: patterns.to_vec(), tools, approves_own_calls: false })
    }

    /// Lets its MCP client approve its own calls when ctx asks (`approve_own_calls = true`).
    pub fn approving_own_calls(mut self, yes: bool) -> Principal {
        self.approves_own_calls = yes;
        self
    }

    /// Whether its client may answer ctx's approval questions about its own calls.
    pub fn approves_own_calls(&self) -> bool {
        self.approves_own_calls
    }

    /// The token's name, as logs, rate limits and approvals show it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The globs it was given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether it may see and call `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        self.tools.is_match(tool)
    }
}

/// Whether an optional principal may use `tool` (no principal: every tool).
pub fn allows(principal: Option<&Principal>, tool: &str) -> bool {
    principal.is_none_or(|p| p.allows(tool))
}

/// Whom an authorized request's calls are made for: the principal of its scoped token, or
/// `None` (auth_token, or a server without tokens): every tool. The server's guard sets it as a
/// request extension; REST and MCP read it.
#[derive(Clone, Debug, Default)]
pub struct Caller(pub Option<std::sync::Arc<Principal>>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_scope_the_tools() {
        let p = Principal::new("ci", &["search".to_string(), "jira_*".to_string()]).unwrap();
        assert!(p.allows("search") && p.allows("jira_create"));
        assert!(!p.allows("get") && !p.allows("deploy"));
        assert!(allows(None, "deploy"));
        assert!(!allows(Some(&p), "deploy"));
        assert!(Principal::new("bad", &["[".to_string()]).unwrap_err().contains("not a valid glob"));
    }
}
