//! MCP sessions (2025-era Streamable HTTP clients, `Mcp-Session-Id`): a cap on how many are open
//! at once, a share of it per scoped token, and an idle expiry, over rmcp's in-memory session
//! manager.
//!
//! rmcp creates a session without knowing who asked, so the share is kept by the direct route
//! (`direct.rs`), which sees the caller: it reserves a place before forwarding an `initialize`
//! and records the session id the answer carries. The unscoped token has no share (it can
//! call every tool, and on a server without tokens it is every client); scoped tokens together
//! may hold the cap less an eighth, so it can always open a session.
//!
//! rmcp removes a session from its table when the client sends DELETE and when the session's
//! worker ends (idle expiry included), and ends the session's tasks with it; ctx keeps no
//! per-session task of its own (list changes go out from one notifier, see `notify.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_core::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId, SessionManager};
use rmcp::transport::WorkerTransport;

/// How many sessions may be open, how many of them one scoped token may hold, and how long one
/// may sit idle.
#[derive(Clone, Copy, Debug)]
pub struct SessionLimits {
    pub max_sessions: usize,
    /// `None`: a quarter of `max_sessions`.
    pub per_token: Option<usize>,
    pub idle: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits { max_sessions: 256, per_token: None, idle: SessionConfig::DEFAULT_KEEP_ALIVE }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error(
        "ctx already has {0} MCP sessions open (server.max_mcp_sessions): close sessions you no longer use \
         (HTTP DELETE /mcp with their Mcp-Session-Id) or wait for idle ones to expire, then initialize again"
    )]
    Full(usize),
    #[error(
        "token {token:?} already has {held} MCP sessions open, its share (server.max_mcp_sessions_per_token = {share}): \
         close sessions it no longer uses (HTTP DELETE /mcp with their Mcp-Session-Id) or wait for idle ones to expire \
         (after {idle_secs} s without a message, server.mcp_session_idle_secs), or raise server.max_mcp_sessions_per_token"
    )]
    TokenFull { token: String, held: usize, share: usize, idle_secs: u64 },
    #[error(
        "the scoped tokens together already have {held} MCP sessions open, all they may hold: the last eighth of \
         server.max_mcp_sessions ({max}) is kept for the auth_token. Close sessions no longer used (HTTP DELETE /mcp \
         with their Mcp-Session-Id) or wait for idle ones to expire (after {idle_secs} s without a message, \
         server.mcp_session_idle_secs), or raise server.max_mcp_sessions"
    )]
    ScopedFull { held: usize, max: usize, idle_secs: u64 },
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// rmcp's [`LocalSessionManager`] with a cap. Shared by the rmcp service and the direct route,
/// which refuses an `initialize` over the cap before rmcp would turn the refusal into a 500.
#[derive(Debug)]
pub struct Sessions {
    local: LocalSessionManager,
    max_sessions: usize,
    /// Sessions one scoped token may hold.
    per_token: usize,
    /// Sessions all scoped tokens together may hold.
    scoped: usize,
    idle: Duration,
    /// Held from the count to the insert, so concurrent initializes cannot overshoot the cap.
    creating: tokio::sync::Mutex<()>,
    owners: Mutex<Owners>,
}

/// Which scoped token opened each session, and the places reserved by initializes under way.
#[derive(Debug, Default)]
struct Owners {
    sessions: HashMap<SessionId, String>,
    pending: HashMap<String, usize>,
}

impl Owners {
    fn held(&self, token: &str) -> usize {
        self.sessions.values().filter(|t| *t == token).count() + self.pending.get(token).copied().unwrap_or(0)
    }

    fn held_by_all(&self) -> usize {
        self.sessions.len() + self.pending.values().sum::<usize>()
    }
}

/// A place in a scoped token's share, taken before its `initialize` goes to rmcp: [`commit`]
/// it with the session id of the answer, or drop it (no session was opened) to give it back.
///
/// [`commit`]: Reservation::commit
#[derive(Debug)]
pub struct Reservation {
    sessions: Arc<Sessions>,
    token: String,
}

impl Reservation {
    pub fn commit(self, id: &str) {
        self.sessions.owners().sessions.insert(SessionId::from(id), self.token.clone());
        // Dropping `self` now gives the pending place back: the session holds it instead.
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut owners = self.sessions.owners();
        if let Some(n) = owners.pending.get_mut(&self.token) {
            *n -= 1;
            if *n == 0 {
                owners.pending.remove(&self.token);
            }
        }
    }
}

