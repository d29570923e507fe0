//! MCP sessions (2025-era Streamable HTTP clients, `Mcp-Session-Id`): a cap on how many are open
//! at once and an idle expiry, over rmcp's in-memory session manager.
//!
//! rmcp removes a session from its table when the client sends DELETE and when the session's
//! worker ends (idle expiry included), and ends the session's tasks with it; ctx keeps no
//! per-session task of its own (list changes go out from one notifier, see `notify.rs`).

use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId, SessionManager};
use rmcp::transport::WorkerTransport;

/// How many sessions may be open and how long one may sit idle.
#[derive(Clone, Copy, Debug)]
pub struct SessionLimits {
    pub max_sessions: usize,
    pub idle: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits { max_sessions: 256, idle: SessionConfig::DEFAULT_KEEP_ALIVE }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error(
        "ctx already has {0} MCP sessions open (server.max_mcp_sessions): close sessions you no longer use \
         (HTTP DELETE /mcp with their Mcp-Session-Id) or wait for idle ones to expire, then initialize again"
    )]
    Full(usize),
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// rmcp's [`LocalSessionManager`] with a cap. Shared by the rmcp service and the direct route,
/// which refuses an `initialize` over the cap before rmcp would turn the refusal into a 500.
#[derive(Debug)]
pub struct Sessions {
    local: LocalSessionManager,
    max_sessions: usize,
    /// Held from the count to the insert, so concurrent initializes cannot overshoot the cap.
    creating: tokio::sync::Mutex<()>,
}

impl Sessions {
    pub fn new(limits: SessionLimits) -> Sessions {
        let mut local = LocalSessionManager::default();
        local.session_config.keep_alive = Some(limits.idle);
        Sessions { local, max_sessions: limits.max_sessions.max(1), creating: Default::default() }
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
