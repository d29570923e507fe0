//! The tool-call log: every call through the registry, kept in SQLite beside the knowledge base,
//! or in the shared database (`[db] url`), where each entry names the replica that served it.
//!
//! The call path hands each finished call to [`CallLog::record`], which only pushes it on a
//! bounded queue. One writer thread drains the queue in batches, one transaction each (WAL, so
//! a `kill -9` loses nothing committed), and applies retention.
//!
//! It is an audit log: no action without its entry. A call that may change something (see
//! `tools::observe`) first takes a place in the queue ([`CallLog::reserve`]), and is refused
//! without running when the log cannot take it (its writer is down, failing to write, or too
//! far behind). Its entry is then committed before its answer leaves: the writer is woken for
//! it and acknowledges each batch's durable entries once the transaction is in the file (a
//! group commit: the calls that finish together share one). A read-only call's entry is only
//! queued; under backlog it is dropped and counted (`/metrics`).
//!
//! The call path renders the parameters and the result once, redacted and cut, straight into
//! the text the log keeps ([`render_into`]); the writer only binds them.

pub mod store;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value as Json;

pub use store::{Filter, Store, StoreError, PG};

use crate::config::Config;

/// Entries waiting for the writer at most; past this, new ones are dropped and counted. The
/// channel's slots are made (and touched) when the log starts, 16 bytes each, so this is idle
/// memory: 16,384 is 256 KB, and half a second of calls at the server's peak rate while the
/// writer, which empties it every 20 ms, keeps up with its nice +5 share (the ops bench drops 0).
const QUEUE: usize = 16_384;
/// Entries in the queue (and places reserved in it) past which a call that must be logged is
/// refused: the rest is headroom, so a reserved place is always free when its entry comes.
const DURABLE_CAP: usize = QUEUE - 1_024;
/// The backlog past which a read-only call's entry is dropped: below [`DURABLE_CAP`], so a flood
/// of reads never fills the room that the calls which must be logged need.
const READ_ONLY_CAP: usize = DURABLE_CAP - 2_048;
/// Entries written in one transaction at most.
const BATCH: usize = 4_096;
/// The writer's pause between batches while calls keep coming.
const PAUSE: Duration = Duration::from_millis(20);
/// How often retention runs, at most.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// One call's entry. The call path takes one from a pool when the call starts ([`begin`]),
/// fills it and hands it over ([`record`]); the writer gives it back once written. Its buffers
/// are used again, so a logged call neither allocates nor frees: freeing on the writer what a
/// worker allocated took a lock of the worker's allocator arena, which cost the writer a third
/// of its time and stalled the workers that wanted it.
pub struct Entry {
    pub id: u64,
    pub parent: Option<u64>,
    pub at: SystemTime,
    pub tool: String,
    /// The caller's name; empty for none.
    pub caller: String,
    pub via: &'static str,
    pub micros: u64,
    /// `ok`, or the error code.
    pub outcome: &'static str,
    pub message: Option<String>,
    /// The parameters as the log keeps them ([`render_into`]).
    pub params: Rendered,
    /// The result as the log keeps it, when `has_result` (a failed call has none).
    pub result: Rendered,
    pub has_result: bool,
    /// For a call whose answer waits for its entry: told whether the entry was committed.
    ack: Option<tokio::sync::oneshot::Sender<bool>>,
}

impl Default for Entry {
    fn default() -> Entry {
        Entry {
            id: 0,
            parent: None,
            at: SystemTime::UNIX_EPOCH,
            tool: String::new(),
            caller: String::new(),
            via: "",
            micros: 0,
            outcome: "",
            message: None,
            params: Rendered::default(),
            result: Rendered::default(),
            has_result: false,
            ack: None,
        }
    }
}

impl Entry {
    /// Renders `value` as this call's result, into the entry's own buffer, as `log` keeps it.
    pub fn set_result(&mut self, log: &CallLog, value: &Json) {
        log.with_log(|log| match log {
            Some(log) => render_into(value, &log.settings, &log.secrets, &mut self.result),
            None => self.result = Rendered::default(),
        });
        self.has_result = true;
    }

