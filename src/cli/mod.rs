//! The `ctx` command line: argument definitions, dispatch, exit codes and error printing.
//!
//! Each subcommand group lives in its own file and calls the library; nothing here knows SQL,
//! Lua or HTTP.

mod agent_cmd;
mod approvals_cmd;
mod code_cmd;
mod connector_cmd;
mod embed_cmd;
mod init;
mod kb_cmd;
mod log_cmd;
mod mcp_cmd;
mod pack_cmd;
mod pipe;
mod running;
mod scaffold;
mod schema_cmd;
mod serve_cmd;
mod tool_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::config::{self, Config, ConfigError};

/// Context and actions for AI agents: index your team's knowledge, serve it and your Lua tools
/// over MCP and REST.
#[derive(Debug, Parser)]
#[command(name = "ctx", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Config file. Default: $CTX_CONFIG, else ./ctx.toml.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// More log output on stderr (-v info, -vv debug, -vvv trace). Also shows script internals.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,

    /// Only errors on stderr.
    #[arg(short, long, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a workspace: a commented ctx.toml, a data folder and an example tool.
    Init(init::InitArgs),
    /// Check or export the JSON Schemas that define ctx's config and wire formats.
    #[command(subcommand)]
    Schema(schema_cmd::SchemaCommand),
    /// Index the configured sources: all, a type, or one type:name.
    Sync(kb_cmd::SyncArgs),
    /// Search the knowledge base.
    Search(kb_cmd::SearchArgs),
    /// Embed every chunk that has no vector of the configured [embedding] model.
    Embed(embed_cmd::EmbedArgs),
    /// Show one document with its chunks.
    Get(kb_cmd::GetArgs),
    /// List sources with health, document counts and last sync, or prune unconfigured ones.
    Sources(kb_cmd::SourcesArgs),
    /// Database statistics.
    Stats(kb_cmd::JsonFlag),
    /// Scaffold and test Lua connectors; install them from packs.
    #[command(subcommand)]
    Connector(connector_cmd::ConnectorCommand),
    /// Serve REST, the API docs (/docs) and tools over HTTP.
    Serve(serve_cmd::ServeArgs),
    /// Scaffold, test and list tools; install, update, remove and search tool packs.
    #[command(subcommand)]
    Tool(tool_cmd::ToolCommand),
    /// Scaffold, list and try agents (served as MCP prompts and at /agents).
    #[command(subcommand)]
    Agent(agent_cmd::AgentCommand),
    /// List and try the upstream MCP servers ctx connects to ([mcp.servers.*], mcp.import).
    #[command(subcommand)]
    Mcp(mcp_cmd::McpCommand),
    /// List the tool calls waiting for a person's approval, and approve or deny them.
    #[command(subcommand)]
    Approvals(approvals_cmd::ApprovalsCommand),
    /// Read the tool-call log: filter by tool, caller, time and errors, or follow it (-f).
    Log(log_cmd::LogArgs),
    /// Run a code-mode Lua script (what an agent sends to `execute`), with its trace.
    Run(code_cmd::RunArgs),
    /// Print the code-mode catalog: every tool a script can call, as a Lua signature.
    Catalog(code_cmd::CatalogArgs),
    /// Print a shell completion script.
    Completions {
        /// Shell to generate for.
        shell: clap_complete::Shell,
    },
}

/// Why a command failed; decides the exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The config file is missing, unreadable or invalid (exit 2).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The command line asked for something impossible (exit 2).
    #[error("{0}")]
    Usage(String),
    /// A check found problems, already printed (exit 2).
    #[error("{0}")]
    Problems(String),
    /// The command ran and failed (exit 1).
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
    /// The command ran and failed, and its output already says how (exit 1): a `--json` run
    /// that printed the error envelope.
    #[error("{0}")]
    Reported(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Config(_) | CliError::Usage(_) | CliError::Problems(_) => 2,
            CliError::Failed(_) | CliError::Reported(_) => 1,
        }
    }
}

/// Global options every command can read.
pub struct Globals {
    pub config: Option<PathBuf>,
    pub verbose: u8,
    pub quiet: bool,
    /// The process's one runtime: every command that serves, connects upstream servers or
    /// waits on a future uses it (the main thread has entered it, so it is also
    /// `Handle::current()` there).
    pub runtime: tokio::runtime::Handle,
}

impl Globals {
    /// Loads and validates the config file named by the lookup order.
    /// Sections an unset variable disables are logged: every command says so, `ctx search`
    /// included, or the section would be silently missing.
    /// The config for a command that does not serve: the server's tokens may be unset.
    pub fn load_config(&self) -> Result<Config, CliError> {
        self.load_config_for(config::Use::Local)
    }

