//! The background filler of `ctx serve`: gives every chunk without a vector of the configured
//! model its vector, a batch at a time, while the server answers. Sync (with `[embedding]
//! background`, or when the provider failed) leaves such chunks keyword-searchable; this thread
//! makes them semantically searchable too, and says how far it is (`/health`).
//!
//! It looks every [`IDLE`] for work (a sync of another process, `ctx sync`, counts), less often
//! while it finds none (up to [`MAX_IDLE`]: a look counts every chunk and vector), and at once
//! when woken ([`Filler::wake`], after a sync started through the server). A provider that fails
//! is tried again after a growing pause, and the failure is shown meanwhile.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::embedding;
use super::Kb;

/// How often an idle filler looks for chunks without vectors.
const IDLE: Duration = Duration::from_secs(2);
/// The longest pause between looks that found nothing to fill.
const MAX_IDLE: Duration = Duration::from_secs(30);
/// The pause after a failure, doubled each time up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_secs(5);
const MAX_PAUSE: Duration = Duration::from_secs(300);

/// Where the filler stands, as `/health` shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// The configured model (`local:wordllama-l2-256`); `None` without one.
    pub model: Option<String>,
    /// Chunks in the index.
    pub chunks: u64,
    /// Chunks with a vector of the model.
    pub embedded: u64,
    /// Whether a fill runs now.
    pub filling: bool,
    /// Chunks per second of the last fill, once one ran.
    pub rate: Option<f64>,
    /// Why the last fill failed, until one succeeds.
    pub last_error: Option<String>,
}

struct Shared {
    progress: Mutex<Progress>,
    /// Set by `wake` and `stop`, with the condition variable the thread waits on.
    signal: Mutex<Signal>,
    condvar: Condvar,
}

#[derive(Default)]
struct Signal {
    woken: bool,
    stopped: bool,
}

/// A running filler thread; stopped when dropped.
pub struct Filler {
    shared: Arc<Shared>,
}

impl Filler {
    /// Starts the thread. `kb` gives the knowledge base of the config the server runs now (it
    /// follows hot reloads, so a changed model is filled in).
    pub fn start(kb: impl Fn() -> Kb + Send + 'static) -> std::io::Result<Filler> {
        let shared = Arc::new(Shared {
            progress: Mutex::new(Progress::default()),
            signal: Mutex::new(Signal::default()),
            condvar: Condvar::new(),
        });
        let thread = Arc::clone(&shared);
        std::thread::Builder::new().name("ctx-embed-filler".to_string()).spawn(move || run(&thread, &kb))?;
        Ok(Filler { shared })
    }

    /// Looks for work now instead of at the next tick.
    pub fn wake(&self) {
        let mut signal = self.shared.signal.lock().unwrap_or_else(|e| e.into_inner());
        signal.woken = true;
        self.shared.condvar.notify_all();
    }

    pub fn progress(&self) -> Progress {
        self.shared.progress.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        let mut signal = self.shared.signal.lock().unwrap_or_else(|e| e.into_inner());
        signal.stopped = true;
        self.shared.condvar.notify_all();
    }
}

fn run(shared: &Shared, kb: &dyn Fn() -> Kb) {
    let mut pause = IDLE;
    let mut failures = 0u32;
    loop {
        {
            let signal = shared.signal.lock().unwrap_or_else(|e| e.into_inner());
            let (mut signal, _) = shared
                .condvar
                .wait_timeout_while(signal, pause, |s| !s.woken && !s.stopped)
                .unwrap_or_else(|e| e.into_inner());
            if signal.stopped {
                return;
            }
            signal.woken = false;
        }
        match fill_once(shared, &kb()) {
            // Work done: look again soon; nothing to do: look less often.
            Ok(filled) => {
                failures = 0;
                pause = if filled { IDLE } else { pause.saturating_mul(2).clamp(IDLE, MAX_IDLE) };
            }
            Err(why) => {
                tracing::warn!("background embedding: {why}; trying again in {} s", pause.as_secs());
                failures += 1;
                pause = FIRST_PAUSE.saturating_mul(1 << failures.min(8)).min(MAX_PAUSE);
                let mut progress = shared.progress.lock().unwrap_or_else(|e| e.into_inner());
                progress.filling = false;
                progress.last_error = Some(why);
            }
        }
    }
}

/// One look: counts, and a backfill when some chunks lack vectors. Says whether it filled any.
fn fill_once(shared: &Shared, kb: &Kb) -> Result<bool, String> {
    let set = |change: &dyn Fn(&mut Progress)| change(&mut shared.progress.lock().unwrap_or_else(|e| e.into_inner()));
    let embedder = match kb.embedder() {
        Ok(Some(embedder)) => embedder,
        Ok(None) => {
            set(&|p| *p = Progress::default());
            return Ok(false);
        }
        Err(e) => return Err(e.to_string()),
    };
    let coverage = kb.store().coverage().map_err(|e| e.to_string())?;
    let embedded = coverage.of(embedder.name(), embedder.dims()).max(0) as u64;
    let chunks = coverage.chunks.max(0) as u64;
    let model = embedder.name().to_string();
    set(&|p| {
        p.model = Some(model.clone());
        p.chunks = chunks;
        p.embedded = embedded;
    });
    if embedded >= chunks {
        return Ok(false);
    }
    set(&|p| p.filling = true);
    let started = Instant::now();
    let done = embedding::backfill(kb.store(), embedder.as_ref(), &mut |done, _total| {
        set(&|p| p.embedded = (embedded + done as u64).min(chunks.max(embedded + done as u64)));
    })
    .map_err(|e| e.to_string())?;
    let seconds = started.elapsed().as_secs_f64();
    let rate = (seconds > 0.0 && done.embedded > 0).then(|| done.embedded as f64 / seconds);
    tracing::info!(model = %embedder.name(), chunks = done.embedded, seconds, "background embedding filled vectors");
    // Counted again: chunks deleted or added meanwhile.
    let coverage = kb.store().coverage().map_err(|e| e.to_string())?;
    set(&|p| {
        p.filling = false;
        p.last_error = None;
        p.rate = rate.or(p.rate);
        p.chunks = coverage.chunks.max(0) as u64;
        p.embedded = coverage.of(embedder.name(), embedder.dims()).max(0) as u64;
    });
    Ok(true)
}