    /// Empties the entry for the pool: no call's data is left in it (a call of another
    /// application may take it next), and its buffers keep their capacity.
    fn clear(&mut self) {
        let Entry { id, parent, at, tool, caller, via, micros, outcome, message, params, result, has_result, ack } =
            self;
        (*id, *parent, *at, *via, *micros, *outcome, *has_result) = (0, None, SystemTime::UNIX_EPOCH, "", 0, "", false);
        // Dropped unanswered only when the entry was not written: its call hears "not committed".
        *ack = None;
        tool.clear();
        caller.clear();
        // The one buffer not kept: most calls succeed and have no message.
        *message = None;
        for rendered in [params, result] {
            rendered.text.clear();
            rendered.cut = false;
        }
    }

    /// The bytes its buffers hold.
    fn capacity(&self) -> usize {
        let message = self.message.as_ref().map_or(0, String::capacity);
        self.tool.capacity()
            + self.caller.capacity()
            + self.params.text.capacity()
            + self.result.text.capacity()
            + message
    }
}

/// Entries written and given back, for the call path to fill again. Boxed: an entry goes
/// through the queue as a pointer (a slot of 16 bytes) and back here without being moved.
#[allow(clippy::vec_box)]
// Static: an allocator: a free list of cleared entries (see `give_back`), which hold no call data.
static POOL: std::sync::Mutex<Vec<Box<Entry>>> = std::sync::Mutex::new(Vec::new());
/// The pool's size at most: more than one batch of the writer's at the server's peak rate
/// (about 600 entries in its 20 ms pause), at most about 1.3 MB held after a burst.
const POOL_MAX: usize = 1_024;
/// Entries whose buffers hold more than this go back to the allocator, not the pool.
const POOL_ENTRY_BYTES: usize = 1_024;

fn take_entry() -> Box<Entry> {
    POOL.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default()
}

/// Gives `batch`'s entries back to the pool (those that fit), leaving `batch` empty.
#[allow(clippy::vec_box)]
fn give_back(batch: &mut Vec<Box<Entry>>) {
    // Cleared before the lock: a pooled entry holds no call data.
    batch.iter_mut().for_each(|entry| entry.clear());
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    let room = POOL_MAX.saturating_sub(pool.len());
    pool.extend(batch.drain(..).filter(|e| e.capacity() <= POOL_ENTRY_BYTES).take(room));
}

/// A value as the log keeps it: JSON text with secrets and listed names redacted, cut to
/// `max_value_bytes` (then not JSON any more, and `cut` says so).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendered {
    pub text: String,
    pub cut: bool,
}

/// What the log's settings say, resolved against the config file.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub path: std::path::PathBuf,
    pub max_age: Duration,
    pub max_entries: u64,
    pub max_value_bytes: usize,
    /// Parameter names whose values are never kept (lowercase), besides secret-looking ones.
    pub redact: Vec<String>,
}

impl Settings {
    /// The settings of `config`, or `None` when the log is off.
    pub fn of(config: &Config) -> Option<Settings> {
        let log = &config.spec.log;
        log.enabled.then(|| Settings {
            path: Settings::path_of(config),
            max_age: Duration::from_secs(log.max_age_days * 86_400),
            max_entries: log.max_entries as u64,
            max_value_bytes: log.max_value_bytes as usize,
            redact: log.redact.iter().map(|k| k.to_ascii_lowercase()).collect(),
        })
    }

    /// Where the log of `config` lives, whether or not it is on (`ctx log` reads it either way).
    pub fn path_of(config: &Config) -> std::path::PathBuf {
        match config.spec.log.path.as_deref() {
            Some(path) => config.resolve(path),
            None => config.db_path().with_file_name("calls.sqlite"),
        }
    }
}

/// Counters of the log since the process started, for `/metrics`.
#[derive(Default)]
pub struct Counters {
    pub queued: AtomicU64,
    pub written: AtomicU64,
    pub dropped: AtomicU64,
    pub write_errors: AtomicU64,
    /// Calls refused because the log could not take their entry (`audit_unavailable`).
    pub refused: AtomicU64,
    /// Places in the queue held by calls that must be logged and are running.
    reserved: AtomicU64,
}

impl Counters {
    /// Entries queued and not yet written (or failed), plus the places reserved for running calls.
    fn backlog(&self) -> u64 {
        let queued = self.queued.load(Ordering::Relaxed);
        let done = self.written.load(Ordering::Relaxed) + self.write_errors.load(Ordering::Relaxed);
        queued.saturating_sub(done) + self.reserved.load(Ordering::Relaxed)
    }
}

