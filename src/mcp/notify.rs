//! `list_changed` notifications for session-era (2025-11-25) clients: one task tells every open
//! session, instead of one task per session. A per-session task only noticed that its session
//! had closed at the next list change, so every closed session left a task behind until then.

use std::sync::{Arc, Mutex, Once, PoisonError, Weak};
use std::time::Duration;

use rmcp::{Peer, RoleServer};
use tokio::sync::broadcast;

use super::Changed;

/// How often closed sessions are dropped from the list when nothing else happens.
const SWEEP: Duration = Duration::from_secs(30);
/// A client that does not read its stream cannot hold up the notices to the others.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// The open sessions that want `list_changed`, and each by its session id (for the task
/// status notices of the 2025 era, see `super::tasks`).
pub struct SessionPeers {
    peers: Mutex<Vec<(Option<String>, Peer<RoleServer>)>>,
    notifier: Once,
}

impl Default for SessionPeers {
    fn default() -> Self {
        SessionPeers { peers: Mutex::new(Vec::new()), notifier: Once::new() }
    }
}

impl SessionPeers {
    /// Adds a session that just finished its handshake (`session`: its `Mcp-Session-Id`, over
    /// HTTP); starts the notifier on first use (inside the runtime, where rmcp calls
    /// `on_initialized`).
    pub fn add(
        self: &Arc<Self>,
        session: Option<String>,
        peer: Peer<RoleServer>,
        changed: &broadcast::Sender<Changed>,
    ) {
        {
            let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
            peers.retain(|(_, p)| !p.is_transport_closed());
            peers.push((session, peer));
        }
        self.notifier.call_once(|| {
            tokio::spawn(notifier(Arc::downgrade(self), changed.subscribe()));
        });
    }

    /// The sessions still open; closed ones are dropped from the list.
    fn live(&self) -> Vec<Peer<RoleServer>> {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers.retain(|(_, p)| !p.is_transport_closed());
        peers.iter().map(|(_, p)| p.clone()).collect()
    }

    /// The open session `id`.
    pub fn session(&self, id: &str) -> Option<Peer<RoleServer>> {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers.iter().find(|(s, p)| s.as_deref() == Some(id) && !p.is_transport_closed()).map(|(_, p)| p.clone())
    }
}

/// Ends when the [`super::Mcp`] that owns the list is dropped (the broadcast closes).
async fn notifier(peers: Weak<SessionPeers>, mut changed: broadcast::Receiver<Changed>) {
    let mut sweep = tokio::time::interval(SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let lists = tokio::select! {
            received = changed.recv() => match received {
                Ok(lists) => Some(lists),
                Err(broadcast::error::RecvError::Lagged(_)) => Some(Changed { tools: true, prompts: true, resources: true }),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = sweep.tick() => None,
        };
        let Some(live) = peers.upgrade().map(|p| p.live()) else { return };
        let Some(lists) = lists else { continue };
        for peer in live {
            let _ = tokio::time::timeout(NOTIFY_TIMEOUT, async {
                if lists.tools {
                    peer.notify_tool_list_changed().await?;
                }
                if lists.prompts {
                    peer.notify_prompt_list_changed().await?;
                }
                if lists.resources {
                    peer.notify_resource_list_changed().await?;
                }
                Ok::<(), rmcp::service::ServiceError>(())
            })
            .await;
        }
    }
}