    pub fn load_config_for(&self, purpose: config::Use) -> Result<Config, CliError> {
        let mut config = Config::load_for(&config::locate(self.config.as_deref()), purpose)?;
        crate::packs::enforce(&mut config);
        for section in &config.broken {
            tracing::warn!("{}", section.message());
        }
        Ok(config)
    }
}

/// Parses the command line, runs the command and returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // `ctx schema check` reports every problem and warning itself; its log would say each twice.
    let checking = matches!(cli.command, Command::Schema(schema_cmd::SchemaCommand::Check));
    // `ctx run` is for writing and debugging scripts: their print and log lines show unasked.
    let scripts = matches!(cli.command, Command::Run(_));
    init_logging(cli.verbose, cli.quiet || (checking && cli.verbose == 0), scripts);
    let runtime = match crate::runtime::build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let globals = Globals {
        config: cli.config.clone(),
        verbose: cli.verbose,
        quiet: cli.quiet,
        runtime: runtime.handle().clone(),
    };
    pipe::silence_closed_stdout();
    let outcome = {
        let _inside = runtime.enter();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli.command, &globals)))
    };
    crate::runtime::stop(runtime);
    let result = match outcome {
        Ok(result) => result,
        // The reader of our output is gone (`| head -1`): nobody is left to tell.
        Err(panic) if pipe::closed_stdout(panic.as_ref()) => return ExitCode::SUCCESS,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if !matches!(err, CliError::Problems(_) | CliError::Reported(_)) {
                eprintln!("error: {}", crate::config::redact::text(&render(&err)));
            }
            ExitCode::from(err.exit_code())
        }
    }
}

fn run(command: Command, globals: &Globals) -> Result<(), CliError> {
    match command {
        Command::Init(args) => init::run(args),
        Command::Schema(cmd) => schema_cmd::run(cmd, globals),
        Command::Sync(args) => kb_cmd::sync(args, globals),
        Command::Search(args) => kb_cmd::search(args, globals),
        Command::Embed(args) => embed_cmd::run(args, globals),
        Command::Get(args) => kb_cmd::get(args, globals),
        Command::Sources(args) => kb_cmd::sources(args, globals),
        Command::Stats(args) => kb_cmd::stats(args, globals),
        Command::Connector(cmd) => connector_cmd::run(cmd, globals),
        Command::Tool(cmd) => tool_cmd::run(cmd, globals),
        Command::Agent(cmd) => agent_cmd::run(cmd, globals),
        Command::Mcp(cmd) => mcp_cmd::run(cmd, globals),
        Command::Run(args) => code_cmd::run(args, globals),
        Command::Log(args) => log_cmd::run(args, globals),
        Command::Approvals(cmd) => approvals_cmd::run(cmd, globals),
        Command::Catalog(args) => code_cmd::catalog(args, globals),
        Command::Serve(args) => serve_cmd::run(args, globals),
        Command::Completions { shell } => {
            // Written whole, not through the generator's panicking writes to stdout.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "ctx", &mut script);
            pipe::write_stdout(&script).map_err(|e| CliError::Failed(anyhow::anyhow!("writing to stdout: {e}")))
        }
    }
}

/// The error with its causes, one per line, never a Debug dump.
fn render(err: &CliError) -> String {
    match err {
        CliError::Failed(e) => format!("{e:#}"),
        other => other.to_string(),
    }
}

fn init_logging(verbose: u8, quiet: bool, scripts: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    // rmcp warns about every JSON-RPC error it sends (a client's bad arguments, say); those are
    // the client's business, so its warnings show only with -v. Its info and debug lines are one
    // per message, payload and all (an upstream's flood of notifications was gigabytes of log
    // with -v): only -vvv, or CTX_LOG, shows them.
    let rmcp = match (quiet, verbose) {
        (true, _) | (false, 0) => "error",
        (false, 1 | 2) => "warn",
        _ => "trace",
    };
    // rmcp's client side logs a lost upstream as errors of its own ("worker quit with fatal",
    // "fail to delete session"); ctx's warning already says which server and why.
    let rmcp_client =
        if verbose == 0 { ",rmcp::transport::worker=off,rmcp::transport::streamable_http_client=off" } else { "" };
    let script = if scripts && !quiet && verbose < 2 { ",ctx::script=info" } else { "" };
    let filter = EnvFilter::try_from_env("CTX_LOG")
        .unwrap_or_else(|_| EnvFilter::new(format!("ctx={level},rmcp={rmcp},warn{rmcp_client}{script}")));
    // Logs go to stderr so stdout stays clean for --json output and the MCP stdio transport,
    // without the config's secrets (a script can log anything).
    // Colour only for a person at a terminal: a file, a pipe or a desktop client's log gets
    // plain text, and NO_COLOR (https://no-color.org: set and not empty) turns it off anywhere.
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::config::redact::Stderr)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .with_target(false)
        .try_init();
}