/// A running call's place in the writer's queue, taken before it runs ([`CallLog::reserve`]):
/// its entry is then sure to find room. Given back when the entry is queued, or dropped.
pub struct Reservation {
    counters: Arc<Counters>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.counters.reserved.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether a log's writer can take entries, as the writer last found out.
#[derive(Default)]
struct Health {
    /// The writer ended (its file could not be opened, or it panicked).
    gone: std::sync::atomic::AtomicBool,
    /// Its last transaction failed (a full disk, a file gone read-only); cleared by the next
    /// one that succeeds.
    failing: std::sync::atomic::AtomicBool,
    /// The writer's thread, to wake it for an entry whose call waits.
    thread: OnceLock<std::thread::Thread>,
}

/// The tool-call log of one application (see `tools::CallState`): the log that runs now, if any,
/// and its counters. A reload installs the next one.
pub struct CallLog {
    running: RwLock<Option<Arc<Log>>>,
    /// Changes with each install (drawn from [`GENERATIONS`]), so threads know when to read
    /// `running` again, and never matches another log's.
    generation: AtomicU64,
    counters: Arc<Counters>,
}

/// Generation numbers, unique in the process: a thread's cached log (see [`CallLog::with_log`])
/// can never be taken for another application's.
// Static: a generation counter: it must be unique across every application's logs in the process.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// The running log: its settings, and the queue to its writer once a call has been logged.
struct Log {
    /// Made with the writer on the first entry, so an idle server holds neither the queue's
    /// slots nor the writer's thread, connection and allocator arena (about 1 MB). Shared by the
    /// versions of one log that a reload makes.
    writer: Arc<OnceLock<SyncSender<Message>>>,
    settings: Settings,
    /// The config's secrets as of this install (a reload installs again).
    secrets: Arc<crate::config::redact::Redactor>,
    /// The application's counters, which the writer thread adds to.
    counters: Arc<Counters>,
    /// The writer's health, shared like `writer` by the versions of one log.
    health: Arc<Health>,
    /// The shared database the log is kept in, instead of `settings.path`.
    shared: Option<crate::db::Shared>,
}

enum Message {
    Entry(Box<Entry>),
    /// Write what is queued, then answer.
    Flush(SyncSender<()>),
}

impl Default for CallLog {
    fn default() -> CallLog {
        CallLog {
            running: RwLock::default(),
            generation: AtomicU64::new(GENERATIONS.fetch_add(1, Ordering::Relaxed)),
            counters: Arc::default(),
        }
    }
}

impl CallLog {
    /// Replaces the running log, and tells the call path's threads.
    fn swap(&self, log: Option<Arc<Log>>) -> Option<Arc<Log>> {
        let old = std::mem::replace(&mut *self.running.write().unwrap_or_else(|p| p.into_inner()), log);
        self.generation.store(GENERATIONS.fetch_add(1, Ordering::Relaxed), Ordering::Release);
        old
    }

    /// Runs `f` with the running log as this thread last read it. The call path reads only the
    /// generation (a line no call writes): neither a lock nor a reference count is shared by
    /// two calls, which on a busy server cost more than the rest of the log's work on the call
    /// path.
    fn with_log<R>(&self, f: impl FnOnce(Option<&Log>) -> R) -> R {
        // Static: per thread, a cache keyed by a process-unique generation: it never serves another application's log.
        thread_local! {
            // A cache of the log a thread used last, with its generation (unique in the
            // process, so a thread that serves two applications reads again when it switches).
            static SEEN: std::cell::RefCell<(u64, Option<Arc<Log>>)> = const { std::cell::RefCell::new((0, None)) };
        }
        let generation = self.generation.load(Ordering::Acquire);
        SEEN.with_borrow_mut(|seen| {
            if seen.0 != generation {
                *seen = (generation, self.running.read().unwrap_or_else(|p| p.into_inner()).clone());
            }
            f(seen.1.as_deref())
        })
    }

    /// The counters, whether or not a log is running.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Starts the log entry of a call with `params`: `None` when no log runs.
    pub fn begin(&self, params: &Json) -> Option<Box<Entry>> {
        self.with_log(|log| {
            let log = log?;
            let mut entry = take_entry();
            render_into(params, &log.settings, &log.secrets, &mut entry.params);
            Some(entry)
        })
    }

