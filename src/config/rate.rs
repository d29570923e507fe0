//! Rates as `ctx.toml` writes them (`rate = "10/min"`, `burst`), parsed and checked. The buckets
//! that enforce them are the call path's (`tools::rate`).

use globset::Glob;
use serde_json::Value as Json;

/// `N/sec`, `N/min`, `N/hour` or `N/day`, with a burst of `burst` calls (default N).
#[derive(Clone, Debug, PartialEq)]
pub struct Rate {
    /// The text as configured: part of each bucket's key.
    pub text: String,
    /// Calls added back per second.
    pub per_second: f64,
    /// Calls that may be made at once after a pause.
    pub burst: f64,
}

impl Rate {
    /// Parses `"10/min"` (also `10/s`, `10/second`, `5/h`, `100/day`); `burst` defaults to N.
    pub fn parse(text: &str, burst: Option<u64>) -> Result<Rate, String> {
        let wrong = || {
            format!("rate {text:?} is not a rate: write calls per period, for example \"10/min\", \"2/sec\", \"500/hour\" or \"1000/day\"")
        };
        let (count, period) = text.split_once('/').ok_or_else(wrong)?;
        let count: u64 = count.trim().parse().map_err(|_| wrong())?;
        let seconds = match period.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            "d" | "day" => 86_400.0,
            _ => return Err(wrong()),
        };
        if count == 0 {
            return Err(format!("rate {text:?} allows no call at all; remove the tool instead, or give at least 1"));
        }
        let burst = burst.unwrap_or(count);
        if burst == 0 {
            return Err(format!("burst 0 with rate {text:?} would refuse every call; use at least 1"));
        }
        Ok(Rate { text: text.trim().to_string(), per_second: count as f64 / seconds, burst: burst as f64 })
    }
}

/// The problems of the rates in a config's JSON form (and of `approve` and `long_running` where
/// they mean nothing),
/// each with its key path: what `Config::from_text` reports with the key's line.
pub fn config_problems(value: &Json) -> Vec<(Vec<String>, String)> {
    let mut problems = Vec::new();
    let limits = value.pointer("/server/rate_limits").and_then(Json::as_array);
    for (i, limit) in limits.into_iter().flatten().enumerate() {
        let at = |key: &str| vec!["server".to_string(), "rate_limits".to_string(), i.to_string(), key.to_string()];
        let burst = limit.get("burst").and_then(Json::as_u64);
        if let Some(Err(e)) = limit.get("rate").and_then(Json::as_str).map(|r| Rate::parse(r, burst)) {
            problems.push((at("rate"), e));
        }
        for (j, glob) in limit.get("tools").and_then(Json::as_array).into_iter().flatten().enumerate() {
            if let Some(Err(e)) = glob.as_str().map(Glob::new) {
                let mut path = at("tools");
                path.push(j.to_string());
                problems.push((path, format!("{glob} is not a valid glob: {e}")));
            }
        }
    }
    for (table, tools_only) in [("tools", false), ("connectors", true), ("agents", true)] {
        let sections = value.get(table).and_then(|t| t.get("script")).and_then(Json::as_object);
        for (name, section) in sections.into_iter().flatten() {
            for key in ["rate", "burst", "approve", "long_running"] {
                let Some(given) = section.get(key) else { continue };
                let at = vec![table.to_string(), "script".to_string(), name.clone(), key.to_string()];
                if tools_only {
                    problems.push((at, format!("{key} applies to tools only ([tools.script.*]); remove it here")));
                } else if key == "rate" {
                    let burst = section.get("burst").and_then(Json::as_u64);
                    if let Some(Err(e)) = given.as_str().map(|r| Rate::parse(r, burst)) {
                        problems.push((at, e));
                    }
                } else if key == "burst" && section.get("rate").is_none() {
                    problems.push((at, "burst needs a rate beside it, for example rate = \"10/min\"".to_string()));
                }
            }
        }
    }
    problems
}
