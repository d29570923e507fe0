//! What every call of one application shares, whichever registry snapshot it runs on: the call
//! log, the metrics, the rate buckets, the quarantine of stuck runs, code mode's running
//! scripts and the key of approval questions. Built once with the application's first registry
//! and handed on to every snapshot a reload or a relist makes; two applications in one process
//! share none of it.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

/// The state of one application's calls.
pub struct CallState {
    pub log: crate::calllog::CallLog,
    pub metrics: crate::metrics::Metrics,
    pub rates: Arc<super::rate::Buckets>,
    pub quarantine: Arc<super::stuck::Quarantine>,
    pub scripts: ScriptRuns,
    /// Calls running as tasks, and the store of every task (installed by a server).
    pub tasks: crate::tasks::Tasks,
    /// The key of approval questions' MACs: random, so only this application accepts an answer
    /// to a question it asked; on a shared database, one for every replica.
    pub question_key: Arc<[u8]>,
    /// The database replicas share, when `[db] url` names one.
    pub db: Option<crate::db::Shared>,
}

impl Default for CallState {
    fn default() -> CallState {
        CallState {
            log: Default::default(),
            metrics: Default::default(),
            rates: Default::default(),
            quarantine: Default::default(),
            scripts: Default::default(),
            tasks: Default::default(),
            question_key: crate::approval::random_hex(32).into_bytes().into(),
            db: None,
        }
    }
}

impl CallState {
    /// The state of an application on `db`: its rate buckets are the database's, and so is its
    /// approval questions' key, so a question asked through one replica is answered through any.
    /// Should the key not be readable now, this replica answers only its own questions (said in
    /// the log); its rate limits are shared whatever happens.
    pub fn on(db: Option<crate::db::Shared>) -> CallState {
        let mut state = CallState::default();
        if let Some(shared) = &db {
            state.rates = Arc::new(super::rate::Buckets::shared(shared.pg.clone()));
            let store = crate::approval::Store::shared(shared.pg.clone());
            match store.shared_question_key(&crate::approval::random_hex(32)) {
                Ok(Some(key)) => state.question_key = key.into_bytes().into(),
                Ok(None) => {}
                Err(e) => tracing::error!("the shared approval question key: {e}"),
            }
        }
        state.db = db;
        state
    }
}

/// Code mode's scripts running now: in all, and per scoped token (see `code::run`).
#[derive(Default)]
pub struct ScriptRuns {
    pub running: AtomicUsize,
    pub by_token: Mutex<HashMap<String, usize>>,
}