    /// Starts the log of `config`, in the shared database when there is one, or stops it when
    /// the config turns it off. A log already running with the same file keeps running with the
    /// new settings' retention applied from its next batch. Fails when the file cannot be opened.
    pub fn install(&self, config: &Config, shared: Option<&crate::db::Shared>) -> Result<(), String> {
        let Some(settings) = Settings::of(config) else {
            self.shutdown();
            return Ok(());
        };
        let running = self.running.read().unwrap_or_else(|p| p.into_inner()).clone();
        let same_place = |log: &&Arc<Log>| match (&log.shared, shared) {
            (None, None) => true,
            (Some(a), Some(b)) => a.replica == b.replica && a.pg.url().to_string() == b.pg.url().to_string(),
            _ => false,
        };
        if let Some(log) = running.as_ref().filter(|log| log.settings == settings).filter(same_place) {
            // Same log; a reload may have changed the config's secrets, which render_into uses.
            let secrets = crate::config::redact::current();
            if !Arc::ptr_eq(&log.secrets, &secrets) {
                let (writer, counters, health) =
                    (Arc::clone(&log.writer), Arc::clone(&log.counters), Arc::clone(&log.health));
                let (settings, shared) = (log.settings.clone(), log.shared.clone());
                self.swap(Some(Arc::new(Log { writer, settings, secrets, counters, health, shared })));
            }
            return Ok(());
        }
        // Opened now, so a file that cannot be written is a startup error, and retention runs at
        // start; the writer opens it again when the first call comes. (The shared database was
        // checked and migrated as the application opened it; one down now fails the writes,
        // and the writer finds out when it is back.)
        let mut unreachable = false;
        let problem = match Store::open_for(&settings, shared) {
            Ok(mut store) => {
                if let Err(e) = store.prune(settings.max_age, settings.max_entries) {
                    tracing::warn!("the tool-call log's retention failed: {e}");
                    // The shared database did not answer: calls that must be logged are refused
                    // from the start, as by a writer whose last write failed, until the writer
                    // finds it back (a file that opens takes writes).
                    unreachable = shared.is_some();
                }
                None
            }
            Err(e) => Some(format!(
                "the tool-call log {} cannot be opened: {e}; calls that change something are refused until it can; set log.path to a writable file or log.enabled = false",
                settings.path.display()
            )),
        };
        // A log that cannot be opened is still installed, as one whose writer is gone: the calls
        // that must be logged are refused (not run unlogged); the first call tries the file again.
        let health = Health::default();
        health.gone.store(problem.is_some(), Ordering::Relaxed);
        health.failing.store(unreachable, Ordering::Relaxed);
        let counters = Arc::clone(&self.counters);
        let log = Log {
            writer: Arc::default(),
            settings,
            secrets: crate::config::redact::current(),
            counters,
            health: Arc::new(health),
            shared: shared.cloned(),
        };
        let old = self.swap(Some(Arc::new(log)));
        // The old writer finishes its queue; no lock is held meanwhile.
        if let Some(old) = old {
            flush_log(&old);
        }
        problem.map_or(Ok(()), Err)
    }

    /// Writes what is queued and stops logging (the CLI before it exits, a reload that turns
    /// the log off).
    pub fn shutdown(&self) {
        let old = self.swap(None);
        if let Some(old) = old {
            flush_log(&old);
        }
    }

    /// Waits until every entry queued so far is written (at most a few seconds).
    pub fn flush(&self) {
        let log = self.running.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(log) = log {
            flush_log(&log);
        }
    }

