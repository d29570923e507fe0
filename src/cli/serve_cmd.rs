//! `ctx serve` (also spelled `ctx serve mcp`): the HTTP server for REST, the API docs and MCP.

use std::sync::Arc;

use anyhow::Context;

use super::{CliError, Globals};
use crate::mcp::Mcp;
use crate::server::{self, App};
use crate::tools::Tools;
use crate::upstream::{Event, EventSink, Upstreams};

/// Prints a status line. Unlike `println!` it never panics: whoever launched the server may have
/// closed our stdout, and that must not take the server down.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// `mcp` is accepted for compatibility: it is the same server.
    #[arg(value_parser = ["mcp"], hide_possible_values = true)]
    pub what: Option<String>,
    /// Listen here instead of server.bind (host:port).
    #[arg(long, value_name = "ADDR", conflicts_with = "stdio")]
    pub bind: Option<String>,
    /// Speak MCP over stdin/stdout instead of HTTP (what desktop MCP clients launch).
    /// stdout carries only protocol messages; logs go to stderr.
    #[arg(long)]
    pub stdio: bool,
    /// Do not watch the config and scripts for changes.
    #[arg(long)]
    pub no_reload: bool,
}

pub fn run(args: ServeArgs, globals: &Globals) -> Result<(), CliError> {
    let located = crate::config::locate(globals.config.as_deref());
    let mut config = globals.load_config_for(crate::config::Use::Serve)?;
    if let Some(bind) = args.bind {
        config.spec.server.bind = bind.parse().map_err(|e| CliError::Usage(format!("--bind {bind:?}: {e}")))?;
    }
    let (addr, security) = server::settings(&config).map_err(CliError::Usage)?;
    let max_body_bytes = config.spec.server.max_body_bytes as usize;
    let page_size = config.spec.server.mcp_page_size as usize;
    let limits = server::Limits::from_config(&config.spec.server);
    let sections = config.upstreams.clone();
    let stdio_wait = std::time::Duration::from_secs_f64(config.spec.mcp.stdio_wait);
    let kb = crate::app::database::open_kb(Arc::new(config), crate::app::database::Role::Server)?;
    let marker_dir = super::running::marker_dir(kb.config());
    let registry = crate::app::build(kb.clone(), None);
    // The application's state comes with its first registry; a reload hands it on.
    let state = Arc::clone(registry.state());
    // A log that cannot be opened costs the log only: the server runs, and says why.
    if let Err(e) = state.log.install(kb.config(), state.db.as_ref()) {
        tracing::error!("{e}");
    }
    // Tasks too: a store that cannot be opened costs tasks only, each refused saying why.
    if let Err(e) = state.tasks.install(kb.config(), Arc::new(server::tasks::Renderer), state.db.as_ref()) {
        tracing::error!("tasks: {e}");
    }
    state.metrics.set_enabled(kb.config().spec.server.metrics);
    let runtime = &globals.runtime;
    let tools = Arc::new(Tools::new(registry));
    tools.config_loaded(&located.path);
    let mcp = Mcp::with_page_size(Arc::clone(&tools), page_size);
    let upstreams = start_upstreams(runtime, &sections, &tools, &mcp)?;
    // Vectors missing from the index (`[embedding] background`, a provider that was down) are
    // filled while the server answers; the config it follows is the one it runs now.
    let filler = {
        let tools = Arc::clone(&tools);
        Arc::new(
            crate::kb::filler::Filler::start(move || tools.current().kb().clone())
                .context("cannot start the embedding thread")?,
        )
    };
    if !args.no_reload {
        let (mcp, handle) = (mcp.clone(), runtime.clone());
        // The broadcast is sync, but enter the runtime so rmcp's tasks wake on it.
        crate::app::reload::watch(located, kb, Arc::clone(&tools), move |tools, prompts| {
            let _guard = handle.enter();
            mcp.lists_changed(crate::mcp::Changed { tools, prompts, resources: false });
        })
        .map_err(CliError::Usage)?;
    }
    if args.stdio {
        for problem in tools.current().problems() {
            tracing::error!("{} {} failed to load: {}", problem.kind, problem.name, problem.message);
        }
        let served = runtime.block_on(async {
            let served = mcp.serve_stdio(stdio_wait).await;
            upstreams.shutdown().await;
            served
        });
        state.log.shutdown();
        return served.map_err(|e| CliError::from(anyhow::anyhow!(e)));
    }
    let registry = tools.current();
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (is another ctx already running there?)"))?;
        let local = listener.local_addr().context("listener address")?;
        // For the commands of this workspace that ask the running server (`ctx run`, ...).
        let _running = super::running::Marker::write(&marker_dir, local);
        say!("ctx {} listening on http://{local}  (API docs: http://{local}/docs)", env!("CARGO_PKG_VERSION"));
        for agent in registry.agents() {
            say!(
                "  agent {}  ({})",
                agent.name,
                if agent.source == crate::types::AgentSource::Lua { "lua" } else { "ctx.toml" }
            );
        }
        for spec in registry.specs() {
            let kind = if spec.builtin { "built-in".to_string() } else { spec.script.clone().unwrap_or_default() };
            say!("  tool {}  ({kind})", spec.name);
        }
        for problem in registry.problems() {
            say!("  broken {} {}: {}", problem.kind, problem.name, problem.message);
        }
        say!("  MCP (Streamable HTTP) at http://{local}/mcp");
        say!("  console at http://{local}/console");
        let app = Arc::new(App::with_mcp(mcp, security, max_body_bytes).with_limits(limits).with_filler(filler));
        let served = server::run(listener, app, shutdown_signal()).await.context("the server failed");
        upstreams.shutdown().await;
        state.log.shutdown();
        served?;
        say!("ctx stopped");
        Ok::<(), anyhow::Error>(())
    });
    // The CLI stops the runtime (`runtime::stop`), without waiting for ever on a stuck thread.
    Ok(served?)
}

