//! `ctx approvals`: list the calls waiting for a person, and approve or deny them.

use super::{CliError, Globals};
use crate::approval::{store_for, Store};
use crate::lua::api::log::one_line;
use crate::types::{Approval, ApprovalsList};

#[derive(Debug, clap::Subcommand)]
pub enum ApprovalsCommand {
    /// Calls waiting for approval (and approved ones not yet run), newest first.
    List {
        /// Also decided, used and expired approvals.
        #[arg(long)]
        all: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending call: its caller may then send it again with its token, once.
    Approve {
        /// The approval's id (ap-...), as listed.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Deny a pending call: it will not run.
    Deny {
        /// The approval's id (ap-...), as listed.
        id: String,
        /// Why, shown to the caller when it sends the call again.
        #[arg(long)]
        reason: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(command: ApprovalsCommand, globals: &Globals) -> Result<(), CliError> {
    let config = globals.load_config()?;
    let shared = crate::app::database::open(&config, crate::app::database::Role::Command)
        .map_err(|e| CliError::Failed(anyhow::anyhow!(e)))?;
    let store = store_for(&config, shared.as_ref());
    let failed = |e: String| CliError::Failed(anyhow::anyhow!("the approvals store: {e}"));
    match command {
        ApprovalsCommand::List { all, json } => {
            let rows = if store.exists() { store.list(all, 1000).map_err(failed)? } else { Vec::new() };
            let approvals: Vec<Approval> = rows.iter().map(|r| r.approval()).collect();
            if json {
                println!("{}", serde_json::to_string(&ApprovalsList { approvals }).unwrap_or_default());
                return Ok(());
            }
            if approvals.is_empty() {
                println!("{}", if all { "no approvals" } else { "no call is waiting for approval" });
                return Ok(());
            }
            for a in &approvals {
                print(a);
            }
            Ok(())
        }
        ApprovalsCommand::Approve { id, json } => decide(&store, &id, true, None, json),
        ApprovalsCommand::Deny { id, reason, json } => decide(&store, &id, false, reason.as_deref(), json),
    }
}

fn decide(store: &Store, id: &str, approve: bool, reason: Option<&str>, json: bool) -> Result<(), CliError> {
    match crate::server::decide_approval(store, id, approve, "cli", reason) {
        Ok(approval) if json => {
            println!("{}", serde_json::to_string(&approval).unwrap_or_default());
            Ok(())
        }
        Ok(approval) => {
            let verb = if approve { "approved" } else { "denied" };
            let params = approval.params.to_string();
            println!("{verb} {}: {} {}", approval.id, one_line(&approval.tool), one_line(&params));
            if approve {
                println!(
                    "its caller runs it by sending the same call again with its token, before {}",
                    approval.expires_at.format("%Y-%m-%d %H:%M:%S UTC")
                );
            }
            Ok(())
        }
        Err(e) => Err(CliError::Usage(e.message)),
    }
}

/// One approval for a person to read. What the caller sent is escaped (control characters,
/// bidirectional overrides: [`one_line`]): the parameters a person approves read as they are,
/// never reordered by a U+202E inside a string.
fn print(a: &Approval) {
    let who = a.caller.as_deref().map(|c| format!("{}/{c}", a.via)).unwrap_or_else(|| a.via.clone());
    let state = serde_json::to_value(a.state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    println!(
        "{}  {state:<8}  {}  {}  asked {}  expires {}",
        a.id,
        one_line(&a.tool),
        one_line(&who),
        a.created_at.format("%Y-%m-%d %H:%M:%S"),
        a.expires_at.format("%H:%M:%S")
    );
    let params = a.params.to_string();
    let shown: String = params.chars().take(300).collect();
    println!("    {}{}", one_line(&shown), if shown.len() < params.len() { "…" } else { "" });
    if let Some(reason) = &a.reason {
        println!("    reason: {}", one_line(reason));
    }
}