    /// A place in the queue for the entry of a call that must be logged before it answers, taken
    /// before the call runs. `Ok(None)` when no log runs (the operator turned it off); `Err`
    /// says why the log cannot take the entry now, and the call must not run.
    pub fn reserve(&self) -> Result<Option<Reservation>, String> {
        let refused = |why: String| {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            Err(why)
        };
        self.with_log(|log| {
            let Some(log) = log else { return Ok(None) };
            // The writer starts with the first call (its file opened now, see `queue`).
            log.queue();
            if log.health.gone.load(Ordering::Relaxed) {
                return refused(format!(
                    "the tool-call log's writer is not running ({} cannot be written; the server's log says why)",
                    log.place()
                ));
            }
            if log.health.failing.load(Ordering::Relaxed) {
                let why = match log.shared {
                    Some(_) => "is it down?",
                    None => "a full disk?",
                };
                return refused(format!(
                    "the tool-call log failed to write its last entries to {} ({why} the server's log says why)",
                    log.place()
                ));
            }
            self.counters.reserved.fetch_add(1, Ordering::Relaxed);
            let reservation = Reservation { counters: Arc::clone(&self.counters) };
            let backlog = self.counters.backlog();
            if backlog > DURABLE_CAP as u64 {
                drop(reservation);
                return refused(format!("the tool-call log is {backlog} entries behind; try again in a moment"));
            }
            Ok(Some(reservation))
        })
    }

    /// Hands the entry of a call that must be logged to the writer, in the place `reservation`
    /// kept, and wakes the writer: the receiver hears `true` once the entry is committed (`false`,
    /// or a closed channel, when it could not be written).
    pub fn record_durable(
        &self,
        mut entry: Box<Entry>,
        reservation: Reservation,
    ) -> tokio::sync::oneshot::Receiver<bool> {
        let (ack, committed) = tokio::sync::oneshot::channel();
        entry.ack = Some(ack);
        let sent = self.with_log(|log| {
            log.map(|log| {
                let sent = log.queue().try_send(Message::Entry(entry));
                if sent.is_ok() {
                    self.counters.queued.fetch_add(1, Ordering::Relaxed);
                    if let Some(writer) = log.health.thread.get() {
                        writer.unpark();
                    }
                }
                sent
            })
        });
        drop(reservation);
        if let Some(Err(_)) = sent {
            // Unreachable while the place is kept, but counted if a writer died meanwhile; the
            // entry (and its ack) is dropped, so the call hears "not committed".
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
        committed
    }

    /// Hands a finished read-only call to the writer. Never blocks: with the queue at its cap the
    /// entry is dropped and counted.
    pub fn record(&self, entry: Box<Entry>) {
        if self.counters.backlog() >= READ_ONLY_CAP as u64 {
            self.dropped_one();
            return;
        }
        let sent = self.with_log(|log| log.map(|log| log.queue().try_send(Message::Entry(entry))));
        let Some(sent) = sent else { return };
        match sent {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped_one(),
        }
    }

    fn dropped_one(&self) {
        let dropped = self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        // Once, then every 10,000: the count is in /metrics.
        if dropped.is_multiple_of(10_000) {
            tracing::warn!(
                dropped = dropped + 1,
                "the tool-call log is behind; read-only calls' entries are being dropped"
            );
        }
    }
}

impl Log {
    /// Where the log is kept, for messages.
    fn place(&self) -> String {
        match &self.shared {
            Some(shared) => format!("the shared database {}", shared.pg.url()),
            None => self.settings.path.display().to_string(),
        }
    }

    /// The queue to the writer, started on first use. A writer that cannot open the file
    /// logs why and ends; what is sent to it then counts as dropped.
    fn queue(&self) -> &SyncSender<Message> {
        self.writer.get_or_init(|| {
            let (tx, rx) = sync_channel(QUEUE);
            let (settings, counters, health) =
                (self.settings.clone(), Arc::clone(&self.counters), Arc::clone(&self.health));
            // Opened here, before any call that must be logged runs: one the file cannot take
            // is refused, never run and then left unlogged.
            let store = match Store::open_for(&settings, self.shared.as_ref()) {
                Ok(store) => store,
                Err(e) => {
                    self.health.gone.store(true, Ordering::Relaxed);
                    tracing::error!(
                        "the tool-call log {} cannot be opened any more: {e}; calls that change something are refused, read-only ones are not logged",
                        self.place()
                    );
                    return tx;
                }
            };
            // The file opens now: whatever kept it from opening at install is over.
            self.health.gone.store(false, Ordering::Relaxed);
            let started = std::thread::Builder::new().name("ctx-call-log".into()).spawn(move || {
                // However the writer ends (a panic included), calls that must be logged are
                // refused from then on.
                struct Gone(Arc<Health>);
                impl Drop for Gone {
                    fn drop(&mut self) {
                        self.0.gone.store(true, Ordering::Relaxed);
                    }
                }
                let _gone = Gone(Arc::clone(&health));
                let _ = health.thread.set(std::thread::current());
                lower_priority();
                write_loop(store, rx, settings, &counters, &health);
            });
            if let Err(e) = started {
                self.health.gone.store(true, Ordering::Relaxed);
                tracing::error!("the tool-call log's writer thread did not start: {e}; calls that change something are refused");
            }
            tx
        })
    }
}

fn flush_log(log: &Log) {
    // Nothing was logged: no writer, nothing to write.
    let Some(queue) = log.writer.get() else { return };
    let (done, wait) = sync_channel(1);
    if queue.send(Message::Flush(done)).is_ok() {
        let _ = wait.recv_timeout(Duration::from_secs(10));
    }
}

/// Background work yields to the calls it logs: on a busy machine the writer gets a smaller
/// share of the CPU (nice +5: still several times the few percent it needs at the server's
/// peak rate, so its queue does not grow).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id changes only its scheduling weight.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 5);
    }
}