/// How long `ctx serve` waits for the servers marked `required` before it gives up.
const REQUIRED_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Starts a supervisor per upstream MCP server (connections happen in the background, except
/// that the `required` ones must be ready before ctx serves), and swaps their tools into the
/// registry whenever one (re)connects or relists.
fn start_upstreams(
    runtime: &tokio::runtime::Handle,
    sections: &[crate::config::upstream::UpstreamSection],
    tools: &Arc<Tools>,
    mcp: &Mcp,
) -> Result<Arc<Upstreams>, CliError> {
    // Events arrive on the supervisors' tasks (and from hot reload, under its locks): they are
    // only queued there. One thread swaps the registry, which compiles each tool's schema, and
    // tells the clients, a burst at a time.
    let (sender, queue) = std::sync::mpsc::channel::<Event>();
    let (weak, mcp, handle) = (Arc::downgrade(tools), mcp.clone(), runtime.clone());
    std::thread::Builder::new()
        .name("ctx-upstreams".into())
        .spawn(move || {
            while let Ok(first) = queue.recv() {
                let mut lists = crate::mcp::Changed { tools: false, prompts: false, resources: false };
                let mut relist = false;
                for event in std::iter::once(first).chain(queue.try_iter()) {
                    relist |= event.tools;
                    lists.prompts |= event.prompts;
                    lists.resources |= event.resources;
                }
                let Some(tools) = weak.upgrade() else { return };
                lists.tools = relist && tools.refresh_upstreams();
                let _guard = handle.enter();
                mcp.lists_changed(lists);
            }
        })
        .context("cannot start the upstream thread")?;
    let events: EventSink = Arc::new(move |event: Event| {
        let _ = sender.send(event);
    });
    let _guard = runtime.enter();
    let upstreams = Upstreams::start(sections, events);
    tools.attach_upstreams(Arc::clone(&upstreams));
    if sections.iter().any(|s| s.required && s.enabled) {
        if let Err(e) = runtime.block_on(upstreams.required_ready(REQUIRED_WAIT)) {
            runtime.block_on(upstreams.shutdown());
            return Err(CliError::Usage(format!(
                "{e}\n(a server with required = true must start before ctx serves; fix it, or drop `required` to let ctx start without it and keep retrying)"
            )));
        }
    }
    Ok(upstreams)
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
