//! The contract: the types every floor above shares (a tool's spec, a call's error, output,
//! parameters, caller and limits) and small helpers with no feature behind them. It uses only
//! the generated types and the schemas (see `src/floors.txt`).

pub mod approval;
pub mod cancel;
pub mod error;
mod limits;
pub mod output;
pub mod params;
pub mod principal;
pub mod redact;
mod spec;
pub mod text;
pub mod time;

pub use cancel::{CancelHandle, Progress, ProgressSink};
pub use error::CallError;
pub use limits::Limits;
pub use output::Output;
pub use params::Params;
pub use principal::{Caller, Principal};
pub use spec::{ToolSpec, UpstreamOrigin, BUILTINS, MAX_NAME_BYTES};