/// The writer: batches of whatever is queued, one transaction each; retention once a minute.
fn write_loop(mut store: Store, rx: Receiver<Message>, settings: Settings, counters: &Counters, health: &Health) {
    let mut last_prune: Option<Instant> = None;
    let mut batch: Vec<Box<Entry>> = Vec::with_capacity(256);
    let mut waiting: Vec<SyncSender<()>> = Vec::new();
    // While calls keep coming, the writer does not wait on the queue but sleeps between
    // batches: a sender then never has a sleeping receiver to wake (a futex call and two
    // context switches per call, which cost the server a third of its echo rate).
    let mut busy = false;
    loop {
        let first = if busy {
            // Woken early by an entry whose call waits for it (`record_durable`).
            std::thread::park_timeout(PAUSE);
            match rx.try_recv() {
                Ok(message) => Some(message),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => break,
            }
        } else {
            // While writes fail, calls that must be logged are refused: find out every second
            // whether the file takes writes again.
            let failing = health.failing.load(Ordering::Relaxed);
            match rx.recv_timeout(if failing { Duration::from_secs(1) } else { PRUNE_EVERY }) {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => {
                    if failing && store.probe().is_ok() {
                        health.failing.store(false, Ordering::Relaxed);
                        tracing::info!("the tool-call log takes writes again");
                    }
                    None
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        };
        busy = first.is_some();
        let mut take = |message: Message, batch: &mut Vec<Box<Entry>>| match message {
            Message::Entry(entry) => batch.push(entry),
            Message::Flush(done) => waiting.push(done),
        };
        if let Some(first) = first {
            take(first, &mut batch);
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(message) => take(message, &mut batch),
                    Err(_) => break,
                }
            }
        }
        if !batch.is_empty() {
            let n = batch.len() as u64;
            let committed = match store.insert(&batch, &settings) {
                Ok(()) => {
                    counters.written.fetch_add(n, Ordering::Relaxed);
                    health.failing.store(false, Ordering::Relaxed);
                    true
                }
                Err(e) => {
                    counters.write_errors.fetch_add(n, Ordering::Relaxed);
                    health.failing.store(true, Ordering::Relaxed);
                    tracing::error!("the tool-call log could not write {n} entries: {e}");
                    false
                }
            };
            // The calls waiting for their entries answer now: one commit for all of them.
            for entry in batch.iter_mut() {
                if let Some(ack) = entry.ack.take() {
                    let _ = ack.send(committed);
                }
            }
            give_back(&mut batch);
        }
        if last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            if let Err(e) = store.prune(settings.max_age, settings.max_entries) {
                tracing::warn!("the tool-call log's retention failed: {e}");
            }
            last_prune = Some(Instant::now());
        }
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
    }
}

/// A `--since`/`since=` value: an RFC 3339 time, a date (`2026-11-27`, midnight UTC), or an
/// age (`30s`, `10m`, `2h`, `7d`) counted back from `now`.
pub fn parse_since(text: &str, now: SystemTime) -> Result<SystemTime, String> {
    let text = text.trim();
    let wrong = || {
        format!("since {text:?} is not a time: give an age such as 30s, 10m, 2h or 7d, a date such as 2026-11-27, or an RFC 3339 time such as 2026-11-27T09:00:00Z")
    };
    if let Some(unit) = text.chars().last().filter(|c| c.is_ascii_alphabetic()) {
        if let Ok(n) = text[..text.len() - 1].parse::<u64>() {
            let secs = match unit {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                'w' => 7 * 86_400,
                _ => return Err(wrong()),
            };
            return now.checked_sub(Duration::from_secs(n.saturating_mul(secs))).ok_or_else(wrong);
        }
    }
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(SystemTime::from(at.with_timezone(&chrono::Utc)));
    }
    if let Ok(day) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let at = day.and_hms_opt(0, 0, 0).ok_or_else(wrong)?.and_utc();
        return Ok(SystemTime::from(at));
    }
    Err(wrong())
}