impl Sessions {
    pub fn new(limits: SessionLimits) -> Sessions {
        let mut local = LocalSessionManager::default();
        local.session_config.keep_alive = Some(limits.idle);
        let max_sessions = limits.max_sessions.max(1);
        Sessions {
            local,
            max_sessions,
            per_token: limits.per_token.unwrap_or(max_sessions / 4).clamp(1, max_sessions),
            scoped: (max_sessions - max_sessions / 8).max(1),
            idle: limits.idle,
            creating: Default::default(),
            owners: Default::default(),
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, Owners> {
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place in `token`'s share for a new session, or says why there is none.
    pub async fn reserve(self: &Arc<Self>, token: &str) -> Result<Reservation, SessionsError> {
        let live = self.local.sessions.read().await;
        let mut owners = self.owners();
        // Sessions that expired or ended since (rmcp drops them from its table) hold no place.
        owners.sessions.retain(|id, _| live.contains_key(id));
        drop(live);
        let idle_secs = self.idle.as_secs();
        let held = owners.held(token);
        if held >= self.per_token {
            return Err(SessionsError::TokenFull { token: token.to_string(), held, share: self.per_token, idle_secs });
        }
        let all = owners.held_by_all();
        if all >= self.scoped {
            return Err(SessionsError::ScopedFull { held: all, max: self.max_sessions, idle_secs });
        }
        *owners.pending.entry(token.to_string()).or_default() += 1;
        Ok(Reservation { sessions: Arc::clone(self), token: token.to_string() })
    }

    /// Whether a request of `token` (a scoped token's name; `None` for the unscoped token) may
    /// use session `id`: a scoped token only its own sessions, so knowing another caller's session
    /// id does not let it read that session's stream or close it.
    pub fn may_use(&self, id: &str, token: Option<&str>) -> bool {
        let Some(token) = token else { return true };
        self.owners().sessions.get(&SessionId::from(id)).is_some_and(|owner| owner == token)
    }

    /// Sessions open now.
    pub async fn count(&self) -> usize {
        self.local.sessions.read().await.len()
    }

    pub fn max_sessions(&self) -> usize {
        self.max_sessions
    }

    /// True when a new session would be refused.
    pub async fn full(&self) -> bool {
        self.count().await >= self.max_sessions
    }
}

impl SessionManager for Sessions {
    type Error = SessionsError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let _creating = self.creating.lock().await;
        if self.count().await >= self.max_sessions {
            return Err(SessionsError::Full(self.max_sessions));
        }
        Ok(self.local.create_session().await?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.local.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.local.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.owners().sessions.remove(id);
        Ok(self.local.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.local.create_stream(id, message).await?)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        Ok(self.local.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.local.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.local.resume(id, last_event_id).await?)
    }
}

/// Shared handle: the rmcp service holds one, the direct route and `/health` another.
pub type SharedSessions = Arc<Sessions>;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_token_holds_its_reservations_and_sessions_and_gives_back_what_opens_nothing() {
        let limits = SessionLimits { max_sessions: 8, per_token: None, idle: Duration::from_secs(60) };
        let sessions = Arc::new(Sessions::new(limits));
        assert_eq!((sessions.per_token, sessions.scoped), (2, 7), "a quarter each, an eighth kept back");
        let first = sessions.reserve("reader").await.expect("a first place");
        let second = sessions.reserve("reader").await.expect("a second place");
        let refused = sessions.reserve("reader").await.expect_err("reservations under way count");
        assert!(matches!(refused, SessionsError::TokenFull { held: 2, share: 2, .. }), "{refused}");
        assert!(refused.to_string().contains("server.mcp_session_idle_secs"), "{refused}");
        sessions.reserve("writer").await.expect("another token has its own share");
        drop(second);
        let third = sessions.reserve("reader").await.expect("an initialize that opened nothing gives its place back");
        // A committed session that rmcp does not know (it expired, or never opened) holds nothing.
        first.commit("gone");
        sessions.reserve("reader").await.expect("a session rmcp no longer has frees its place");
        drop(third);
    }
}