/// Renders a value as the log keeps it into `out`, reusing its buffer, in one pass on the call
/// path (no copy of the value): keys named like a secret, listed in `[log] redact`, or
/// `_approval` get `"[redacted]"`, config secrets are replaced in every string, and the text
/// stops at `max_value_bytes`.
fn render_into(value: &Json, settings: &Settings, secrets: &crate::config::redact::Redactor, out: &mut Rendered) {
    let mut buffer = std::mem::take(&mut out.text).into_bytes();
    buffer.clear();
    let mut writer = Writer { text: buffer, cap: settings.max_value_bytes, full: false };
    write_value(&mut writer, value, &settings.redact, secrets);
    // Only whole JSON tokens of valid UTF-8 were written, so this holds; cutting keeps it so.
    let mut text = String::from_utf8(writer.text).unwrap_or_default();
    out.cut = writer.full;
    if writer.full {
        let mut end = settings.max_value_bytes.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(&format!("… [cut at {} bytes]", settings.max_value_bytes));
    }
    out.text = text;
}

/// JSON text that stops growing past its cap (`full` then).
struct Writer {
    text: Vec<u8>,
    cap: usize,
    full: bool,
}

impl Writer {
    fn push(&mut self, piece: &str) {
        if !self.full {
            self.text.extend_from_slice(piece.as_bytes());
            self.full = self.text.len() > self.cap;
        }
    }

    /// A JSON string or number, escaped straight into the text.
    fn token<T: serde::Serialize + ?Sized>(&mut self, value: &T) {
        if !self.full {
            let _ = serde_json::to_writer(&mut self.text, value);
            self.full = self.text.len() > self.cap;
        }
    }

    fn string(&mut self, s: &str) {
        self.token(s);
    }
}

fn write_value(out: &mut Writer, value: &Json, listed: &[String], secrets: &crate::config::redact::Redactor) {
    if out.full {
        return;
    }
    match value {
        Json::Object(map) => {
            out.push("{");
            for (i, (key, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(",");
                }
                out.string(key);
                out.push(":");
                if is_redacted(key, listed) {
                    out.push("\"[redacted]\"");
                } else {
                    write_value(out, v, listed, secrets);
                }
            }
            out.push("}");
        }
        Json::Array(items) => {
            out.push("[");
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(",");
                }
                write_value(out, v, listed, secrets);
            }
            out.push("]");
        }
        Json::String(s) => out.string(&secrets.apply(s)),
        other => out.token(other),
    }
}

/// Whether a key's value is never kept: named like a secret, listed, or an approval token.
fn is_redacted(key: &str, listed: &[String]) -> bool {
    key.eq_ignore_ascii_case(crate::contract::approval::PARAM)
        || crate::config::redact::is_secret_key(key)
        || listed.iter().any(|l| l.eq_ignore_ascii_case(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_entry_given_back_to_the_pool_holds_no_call_data() {
        let mut entry = Box::new(Entry {
            id: 7,
            parent: Some(3),
            tool: "search".into(),
            caller: "alice".into(),
            outcome: "tool_error",
            message: Some("the secret query failed".into()),
            params: Rendered { text: r#"{"q":"secret"}"#.into(), cut: true },
            result: Rendered { text: r#"{"hits":[]}"#.into(), cut: false },
            has_result: true,
            ..Entry::default()
        });
        let kept = entry.params.text.capacity();
        entry.clear();
        assert_eq!((entry.id, entry.parent, entry.outcome, entry.has_result), (0, None, "", false));
        assert!(entry.tool.is_empty() && entry.caller.is_empty() && entry.message.is_none());
        assert_eq!((entry.params.text.as_str(), entry.params.cut, entry.result.text.as_str()), ("", false, ""));
        assert_eq!(entry.params.text.capacity(), kept, "the buffers are kept for the next call");
    }

    fn settings(max: usize) -> Settings {
        Settings {
            path: "unused".into(),
            max_age: Duration::from_secs(60),
            max_entries: 100,
            max_value_bytes: max,
            redact: vec!["customer".into()],
        }
    }

    fn render_with(value: &Json, settings: &Settings, secrets: &crate::config::redact::Redactor) -> Rendered {
        let mut out = Rendered { text: "stale text of an earlier call".into(), cut: true };
        render_into(value, settings, secrets, &mut out);
        out
    }

    fn rendered(value: &Json, max: usize) -> Rendered {
        render_with(value, &settings(max), &crate::config::redact::Redactor::default())
    }

    #[test]
    fn since_takes_ages_dates_and_times() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(parse_since("10m", now).unwrap(), now - Duration::from_secs(600));
        assert_eq!(parse_since("2d", now).unwrap(), now - Duration::from_secs(172_800));
        let day = parse_since("1970-01-02", now).unwrap();
        assert_eq!(day, SystemTime::UNIX_EPOCH + Duration::from_secs(86_400));
        let at = parse_since("1970-01-01T00:01:00Z", now).unwrap();
        assert_eq!(at, SystemTime::UNIX_EPOCH + Duration::from_secs(60));
        assert!(parse_since("yesterday", now).unwrap_err().contains("give an age such as 30s"));
        assert!(parse_since("5y", now).is_err());
    }

    #[test]
    fn secret_and_listed_names_are_redacted_at_any_depth() {
        let value = json!({"title": "t\"q", "Customer": "acme", "nested": [{"api_key": "k", "ok": 1}], "password": {"a": 1}, "_approval": "tok"});
        let out = rendered(&value, 4096);
        assert!(!out.cut);
        let back: Json = serde_json::from_str(&out.text).unwrap();
        assert_eq!(
            back,
            json!({"title": "t\"q", "Customer": "[redacted]", "nested": [{"api_key": "[redacted]", "ok": 1}], "password": "[redacted]", "_approval": "[redacted]"})
        );
    }

    #[test]
    fn config_secrets_are_replaced_in_every_string() {
        let mut secrets = crate::config::redact::Redactor::default();
        secrets.add("s3cr3t-value-123", "server.auth_token");
        let out = render_with(&json!({"note": "token s3cr3t-value-123 here"}), &settings(4096), &secrets);
        assert!(!out.text.contains("s3cr3t-value-123"), "{}", out.text);
    }

    #[test]
    fn long_values_are_cut_on_a_char_boundary() {
        let out = rendered(&json!({"text": "é".repeat(100)}), 64);
        assert!(out.cut);
        assert!(out.text.ends_with("… [cut at 64 bytes]"), "{}", out.text);
        assert!(out.text.len() < 64 + 30);
    }

    #[test]
    fn with_the_shared_database_down_a_call_that_changes_something_is_refused_and_a_read_only_one_does_not_wait() {
        // A port nothing listens on: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("postgres://ctx:pw@127.0.0.1:{port}/ctx?sslmode=disable");
        let pg = crate::db::testing::pool(crate::db::DbUrl::parse(&url, None).unwrap());
        let shared = crate::db::Shared { pg, replica: Arc::from("host-a:7391") };
        let dir = tempfile::tempdir().unwrap();
        let text = format!("[db]\npath = \"{}\"\n", dir.path().join("kb.sqlite").display());
        let file = dir.path().join("ctx.toml");
        let config = Config::from_text(&text, std::path::Path::new("ctx.toml"), &file, &|_| None).unwrap();
        let log = CallLog::default();
        log.install(&config, Some(&shared)).unwrap();
        let refused = log.reserve().err().expect("refused before it runs");
        assert!(refused.contains("the shared database") && refused.contains(&port.to_string()), "{refused}");
        let started = Instant::now();
        let entry = log.begin(&json!({"q": 1})).unwrap();
        log.record(entry);
        assert!(started.elapsed() < Duration::from_millis(500), "a read-only call's entry is only queued");
        assert!(log.reserve().is_err(), "still refused while the database is down");
        assert!(!dir.path().join("calls.sqlite").exists(), "no file instead of the shared database");
        log.shutdown();
    }
}
